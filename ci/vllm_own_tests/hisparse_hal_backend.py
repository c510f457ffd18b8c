"""pytest plugin for vLLM 0.34.0's own HiSparse unit tests: hisparse-hal's backend where they use vLLM's CUDA one.

Loaded with ``-p hisparse_hal_backend`` (ci/vllm-own-tests.sh). Before any test module imports, it runs vLLM's
general plugins with ``HISPARSE_HAL_VLLM_BACKEND=cpu`` (so ``get_hisparse_backend()`` builds
``CpuHiSparseBackend``) and, when ``HISPARSE_HAL_REPLACE_CUDA_BACKEND=1``, rebinds
``vllm.v1.hisparse.backend.CUDAHiSparseBackend`` to hisparse-hal's CPU class, so the tests that import and
monkeypatch vLLM's CUDA class (tests/v1/worker/test_utils.py:36, 115, 297; test_attn_utils.py:523-560) patch ours
in. vLLM's test files are not edited.
"""

from __future__ import annotations

import os

import pytest

#: vLLM tests that fail with hisparse-hal's CPU backend in place of CUDAHiSparseBackend, each with its reason.
#: Strict: a listed test that passes fails the run, so the list cannot go stale.
EXPECTED_FAILURES: dict[str, str] = {
    "tests/v1/worker/test_utils.py::test_hisparse_shares_host_pool_only_for_local_tp":
        "asserts CUDA's supports_shared_host_pool=True; the CPU device says False under vLLM (its events cannot be "
        "waited on through torch.Stream.wait_event)",
    "tests/v1/worker/test_utils.py::test_hisparse_cache_handles_join_index_groups_during_construction":
        "needs pin_memory=True (runtime.py:625-627), which a CPU-only torch cannot allocate; fails with vLLM's own "
        "backend too",
    **{
        f"tests/v1/worker/test_attn_utils.py::test_init_hisparse_rolls_back_host_pool[{shared}-{phase}]":
            "its kv_cache_config is a SimpleNamespace with none of KVCacheConfig's fields; our "
            "validate_kv_cache_config refuses it with InvalidArgumentError before the phase under test (vLLM's "
            "base validate is a no-op)"
        for shared in ("False", "True") for phase in ("allocation", "views", "binding", "buffers")
    },
}


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("HISPARSE_HAL_VLLM_BACKEND", "cpu")
    import vllm.plugins
    import vllm.v1.hisparse.backend as vllm_backend

    vllm.plugins.load_general_plugins()
    if os.environ.get("HISPARSE_HAL_REPLACE_CUDA_BACKEND") == "1":
        from hisparse_hal.integrations.vllm_backend import CpuHiSparseBackend

        vllm_backend.CUDAHiSparseBackend = CpuHiSparseBackend  # type: ignore[misc, assignment, unused-ignore]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("HISPARSE_HAL_REPLACE_CUDA_BACKEND") != "1":
        return
    for item in items:
        reason = EXPECTED_FAILURES.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


def pytest_report_header(config: pytest.Config) -> str:
    from vllm.platforms import current_platform
    from vllm.v1.hisparse import backend as vllm_backend

    replaced = vllm_backend.CUDAHiSparseBackend.__module__.startswith("hisparse_hal")
    return (f"hisparse-hal: vLLM resolves {current_platform.get_hisparse_backend_cls()}; "
            f"CUDAHiSparseBackend replaced by ours: {replaced}")
