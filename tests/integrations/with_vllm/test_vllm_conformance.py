"""``hisparse-hal conformance --vllm-backend module:Class`` against real vLLM 0.34.0 classes: the suite (contract
``vllm-0.34.0``) passes hisparse-hal's CPU adapter, an independent forwarding class and a class that keeps vLLM's
default hooks and fails only with plain RuntimeErrors (as vLLM's own backend does), and ``verify`` finds each full
report CONFORMANT; it fails each planted-bug class (hisparse_hal/testing/broken_vllm_backends.py) with its defect
named. The view's capabilities come from the class and from probes, never from hisparse-hal's own.

Measured on the shared 2-core development machine (HISPARSE_HAL_CACHE_OPS_SEQUENCES=16): a full run of a good class
(193 tests) took 42-53 s (116-148 s beside other sessions' runs), each planted-bug ``-k`` subset 13-15 s (36-40 s),
this file 272 s (731 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.integrations.with_vllm.vllm_env import require_vllm

require_vllm()

from hisparse_hal.conformance.junit import CAPABILITY_SKIP_PREFIX  # noqa: E402
from hisparse_hal.conformance.recipe import BackendRecipe  # noqa: E402
from hisparse_hal.conformance.resolved_run import ResolvedRun  # noqa: E402
from hisparse_hal.conformance.run_record import backend_under_test  # noqa: E402
from hisparse_hal.conformance.vllm_contract import VLLM_MEMBERS, VllmContractView, view_of  # noqa: E402
from hisparse_hal.errors import InvalidArgumentError  # noqa: E402
from hisparse_hal.testing.broken_vllm_backends import PLANTED  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
ADAPTER = "hisparse_hal.integrations.vllm_backend:CpuHiSparseBackend"
INDEPENDENT = "tests.integrations.with_vllm.independent_backend:IndependentCpuBackend"
DEFAULTS = "tests.integrations.with_vllm.vllm_defaults_backend:VllmDefaultsBackend"
PLANTED_MODULE = "hisparse_hal.testing.broken_vllm_backends"
#: Tests beyond vLLM's contract (never collected for it): a member beyond vLLM's 14, or a refusal vLLM's own
#: implementation does not make (a region check, a validate/prepare refusal, a gather id check).
HAL_ONLY = ("test_pinning.py::test_pin_rolls_back_every_registered_chunk",
            "test_probe.py::test_the_backend_under_test_is_selected",
            "test_swaps.py::test_swap_into_an_explicitly_registered_region",
            "test_swaps.py::test_swap_rejects_a_source_outside_every_known_region",
            "test_config.py::test_a_bad_layer_layout_is_rejected",
            "test_gathers.py::test_gather_rejects_ids_of_a_float_dtype",
            "test_pinning.py::test_pin_rejects_what_cannot_be_pinned[non_contiguous]")


def _conformance(tmp_path: Path, qualname: str, *args: str, timeout: float = 1800):
    """Run ``hisparse-hal conformance --vllm-backend qualname`` in a fresh interpreter; (process, results.json)."""
    env = dict(os.environ)
    env.pop("HISPARSE_HAL_BACKEND", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("HISPARSE_HAL_CACHE_OPS_SEQUENCES", "16")
    report = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-m", "hisparse_hal.cli", "conformance", "--vllm-backend", qualname, *args,
         "--report", str(report)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout,
    )
    results = report / "results.json"
    return done, (json.loads(results.read_text()) if results.exists() else None)


def _tail(done: subprocess.CompletedProcess) -> str:
    return (done.stdout[-4000:] + "\n" + done.stderr[-2000:]).strip()


@pytest.mark.parametrize("qualname", [ADAPTER, INDEPENDENT, DEFAULTS], ids=["adapter", "independent", "vllm_defaults"])
def test_the_whole_vllm_contract_passes_a_good_class(tmp_path, qualname):
    done, doc = _conformance(tmp_path, qualname)
    assert done.returncode == 0, _tail(done)
    assert doc is not None, _tail(done)
    assert f"testing {qualname} (vllm-class)" in done.stderr
    assert doc["summary"]["failed"] == doc["summary"]["xpassed"] == 0
    assert doc["selection"]["full_suite"] is True and doc["selection"]["deselected"] == 0
    assert doc.get("verdict", "PASS") == "PASS"
    assert "| **Total** | **PASS** |" in (tmp_path / "report" / "summary.md").read_text()
    ids = [t["id"] for t in doc["tests"]]
    assert not [i for i in ids for hal in HAL_ONLY if i.startswith(hal)], "a hal_extension test was collected"
    assert not [t for t in doc["tests"] if t["area"] == "scenario"]
    areas = {t["area"] for t in doc["tests"] if t["outcome"] == "passed"}
    assert {"probe", "surface", "swaps", "gathers", "pinning", "config", "stats", "ipc", "cache_ops"} <= areas
    capture = [t for t in doc["tests"] if t["area"] == "capture" and t["outcome"] == "skipped"]
    assert capture and all(t["reason"].startswith(f"{CAPABILITY_SKIP_PREFIX}graph_capture") for t in capture)
    assert doc["facts"]["capabilities"]["graph_capture"] is False  # CPU: torch has no graph API there
    assert doc["facts"]["capabilities"]["ipc_events"] is True
    verified = subprocess.run([sys.executable, "-m", "hisparse_hal.cli", "verify", str(tmp_path / "report")],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0 and verified.stdout.startswith("CONFORMANT"), verified.stdout + verified.stderr


def test_the_class_with_vllms_defaults_keeps_them_and_fails_only_as_torch_ops_fail():
    """The proof that the contract is vLLM's: the class overrides none of vLLM's three defaults, and bad input
    reaches the suite as a plain RuntimeError (the vLLM contract's refusals accept any exception)."""
    from vllm.v1.hisparse.backend import HiSparseBackend as VllmHiSparseBackend

    from tests.integrations.with_vllm.vllm_defaults_backend import VllmDefaultsBackend

    for hook in ("validate_kv_cache_config", "prepare_kv_cache_views", "gather_resident_rows"):
        assert getattr(VllmDefaultsBackend, hook) is getattr(VllmHiSparseBackend, hook), hook
    view = view_of(DEFAULTS)
    assert view.capabilities.versions["gather_resident_rows"] == "vllm default"
    with pytest.raises(RuntimeError) as raised:
        view.unpin_tensor(torch.zeros(64, dtype=torch.uint8))
    assert type(raised.value) is RuntimeError and "not pinned" in str(raised.value)
    with pytest.raises(RuntimeError, match="must be int64") as raised:
        view.swap_blocks_batch(torch.tensor([0]), torch.tensor([0], dtype=torch.int32), torch.tensor([0]))
    assert type(raised.value) is RuntimeError


def test_the_config_hooks_get_vllms_kv_cache_config(monkeypatch):
    """vLLM hands the hooks its own KVCacheConfig (binding.py:139, 150); so does the suite's view, for every config
    the suite builds (one placement per layer at its offset, one MLA group of the suite's rows)."""
    from vllm.v1.kv_cache_interface import KVCacheConfig as VllmKVCacheConfig

    from hisparse_hal.kv_cache import KVCacheConfig, LayerSpec

    view = view_of(ADAPTER)
    seen: list[object] = []
    monkeypatch.setattr(view.impl, "validate_kv_cache_config", seen.append)
    monkeypatch.setattr(view.impl, "prepare_kv_cache_views", lambda config, caches, context: seen.append(config))
    config = KVCacheConfig("bf16", 4, 4, 64, (LayerSpec("layer.0", 0), LayerSpec("layer.1", 4096)))
    view.validate_kv_cache_config(config)
    view.prepare_kv_cache_views(config, {}, {})
    assert len(seen) == 2 and all(isinstance(c, VllmKVCacheConfig) for c in seen)
    given = seen[0]
    assert isinstance(given, VllmKVCacheConfig)
    assert [(t.layers, t.offset, t.size, t.block_stride) for t in given.kv_cache_tensors] == [
        (["layer.0"], 0, config.layer_bytes, config.block_bytes),
        (["layer.1"], 4096, 4096 + config.layer_bytes, config.block_bytes)]
    (group,) = given.kv_cache_groups
    assert group.layer_names == ["layer.0", "layer.1"] and group.kv_cache_spec.dtype == torch.bfloat16
    assert group.kv_cache_spec.block_size == 4 and group.kv_cache_spec.head_size == 64


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_planted_bug_fails_the_suite_with_its_defect_named(tmp_path, name):
    keyword, must_fail, word = PLANTED[name]
    done, doc = _conformance(tmp_path, f"{PLANTED_MODULE}:{name}", "-k", keyword, timeout=600)
    assert done.returncode == 1, f"{name} was not failed:\n{_tail(done)}"
    assert doc is not None, _tail(done)
    failed = {t["id"]: t["reason"] for t in doc["tests"] if t["outcome"] == "failed"}
    for prefix in must_fail:
        hits = [i for i in failed if i.startswith(prefix)]
        assert hits, f"{name} did not fail {prefix}; failed: {sorted(failed)}"
        assert all(word in failed[i] for i in hits), f"{name}: the reason does not name {word!r}: {failed[hits[0]]}"


def test_the_planted_bugs_subsets_pass_on_the_adapter(tmp_path):
    """The control: what fails each planted class passes the class it breaks."""
    keyword = " or ".join(f"({k})" for k, _, _ in PLANTED.values())
    done, doc = _conformance(tmp_path, ADAPTER, "-k", keyword, timeout=600)
    assert done.returncode == 0, _tail(done)
    assert doc is not None and doc["summary"]["passed"] >= len(PLANTED)


# ------------------------------------------------------------------------------------------ in-process
def test_a_vllm_class_resolves_to_the_vllm_contract_with_its_qualname():
    run = ResolvedRun.resolve(vllm_class=ADAPTER, expectations="none")
    assert run.contract == "vllm-0.34.0" and run.contract_info().excludes_marker == "hal_extension"
    assert run.recipe == BackendRecipe(vllm_class=ADAPTER)
    under_test = backend_under_test(run.recipe, {})
    assert (under_test["kind"], under_test["label"], under_test["qualname"]) == (
        "vllm-class", f"{ADAPTER} (vllm-class)", ADAPTER)
    again = ResolvedRun.from_json(run.to_json())
    assert again == run and again.recipe.describe() == f"{ADAPTER} (vllm-class)"


def test_the_view_is_built_once_per_process_and_forwards_only_vllms_members():
    view = view_of(ADAPTER)
    assert view_of(ADAPTER) is view and isinstance(view, VllmContractView)
    assert type(view.impl).__name__ == "CpuHiSparseBackend"
    assert not hasattr(view, "host_registration") and not hasattr(view, "register_region")
    assert all(hasattr(view, member) for member in VLLM_MEMBERS)


def test_capabilities_come_from_the_class_and_probes_not_from_hisparse_hals():
    view = view_of(ADAPTER)
    caps, hal = view.capabilities, view.impl.hal.capabilities
    assert hal.graph_capture is True and caps.graph_capture is False  # the CPU device's own capture is hal-only
    assert caps.shared_host_pool is view.impl.supports_shared_host_pool is False
    assert caps.stats_dtype == view.impl.stats_dtype
    assert caps.ipc_events is True and "child process" in caps.reasons["ipc_events"]
    assert caps.kv_formats == hal.kv_formats  # what validate_kv_cache_config accepted
    assert caps.versions["gather_resident_rows"] == "overridden"
    assert view_of(f"{PLANTED_MODULE}:SwapBlocksBatchMissing").capabilities.versions["gather_resident_rows"] == (
        "vllm default")


@pytest.mark.parametrize(("qualname", "message"), [
    ("hisparse_hal.integrations", r"--vllm-backend must look like 'package.module:Class'"),
    ("hisparse_hal.integrations.vllm_backend:ADAPTERS", r"is not callable \(dict\)"),
    ("hisparse_hal.conformance.vllm_contract:accelerator_device", r"is a function, not a class"),
    ("collections:OrderedDict", r"lacks vLLM 0.34.0 HiSparseBackend member\(s\) supports_shared_host_pool, "),
    ("hisparse_hal.nowhere:Backend", r"cannot import 'hisparse_hal.nowhere'"),
])
def test_a_bad_vllm_class_is_refused_before_any_work(qualname, message):
    with pytest.raises(InvalidArgumentError, match=message):
        ResolvedRun.resolve(vllm_class=qualname)


def test_a_bad_vllm_class_is_a_one_line_usage_error(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "hisparse_hal.cli", "conformance", "--vllm-backend", "collections:OrderedDict"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "lacks vLLM 0.34.0 HiSparseBackend member(s)" in lines[0], done.stderr
