"""The ROCm probe (``vendors/rocm/spec.py`` over ``amdsmi_inventory``, ``kfd_topology``, ``visible_devices``): each
way of being unavailable has its own reason; devices come from amdsmi or the KFD sysfs topology; the visibility
variables are applied as ROCr and the HIP runtime apply them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from hisparse_hal.vendors.rocm.amdsmi_inventory import read_amdsmi_inventory
from hisparse_hal.vendors.rocm.kfd_topology import gfx_name, read_kfd_topology
from hisparse_hal.vendors.rocm.spec import SPEC, ProbeInputs, probe_rocm
from hisparse_hal.vendors.rocm.visible_devices import GpuDevice, resolve_visible_devices

LIBRARY = Path("/opt/rocm/lib/libamdhip64.so")


def found_library():
    return LIBRARY, [str(LIBRARY)]


def missing_library():
    return None, ["/a/libamdhip64.so", "/b/libamdhip64.so.7", "/c/libamdhip64.so.6"]


class SimulatedAmdSmiError(Exception):
    """The SIMULATED amdsmi's exception type."""


def simulated_amdsmi(gpus=(("AMD Instinct MI300X", "gfx942"),), init_error=None, calls=None):
    """A SIMULATED amdsmi module (not AMD software) listing ``gpus`` as (market name, gfx target)."""
    calls = [] if calls is None else calls
    module: Any = types.ModuleType("amdsmi")  # a stand-in whose attributes are set below

    def amdsmi_init(*_):
        calls.append("init")
        if init_error:
            raise SimulatedAmdSmiError(init_error)

    module.amdsmi_init = amdsmi_init
    module.amdsmi_shut_down = lambda: calls.append("shut_down")
    module.amdsmi_get_processor_handles = lambda: list(range(len(gpus)))
    module.amdsmi_get_gpu_asic_info = lambda h: {"market_name": gpus[h][0], "target_graphics_version": gpus[h][1]}
    module.amdsmi_get_rocm_version = lambda: (True, "7.2.1")
    module.amdsmi_get_gpu_driver_info = lambda h: {"driver_version": "6.16.6"}
    return lambda: module


def no_amdsmi():
    raise ImportError("No module named 'amdsmi'")


def write_kfd(root: Path, nodes) -> Path:
    """A KFD topology tree: ``nodes`` is a list of (simd_count, gfx_target_version, unique_id, name)."""
    base = root / "class/kfd/kfd/topology/nodes"
    for n, (simd, target, unique, name) in enumerate(nodes):
        node = base / str(n)
        node.mkdir(parents=True)
        (node / "properties").write_text(
            f"cpu_cores_count {0 if simd else 64}\nsimd_count {simd}\ngfx_target_version {target}\n"
            f"unique_id {unique}\nwave_front_size 64\n"
        )
        (node / "name").write_text(name + "\n")
    return root


def rocm_inputs(tmp_path, environ=None, amdsmi=None, library=found_library, sysfs=None) -> ProbeInputs:
    return ProbeInputs(
        torch_version="2.13.0+rocm7.2",
        torch_hip="7.2.53211-abc",
        torch_cuda=None,
        environ=environ or {},
        sysfs_root=sysfs if sysfs is not None else tmp_path / "empty-sys",
        amdsmi_importer=amdsmi or simulated_amdsmi(),
        library_finder=library,
    )


# ----------------------------------------------------------------------------------------- torch build
def test_probe_on_a_cpu_build_of_torch_says_it_is_not_a_rocm_build(tmp_path):
    inputs = ProbeInputs("2.13.0+cpu", None, None, {}, tmp_path)
    result = probe_rocm(inputs)
    assert not result.available
    assert result.reason == "torch 2.13.0+cpu is a CPU build, not a ROCm build (torch.version.hip is None)"


def test_probe_on_a_cuda_build_of_torch_names_the_cuda_version(tmp_path):
    result = probe_rocm(ProbeInputs("2.13.0+cu130", None, "13.0", {}, tmp_path))
    assert not result.available
    assert "is a CUDA build (CUDA 13.0), not a ROCm build" in result.reason


def test_registered_probe_reads_torch_build_and_explains_a_cpu_build(monkeypatch):
    # Patched rather than read from this machine, so the test also holds on a ROCm or CUDA build of torch.
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.version, "cuda", None, raising=False)
    result = SPEC.probe()
    assert not result.available
    assert result.reason == f"torch {torch.__version__} is a CPU build, not a ROCm build (torch.version.hip is None)"


def test_registered_probe_reads_a_cuda_build_from_torch_version(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.8", raising=False)
    result = SPEC.probe()
    assert not result.available
    assert "is a CUDA build (CUDA 12.8), not a ROCm build" in result.reason


# ----------------------------------------------------------------------------------------- library
def test_probe_without_the_hip_library_lists_every_path_tried(tmp_path):
    result = probe_rocm(rocm_inputs(tmp_path, library=missing_library))
    assert not result.available
    assert "libamdhip64 was not found; tried 3 paths" in result.reason
    assert result.facts["hip_library_tried"] == ["/a/libamdhip64.so", "/b/libamdhip64.so.7", "/c/libamdhip64.so.6"]


# ----------------------------------------------------------------------------------------- devices
def test_probe_with_amdsmi_reports_devices_architectures_and_versions(tmp_path):
    calls: list[str] = []
    gpus = (("AMD Instinct MI300X", "gfx942"), ("AMD Instinct MI300X", "gfx942"))
    result = probe_rocm(rocm_inputs(tmp_path, amdsmi=simulated_amdsmi(gpus, calls=calls)))
    assert result.available
    assert result.reason.startswith("ROCm build of torch (HIP 7.2.53211-abc) with 2 visible AMD GPU(s) from amdsmi")
    assert result.facts["archs"] == ["gfx942"]
    assert result.facts["rocm_version"] == "7.2.1"
    assert result.facts["driver_version"] == "6.16.6"
    assert result.facts["hip_library"] == str(LIBRARY)
    assert [g["hip_index"] for g in result.facts["visible_gpus"]] == [0, 1]
    assert calls == ["init", "shut_down"]


def test_probe_falls_back_to_kfd_sysfs_when_amdsmi_is_not_installed(tmp_path):
    sysfs = write_kfd(tmp_path / "sys", [(0, 0, 0, "cpu"), (1216, 90500, 0xABCDEF, "gfx950")])
    result = probe_rocm(rocm_inputs(tmp_path, amdsmi=no_amdsmi, sysfs=sysfs))
    assert result.available
    assert result.facts["device_source"] == "kfd-sysfs"
    assert "amdsmi is not importable" in result.facts["amdsmi_error"]
    assert "pip install -e '.[rocm]'" in result.facts["amdsmi_error"]
    assert result.facts["archs"] == ["gfx950"]
    assert result.facts["physical_gpus"][0]["uuid"] == "GPU-0000000000ABCDEF"


def test_probe_falls_back_to_kfd_sysfs_when_amdsmi_init_fails_in_a_container(tmp_path):
    sysfs = write_kfd(tmp_path / "sys", [(0, 0, 0, "cpu"), (1216, 90402, 7, "gfx942")])
    amdsmi = simulated_amdsmi(init_error="AMDSMI_STATUS_NO_PERM")
    result = probe_rocm(rocm_inputs(tmp_path, amdsmi=amdsmi, sysfs=sysfs))
    assert result.available
    assert "amdsmi_init failed (SimulatedAmdSmiError: AMDSMI_STATUS_NO_PERM)" == result.facts["amdsmi_error"]
    assert "from kfd-sysfs: gfx942" in result.reason


def test_probe_with_neither_amdsmi_nor_kfd_says_both_reasons(tmp_path):
    result = probe_rocm(rocm_inputs(tmp_path, amdsmi=no_amdsmi))
    assert not result.available
    assert result.reason.startswith("no AMD GPU found: amdsmi is not importable")
    assert "no KFD topology at" in result.reason and "WSL" in result.reason


def test_probe_with_a_kfd_topology_of_cpu_nodes_only_says_no_gpu_node(tmp_path):
    sysfs = write_kfd(tmp_path / "sys", [(0, 0, 0, "cpu")])
    result = probe_rocm(rocm_inputs(tmp_path, amdsmi=simulated_amdsmi(gpus=()), sysfs=sysfs))
    assert not result.available
    assert "amdsmi lists no AMD GPU" in result.reason
    assert "the KFD topology lists no GPU node (simd_count > 0)" in result.reason


def test_probe_with_every_gpu_hidden_by_the_environment_says_which_variable(tmp_path):
    result = probe_rocm(rocm_inputs(tmp_path, environ={"ROCR_VISIBLE_DEVICES": ""}))
    assert not result.available
    assert "1 AMD GPU(s) found (amdsmi) but none is visible to HIP" in result.reason
    assert "ROCR_VISIBLE_DEVICES='' leaves 0 of 1 GPU(s)" in result.reason


def test_probe_marks_architectures_it_plans_for_conservatively(tmp_path):
    result = probe_rocm(rocm_inputs(tmp_path, amdsmi=simulated_amdsmi(gpus=(("Radeon AI PRO R9700", "gfx1201"),))))
    assert result.available
    assert result.facts["archs_planned_conservatively"] == ["gfx1201"]


def test_probe_reports_a_bad_visibility_token_in_its_reason(tmp_path):
    gpus = (("MI300X", "gfx942"),) * 2
    result = probe_rocm(rocm_inputs(tmp_path, environ={"HIP_VISIBLE_DEVICES": "1,x"}, amdsmi=simulated_amdsmi(gpus)))
    assert result.available
    assert "HIP_VISIBLE_DEVICES token 'x' is not a decimal device index" in result.reason
    assert [g["physical_index"] for g in result.facts["visible_gpus"]] == [1]


def test_probe_never_initializes_hip_in_a_fresh_process(tmp_path):
    code = textwrap.dedent(
        """
        import sys, torch
        from hisparse_hal import probe_backends
        results = {r.name: r for r in probe_backends()}
        print(torch.cuda.is_initialized(), "hisparse_hal.vendors.rocm.backend" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # GPU-run check: on a CPU build of torch is_initialized() is False whatever the probe does; on a ROCm
    # machine (ci/gpu-check.sh) it is the real test. Here the claim is proven against the simulated HIP
    # runtime by test_probe_on_a_rocm_build_opens_and_calls_no_hip_runtime.
    assert out.stdout.split() == ["False", "False"]


# ----------------------------------------------------------------------------------------- amdsmi
def test_amdsmi_inventory_shuts_amdsmi_down_even_when_listing_fails():
    calls: list[str] = []
    module = simulated_amdsmi(calls=calls)()

    def broken():
        raise SimulatedAmdSmiError("AMDSMI_STATUS_DRM_ERROR")

    module.amdsmi_get_processor_handles = broken
    inventory = read_amdsmi_inventory(lambda: module)
    assert inventory.devices == ()
    assert inventory.error == "amdsmi_get_processor_handles failed (SimulatedAmdSmiError: AMDSMI_STATUS_DRM_ERROR)"
    assert calls == ["init", "shut_down"]


def test_amdsmi_inventory_accepts_an_integer_gfx_target():
    inventory = read_amdsmi_inventory(simulated_amdsmi(gpus=(("MI210", 90010),)))
    assert inventory.devices[0].arch == "gfx90a"


def test_amdsmi_inventory_records_a_rocm_version_read_as_ok_version_pair():
    module = simulated_amdsmi()()
    module.amdsmi_get_rocm_version = lambda: (True, "7.0.2")
    inventory = read_amdsmi_inventory(lambda: module)
    assert inventory.facts["rocm_version"] == "7.0.2"
    assert "rocm_version_error" not in inventory.facts


def test_amdsmi_inventory_never_takes_a_failed_rocm_version_message_for_the_version():
    # amdsmi 7.0.2 reports a missing librocm-core by return value, not by raising.
    module = simulated_amdsmi()()
    module.amdsmi_get_rocm_version = lambda: (False, "Could not find librocm-core.so")
    inventory = read_amdsmi_inventory(lambda: module)
    assert "rocm_version" not in inventory.facts
    assert inventory.facts["rocm_version_error"] == "amdsmi_get_rocm_version failed: Could not find librocm-core.so"
    assert inventory.facts["driver_version"] == "6.16.6"  # the other facts are still read
    assert len(inventory.devices) == 1


def test_probe_facts_carry_the_rocm_version_failure_and_the_backend_gets_no_version(tmp_path):
    module = simulated_amdsmi()()
    module.amdsmi_get_rocm_version = lambda: (False, "Failed to unpack ROCm version")
    result = probe_rocm(rocm_inputs(tmp_path, amdsmi=lambda: module))
    assert result.available
    assert "rocm_version" not in result.facts
    assert result.facts["rocm_version_error"] == "amdsmi_get_rocm_version failed: Failed to unpack ROCm version"


def test_amdsmi_inventory_names_the_call_when_a_version_read_raises():
    module = simulated_amdsmi()()

    def broken(_handle):
        raise SimulatedAmdSmiError("AMDSMI_STATUS_NOT_SUPPORTED")

    module.amdsmi_get_gpu_driver_info = broken
    inventory = read_amdsmi_inventory(lambda: module)
    assert "driver_version" not in inventory.facts
    assert inventory.facts["driver_version_error"] == (
        "amdsmi_get_gpu_driver_info failed (SimulatedAmdSmiError: AMDSMI_STATUS_NOT_SUPPORTED)"
    )
    assert inventory.facts["rocm_version"] == "7.2.1"


def test_amdsmi_inventory_treats_its_not_available_placeholders_as_unknown():
    # amdsmi 7.0.2 fills empty driver fields with "N/A" and formats an unset gfx target as "gfx0".
    module = simulated_amdsmi(gpus=(("N/A", "gfx0"),))()
    module.amdsmi_get_gpu_driver_info = lambda h: {"driver_version": "N/A"}
    inventory = read_amdsmi_inventory(lambda: module)
    assert inventory.devices == (GpuDevice(0, "AMD GPU", None),)
    assert "driver_version" not in inventory.facts
    assert inventory.facts["driver_version_error"] == "amdsmi_get_gpu_driver_info gave driver_version 'N/A'"


FAKE_AMDSMI_WITHOUT_LIBRARY = textwrap.dedent(
    """
    # SIMULATED amdsmi package (not AMD software): behaves like amdsmi 7.0.2's amdsmi_wrapper.py when
    # libamd_smi.so is missing: two print() lines on stdout, then KeyError.
    print("libamd_smi.so: cannot open shared object file: No such file or directory")
    print("Unable to find libamd_smi.so library try installing amd-smi-lib from your package manager")
    _libraries = {}
    _libraries["libamd_smi.so"]
    """
)


def test_import_amdsmi_keeps_what_amdsmi_prints_off_stdout_and_logs_it(tmp_path, monkeypatch, capfd, caplog):
    (tmp_path / "amdsmi").mkdir()
    (tmp_path / "amdsmi" / "__init__.py").write_text(FAKE_AMDSMI_WITHOUT_LIBRARY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    caplog.set_level("DEBUG", logger="hisparse_hal.vendors.rocm.amdsmi_inventory")
    inventory = read_amdsmi_inventory()
    assert inventory.error == (
        "amdsmi is not importable (KeyError: 'libamd_smi.so'); install it with pip install amdsmi "
        "(the [rocm] extra: pip install -e '.[rocm]' in a hisparse-hal checkout)"
    )
    assert capfd.readouterr().out == ""
    assert "Unable to find libamd_smi.so library" in caplog.text


def test_info_json_parses_when_amdsmi_prints_while_failing_to_import(tmp_path):
    fake = tmp_path / "site"
    (fake / "amdsmi").mkdir(parents=True)
    (fake / "amdsmi" / "__init__.py").write_text(FAKE_AMDSMI_WITHOUT_LIBRARY)
    rocm = tmp_path / "rocm"
    (rocm / "lib").mkdir(parents=True)
    (rocm / "lib" / "libamdhip64.so").write_text("")  # the probe only checks that the file exists
    # torch here is a CPU build; claiming HIP makes the ROCm probe go on to import amdsmi.
    code = textwrap.dedent(
        """
        import sys, torch
        torch.version.hip = "7.0.51831-sim"
        from hisparse_hal.cli import main
        sys.exit(main(["info", "--json"]))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]),
           "ROCM_PATH": str(rocm)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env
    )
    # Exit 1: nothing can be chosen (a HIP build of torch without a usable ROCm), as plain `info` says too.
    assert out.returncode == 1, out.stderr
    payload = json.loads(out.stdout)
    rocm_result = next(b for b in payload["backends"] if b["name"] == "rocm")
    assert "amdsmi is not importable (KeyError: 'libamd_smi.so')" in rocm_result["facts"]["amdsmi_error"]
    assert "Unable to find libamd_smi.so" not in out.stdout + out.stderr


# ----------------------------------------------------------------------------------------- KFD sysfs
@pytest.mark.parametrize("value,name", [(90402, "gfx942"), (90500, "gfx950"), (90010, "gfx90a"), (110000, "gfx1100"),
                                        (120001, "gfx1201"), (0, None), (9999, None)])
def test_gfx_name_decodes_kfd_target_versions(value, name):
    assert gfx_name(value) == name


def test_kfd_topology_lists_gpu_nodes_in_node_order_and_skips_cpus(tmp_path):
    sysfs = write_kfd(tmp_path, [(0, 0, 0, "cpu"), (304, 90402, 1, "gfx942"), (304, 90402, 2, "gfx942")])
    topology = read_kfd_topology(sysfs)
    assert topology.error is None
    assert [(d.index, d.arch, d.uuid) for d in topology.devices] == [
        (0, "gfx942", "GPU-0000000000000001"), (1, "gfx942", "GPU-0000000000000002"),
    ]


def test_kfd_topology_sorts_nodes_numerically_not_as_text(tmp_path):
    sysfs = write_kfd(tmp_path, [(0, 0, 0, "cpu")] + [(4, 90402, i + 1, "gfx942") for i in range(11)])
    assert [d.uuid for d in read_kfd_topology(sysfs).devices] == [f"GPU-{i:016X}" for i in range(1, 12)]


def test_kfd_topology_skips_a_malformed_node_and_names_it(tmp_path):
    sysfs = write_kfd(tmp_path, [(0, 0, 0, "cpu"), (4, 90402, 1, "gfx942")])
    (sysfs / "class/kfd/kfd/topology/nodes/0/properties").write_text("simd_count many\n")
    topology = read_kfd_topology(sysfs)
    assert len(topology.devices) == 1
    assert topology.skipped == ("node 0: properties line 1 'simd_count many' is not 'key integer'",)


# ----------------------------------------------------------------------------------------- visibility
FOUR = [GpuDevice(i, f"gpu{i}", "gfx942", f"GPU-{0xA0 + i:016X}") for i in range(4)]


def visible(environ):
    return [d.index for d in resolve_visible_devices(FOUR, environ).devices]


def test_visibility_without_variables_shows_every_gpu():
    assert visible({}) == [0, 1, 2, 3]


def test_visibility_hip_visible_devices_orders_and_selects():
    assert visible({"HIP_VISIBLE_DEVICES": "2,0"}) == [2, 0]


def test_visibility_cuda_visible_devices_applies_when_hip_is_unset_or_empty():
    assert visible({"CUDA_VISIBLE_DEVICES": "3"}) == [3]
    assert visible({"HIP_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": "1"}) == [1]


def test_visibility_hip_wins_over_cuda_instead_of_composing_with_it():
    # clr rocdevice.cpp: HIP_VISIBLE_DEVICES if non-empty, else CUDA_VISIBLE_DEVICES; never both.
    vis = resolve_visible_devices(FOUR, {"HIP_VISIBLE_DEVICES": "1,2", "CUDA_VISIBLE_DEVICES": "1"})
    assert [d.index for d in vis.devices] == [1, 2]
    assert any("CUDA_VISIBLE_DEVICES='1' is ignored" in line for line in vis.applied)


def test_visibility_rocr_applies_first_and_hip_indexes_what_is_left():
    assert visible({"ROCR_VISIBLE_DEVICES": "1,3", "HIP_VISIBLE_DEVICES": "1"}) == [3]


def test_visibility_rocr_set_but_empty_hides_every_gpu():
    assert visible({"ROCR_VISIBLE_DEVICES": ""}) == []


def test_visibility_rocr_accepts_uuid_prefixes_and_hex_indices():
    assert visible({"ROCR_VISIBLE_DEVICES": "GPU-00000000000000A2,0x1"}) == [2, 1]


def test_visibility_rocr_stops_at_a_repeated_device():
    vis = resolve_visible_devices(FOUR, {"ROCR_VISIBLE_DEVICES": "1,1,2"})
    assert [d.index for d in vis.devices] == [1]
    assert vis.problems == ("ROCR_VISIBLE_DEVICES token '1' repeats a device; it and later tokens are ignored",)


def test_visibility_hip_skips_a_repeated_index_but_stops_at_an_invalid_one():
    vis = resolve_visible_devices(FOUR, {"HIP_VISIBLE_DEVICES": "1,1,01,2"})
    assert [d.index for d in vis.devices] == [1]
    assert vis.problems == (
        "HIP_VISIBLE_DEVICES token '01' is not a decimal device index; it and later tokens are ignored",
    )


def test_visibility_hip_minus_one_hides_every_gpu():
    vis = resolve_visible_devices(FOUR, {"HIP_VISIBLE_DEVICES": "-1"})
    assert vis.devices == ()


def test_visibility_hip_out_of_range_index_ends_the_list():
    vis = resolve_visible_devices(FOUR, {"HIP_VISIBLE_DEVICES": "0,7,1"})
    assert [d.index for d in vis.devices] == [0]
    assert "token '7' is out of range (0..3)" in vis.problems[0]


def test_visibility_hip_uuid_token_selects_the_gpu_whose_uuid_contains_it():
    assert visible({"HIP_VISIBLE_DEVICES": "GPU-00000000000000A3"}) == [3]


def test_visibility_uuid_tokens_cannot_be_matched_without_uuids_and_say_so():
    no_uuid = [GpuDevice(i, "gpu", "gfx942") for i in range(2)]
    vis = resolve_visible_devices(no_uuid, {"ROCR_VISIBLE_DEVICES": "GPU-1234"})
    assert vis.devices == ()
    assert "cannot be matched: the device source gave no UUIDs" in vis.problems[0]


# ----------------------------------------------------------------------------------------- no device context
def _hip_activity_during_probe(monkeypatch, tmp_path, library=found_library) -> dict[str, int]:
    """Run the ROCm probe through its vendor code (a ROCm build of torch, a library on disk, simulated amdsmi)
    with every way into the HIP runtime replaced by the simulated one; what reached it, by name.

    HIP initialises the device (and its primary context) on the first runtime call, so any call counts: the
    simulated runtime exports no hipInit or hipSetDevice, so opening the library or calling it at all is what
    is counted, together with torch's lazy init.
    """
    import ctypes

    from hisparse_hal.testing.sim_hip_runtime import SimulatedHipRuntime
    from hisparse_hal.vendors.rocm import runtime as hip_runtime

    simulated = SimulatedHipRuntime("7.2.0")
    opened: list[str] = []
    real_cdll = ctypes.CDLL

    def recording_cdll(name, *args, **kwargs):
        if "amdhip64" in str(name):
            opened.append(str(name))
            return simulated
        return real_cdll(name, *args, **kwargs)

    def recording_load(*args, **kwargs):
        opened.append("load_hip_library")
        return simulated

    monkeypatch.setattr(ctypes, "CDLL", recording_cdll)
    monkeypatch.setattr(hip_runtime, "load_hip_library", recording_load)
    def recording_runtime_load(cls, *args, **kwargs):
        return cls(recording_load())

    monkeypatch.setattr(hip_runtime.HipRuntime, "load", classmethod(recording_runtime_load))
    lazy_inits: list[str] = []
    monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: lazy_inits.append("_lazy_init"))
    monkeypatch.setattr(torch.cuda, "init", lambda: lazy_inits.append("init"))
    result = probe_rocm(rocm_inputs(tmp_path, library=library))
    assert result.available, f"the probe stopped before the vendor code: {result.reason}"
    return {"libamdhip64 opened": len(opened), "HIP runtime calls": sum(simulated.calls.values()),
            "torch lazy init": len(lazy_inits)}


def _assert_no_hip_activity(counts: dict[str, int]) -> None:
    made = {name: n for name, n in counts.items() if n}
    assert not made, f"the ROCm probe reached the HIP runtime (which creates the device context): {made}"


def test_probe_on_a_rocm_build_opens_and_calls_no_hip_runtime(monkeypatch, tmp_path):
    _assert_no_hip_activity(_hip_activity_during_probe(monkeypatch, tmp_path))


def test_hip_activity_count_catches_a_probe_that_asks_the_runtime_its_version(monkeypatch, tmp_path):
    """Planted bug: the library check loads the HIP runtime and calls hipRuntimeGetVersion."""
    from hisparse_hal.vendors.rocm.runtime import HipRuntime

    def find_and_load():
        HipRuntime.load().runtime_version()
        return found_library()

    with pytest.raises(AssertionError, match="HIP runtime calls"):
        _assert_no_hip_activity(_hip_activity_during_probe(monkeypatch, tmp_path, library=find_and_load))
