"""``conformance --vllm-backend`` without vLLM, and the vLLM-class recipe: a one-line usage error naming vLLM before any
work; the recipe kind and its JSON round trip; the hisparse-hal contract of ``--backend`` runs unchanged."""

from __future__ import annotations

import importlib.util
import pickle
import subprocess
import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch

from hisparse_hal.conformance.contracts import HAL_CONTRACT
from hisparse_hal.conformance.recipe import BackendRecipe
from hisparse_hal.conformance.resolved_run import ResolvedRun
from hisparse_hal.conformance.run_record import backend_under_test
from hisparse_hal.conformance.vllm_contract import StreamEvent, VllmOpNames, check_vllm_class, suite_runtime
from hisparse_hal.errors import InvalidArgumentError

no_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None,
    reason="vLLM is installed; tests/integrations/with_vllm/test_vllm_conformance.py covers it",
)


@no_vllm
def test_vllm_backend_without_vllm_is_a_one_line_usage_error(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "hisparse_hal.cli", "conformance", "--vllm-backend",
         "hisparse_hal.integrations.vllm_backend:CpuHiSparseBackend", "--report", str(tmp_path / "report")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "--vllm-backend needs vLLM 0.34.0 importable" in lines[0] and "vllm==0.34.0" in lines[0]
    assert not (tmp_path / "report" / "results.json").exists()


@no_vllm
def test_resolving_a_vllm_class_without_vllm_names_vllm():
    with pytest.raises(InvalidArgumentError, match=r"--vllm-backend needs vLLM 0\.34\.0 importable"):
        ResolvedRun.resolve(vllm_class="anything:AtAll")


@pytest.mark.parametrize("release", ["0.33.1", "0.34.1", "0.35.0rc1"])
def test_another_vllm_release_is_refused_naming_both_versions(monkeypatch, release):
    """The suite tests vLLM 0.34.0's contract only; any other installed release is refused before a class is
    loaded (a stand-in vllm package, since vLLM itself is absent here or is 0.34.0)."""
    package = ModuleType("vllm")
    package.__version__ = release  # type: ignore[attr-defined]
    backend_module = ModuleType("vllm.v1.hisparse.backend")
    backend_module.HiSparseBackend = type("HiSparseBackend", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", package)
    monkeypatch.setitem(sys.modules, "vllm.v1.hisparse.backend", backend_module)
    with pytest.raises(InvalidArgumentError) as raised:
        check_vllm_class("hisparse_hal.integrations.vllm_backend:CpuHiSparseBackend")
    assert str(raised.value) == (
        f"--vllm-backend tests vLLM 0.34.0's HiSparseBackend contract, but vLLM {release} is installed here (its "
        "members and op schemas may differ: 0.33 -> 0.34 changed three of the four schemas); install vllm==0.34.0 "
        "in this environment")


def test_vllm_backend_excludes_backend_and_factory(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "hisparse_hal.cli", "conformance", "--vllm-backend", "a:B", "--factory", "c:d"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert "argument --factory: not allowed with argument --vllm-backend" in done.stderr
    with pytest.raises(InvalidArgumentError, match=r"not a backend name \('cpu'\) and a vLLM class \('a:B'\)"):
        ResolvedRun.resolve(backend="cpu", vllm_class="a:B")


def test_a_vllm_class_recipe_is_strings_only_and_names_its_kind():
    recipe = BackendRecipe(vllm_class="pkg.mod:Cls")
    assert pickle.loads(pickle.dumps(recipe)) == recipe
    assert (recipe.kind, recipe.describe()) == ("vllm-class", "pkg.mod:Cls (vllm-class)")
    assert (BackendRecipe(registry_name="cpu").kind, BackendRecipe(factory="m:f").kind) == ("registry", "factory")
    with pytest.raises(InvalidArgumentError, match=r"exactly one of a registry name, a factory or a vLLM class"):
        BackendRecipe(factory="m:f", vllm_class="pkg.mod:Cls")


def test_a_registry_run_tests_the_hisparse_hal_contract_and_old_run_files_read_as_it():
    run = ResolvedRun.resolve(backend="cpu", expectations="none")
    assert run.contract == HAL_CONTRACT.id and run.contract_info() is HAL_CONTRACT
    under_test = backend_under_test(run.recipe, {"backend_class": run.backend_class})
    assert {k: under_test[k] for k in ("kind", "label", "qualname")} == {
        "kind": "registry", "label": "cpu (registry)", "qualname": "hisparse_hal.vendors.cpu.backend:CpuBackend"}
    doc = run.to_json().replace('"contract": "hisparse-hal-1"', '"unused": 0')
    assert ResolvedRun.from_json(doc).contract == HAL_CONTRACT.id
    factory = ResolvedRun.resolve(factory="hisparse_hal.vendors.cpu.backend:CpuBackend", expectations="none")
    assert backend_under_test(factory.recipe, {})["kind"] == "factory" and factory.contract == HAL_CONTRACT.id


def test_the_suite_runtime_carries_what_vllm_sets_before_create_cache_ops():
    runtime = suite_runtime(torch.device("cpu"))
    for name in ("hot", "hot_backing", "hot_block_table", "_host_cache", "registered_host_pool", "index_group",
                 "kv_dtype", "row_width", "device", "region_stride", "max_union_rows"):
        assert hasattr(runtime, name), name
    assert not hasattr(runtime, "request_state_indices")  # set later by vLLM (binding.py:158)
    assert runtime.hot.data_ptr() == runtime.hot_backing.data_ptr()
    assert runtime._host_cache.shape[1] == runtime.row_width


def test_ops_seen_through_vllms_names_answer_only_those_four():
    calls = []
    ops = SimpleNamespace(hisparse_gather_plan=lambda *args: calls.append(args))
    VllmOpNames(ops).gather_plan(1, 2, 3, 4, 5)
    assert calls == [(1, 2, 3, 4, 5)]
    with pytest.raises(AttributeError, match=r"'new_stats_counter' is not one of vLLM 0\.34\.0's cache ops"):
        VllmOpNames(ops).new_stats_counter()


def test_a_stream_event_records_and_waits_on_the_stream_it_is_given():
    seen = []
    event = SimpleNamespace(record=lambda stream: seen.append(("record", stream)), query=lambda: True)
    stream = SimpleNamespace(wait_event=lambda e: seen.append(("wait", e)))
    wrapped = StreamEvent(event)
    wrapped.record(stream)
    wrapped.wait(stream)
    assert seen == [("record", stream), ("wait", event)] and wrapped.query() is True
