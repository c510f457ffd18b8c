"""pytest plugin for vLLM 0.34.0's own HiSparse unit tests: hisparse-hal's backend where they use vLLM's CUDA one.

Loaded with ``-p hisparse_hal_backend`` (ci/vllm-own-tests.sh). Before any test module imports, it writes a local
Hugging Face hub cache with the models the tests name (``local_hub``; ``HF_HUB_OFFLINE=1``), runs vLLM's general
plugins with ``HISPARSE_HAL_VLLM_BACKEND=cpu`` (so ``get_hisparse_backend()`` builds ``CpuHiSparseBackend``) and,
when ``HISPARSE_HAL_REPLACE_CUDA_BACKEND=1``, rebinds ``vllm.v1.hisparse.backend.CUDAHiSparseBackend`` to
hisparse-hal's CPU class, so the tests that import and monkeypatch vLLM's CUDA class (tests/v1/worker/
test_utils.py:36, 115, 297; test_attn_utils.py:523-560) patch ours in. It traces which of our members each test
called (``member_trace``) and prints the count at the end. vLLM's test files are not edited.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_hub import write_hub_cache
from member_trace import MemberTrace

TRACE = MemberTrace()
_HUB = pytest.StashKey[Path]()

#: A shared host pool under vLLM needs non-writer ranks to wait on the writer's IPC event through
#: ``torch.accelerator.current_stream().wait_event`` (vllm/distributed/kv_transfer/kv_connector/v1/hisparse/
#: worker.py:419); a CPU-only torch has no accelerator stream, so no CPU backend can honour it and ours says
#: supports_shared_host_pool=False (vLLM reads it at vllm/v1/hisparse/runtime.py:295). vLLM's CUDA class claims True.
_SHARED_POOL = ("asserts a shared host pool for TP > 1, which needs supports_shared_host_pool=True "
                "(vllm/v1/hisparse/runtime.py:295); on a CPU-only torch no backend can order ranks through "
                "torch.accelerator.current_stream().wait_event (kv_connector/v1/hisparse/worker.py:419)")

#: vLLM tests that fail with hisparse-hal's CPU backend in place of CUDAHiSparseBackend, each with its reason.
#: Strict: a listed test that passes fails the run, so the list cannot go stale. Only failures no backend can
#: avoid on a CPU-only torch belong here.
EXPECTED_FAILURES: dict[str, str] = {
    "tests/v1/worker/test_utils.py::test_hisparse_shares_host_pool_only_for_local_tp": _SHARED_POOL,
    "tests/v1/core/test_kv_cache_planning.py::test_hisparse_hma_uses_resolved_gpu_block_size[True-32]": _SHARED_POOL,
    "tests/v1/core/test_kv_cache_planning.py::test_hisparse_hma_uses_resolved_gpu_block_size[True-64]": _SHARED_POOL,
    "tests/v1/worker/test_utils.py::test_hisparse_cache_handles_join_index_groups_during_construction":
        "allocates with pin_memory=True (vllm/v1/hisparse/runtime.py:625-627), which a CPU-only torch cannot "
        "serve; fails with vLLM's own backend too",
    **{
        f"tests/v1/worker/test_attn_utils.py::test_init_hisparse_rolls_back_host_pool[{shared}-{phase}]":
            "asserts torch.cuda.cudart().cudaHostUnregister was called (tests/v1/worker/test_attn_utils.py:587), "
            "the CUDA backend's own unpin path; the tensor it plants in pool.pinned (:559) was never pinned "
            "through pin_tensor, so any other backend's unpin_tensor refuses it (vllm/v1/hisparse/runtime.py:359-375 "
            "logs it and stops)"
        for shared in ("False", "True") for phase in ("allocation", "views", "binding", "buffers")
    },
}


def pytest_configure(config: pytest.Config) -> None:
    hub = Path(tempfile.mkdtemp(prefix="hisparse-hal-hub-"))
    config.stash[_HUB] = hub
    os.environ["HF_HUB_CACHE"] = str(write_hub_cache(hub))
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("HISPARSE_HAL_VLLM_BACKEND", "cpu")
    import vllm.plugins
    import vllm.v1.hisparse.backend as vllm_backend

    vllm.plugins.load_general_plugins()
    if os.environ.get("HISPARSE_HAL_REPLACE_CUDA_BACKEND") == "1":
        from hisparse_hal.integrations.vllm_backend import CpuHiSparseBackend

        vllm_backend.CUDAHiSparseBackend = CpuHiSparseBackend  # type: ignore[misc, assignment, unused-ignore]
    TRACE.install()


@pytest.fixture(autouse=True)
def _triton_cpu_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """STAND-IN for triton-cpu, per test (collection imports see vLLM's real answer): vllm/platforms/cpu.py:242-243
    refuses every x86 CPU config whose Triton has no active driver. The tests that reach it build a ``VllmConfig``
    (tests/test_config.py, tests/v1/core/) to check config and planning logic; none launches a kernel."""
    import vllm.triton_utils

    monkeypatch.setattr(vllm.triton_utils, "HAS_TRITON", True)


def pytest_unconfigure(config: pytest.Config) -> None:
    hub = config.stash.get(_HUB, None)
    if hub is not None:
        shutil.rmtree(hub, ignore_errors=True)


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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    TRACE.current = item.nodeid
    TRACE.ran.append(item.nodeid)
    try:
        return (yield)
    finally:
        TRACE.current = None


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    counts = ", ".join(f"{name} {count}" for name, count in TRACE.member_counts().items())
    terminalreporter.write_line(f"hisparse-hal members called (tests per member): {counts or 'none'}")
    terminalreporter.write_line(TRACE.summary_line())
