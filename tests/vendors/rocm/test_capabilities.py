"""plan_capabilities: the ROCm version and architecture table, decided as a pure function."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from hisparse_hal.errors import InvalidArgumentError, UnsupportedCapabilityError
from hisparse_hal.vendors.rocm import plan_capabilities
from hisparse_hal.vendors.rocm.capabilities import (
    MAX_BATCH_DESCRIPTORS,
    ROCM_RELEASE_HIP_VERSIONS,
    HipVersion,
    hip_version,
    parse_arch,
)

GFX942 = "gfx942:sramecc+:xnack-"

# ROCm release -> hipRuntimeGetVersion. Patches without a source (7.0, 7.13, 7.2.3) are illustrative:
# every decision below depends on them only through major.minor (and the 7.2.1 patch threshold).
V70 = hip_version(7, 0, 0)
V71 = ROCM_RELEASE_HIP_VERSIONS["7.1.0"]
V720 = ROCM_RELEASE_HIP_VERSIONS["7.2.0"]
V720_GITDATE = hip_version(7, 2, 26015)  # 7.2.0 builds whose patch came from the git date (ROCm/hip #3881)
V721 = ROCM_RELEASE_HIP_VERSIONS["7.2.1"]
V723 = hip_version(7, 2, 53211)
V713 = hip_version(7, 13, 0)
V714 = ROCM_RELEASE_HIP_VERSIONS["7.14.0"]

# (label, version, batch_copy, copy_attributes, accelerated, ipc_max_cycles, shared_pool, graph_capture)
TABLE = [
    ("7.0", V70, "loop", False, False, None, True, False),
    ("7.1", V71, "native", False, False, None, True, False),
    ("7.2.0", V720, "native", False, False, 32, False, False),
    ("7.2.0 git-date patch", V720_GITDATE, "native", False, False, 32, False, False),
    ("7.2.1", V721, "native", False, False, 32, False, True),
    ("7.2.3", V723, "native", False, False, 32, False, True),
    ("7.13", V713, "native", True, False, None, True, True),
    ("7.14", V714, "native", True, True, None, True, True),
]


@pytest.mark.parametrize(
    "label,version,batch,attrs,accelerated,max_cycles,shared_pool,capture", TABLE, ids=[t[0] for t in TABLE]
)
def test_plan_follows_the_rocm_version_table(
    label, version, batch, attrs, accelerated, max_cycles, shared_pool, capture
):
    caps = plan_capabilities(version, GFX942)
    assert caps.batch_copy == batch
    assert caps.copy_attributes is attrs
    assert caps.batch_copy_accelerated is accelerated
    assert caps.ipc_events is True
    assert caps.ipc_event_max_cycles == max_cycles
    assert caps.shared_host_pool is shared_pool
    assert caps.graph_capture is capture
    assert caps.host_pointer_alias is True
    assert caps.max_batch_descriptors == MAX_BATCH_DESCRIPTORS == 8192


@pytest.mark.parametrize("version", [t[1] for t in TABLE], ids=[t[0] for t in TABLE])
def test_plan_never_allows_more_than_8192_descriptors_per_call(version):
    assert plan_capabilities(version, "gfx950").max_batch_descriptors == 8192


def test_plan_uses_no_batch_call_before_rocm_7_1_and_says_why():
    caps = plan_capabilities(V70, GFX942)
    assert caps.batch_copy == "loop"
    why = caps.reasons["batch_copy"]
    assert "no hipMemcpyBatchAsync before 7.1" in why and "vLLM #41737" in why


def test_plan_falls_back_to_the_loop_when_the_library_lacks_the_batch_symbol():
    caps = plan_capabilities(V714, GFX942, batch_symbol=False)
    assert caps.batch_copy == "loop"
    assert caps.copy_attributes is False
    assert "exports no hipMemcpyBatchAsync" in caps.reasons["batch_copy"]


@pytest.mark.parametrize("version", [V721, V723])
def test_plan_passes_no_copy_attributes_on_rocm_7_2_because_they_return_801(version):
    caps = plan_capabilities(version, GFX942)
    assert caps.copy_attributes is False
    assert "801" in caps.reasons["copy_attributes"] and "ROCm/clr #273" in caps.reasons["copy_attributes"]


def test_plan_still_calls_the_batch_api_before_7_14_and_records_it_is_not_accelerated():
    caps = plan_capabilities(V713, GFX942)
    assert (caps.batch_copy, caps.batch_copy_accelerated) == ("native", False)
    why = caps.reasons["batch_copy_accelerated"]
    assert "before 7.14" in why and "vLLM #40549" in why


def test_plan_limits_ipc_events_to_32_cycles_and_refuses_a_shared_pool_on_7_2():
    caps = plan_capabilities(V721, "gfx950")
    assert (caps.ipc_event_max_cycles, caps.shared_host_pool) == (32, False)
    assert "32 record/wait cycles" in caps.reasons["ipc_event_max_cycles"]
    assert "vLLM #57602" in caps.reasons["shared_host_pool"]


def test_plan_requires_rocm_7_2_1_for_graph_capture():
    assert plan_capabilities(V720, GFX942).graph_capture is False
    assert plan_capabilities(V721, GFX942).graph_capture is True
    assert "SGLang #23580" in plan_capabilities(V720, GFX942).reasons["graph_capture"]
    assert "graph_capture" not in plan_capabilities(V721, GFX942).reasons


# (arch, kv formats, shared memory per block, wavefront)
ARCHES = [
    ("gfx942:sramecc+:xnack-", {"bf16", "fp8_e4m3fnuz"}, "65536", "64"),
    ("gfx942", {"bf16", "fp8_e4m3fnuz"}, "65536", "64"),
    ("gfx940:xnack+", {"bf16", "fp8_e4m3fnuz"}, "65536", "64"),
    ("gfx950", {"bf16", "fp8_e4m3fn"}, "163840", "64"),
    ("gfx950:sramecc+:xnack-", {"bf16", "fp8_e4m3fn"}, "163840", "64"),
    ("gfx90a:sramecc+:xnack-", {"bf16"}, "65536", "64"),
    ("gfx1100", {"bf16"}, "65536", "32"),
]


@pytest.mark.parametrize("arch,formats,lds,wave", ARCHES, ids=[a[0] for a in ARCHES])
def test_plan_sets_kv_formats_and_records_architecture_facts(arch, formats, lds, wave):
    caps = plan_capabilities(V721, arch)
    assert caps.kv_formats == frozenset(formats)
    assert caps.versions["shared_memory_per_block"] == lds
    assert caps.versions["wavefront_size"] == wave
    assert caps.versions["arch"] == arch
    assert caps.versions["gfx"] == arch.split(":")[0]


@pytest.mark.parametrize("arch", [a[0] for a in ARCHES] + ["gfx1201", "gfx908"])
def test_plan_never_offers_both_fp8_flavours_nor_fp8_ds_mla(arch):
    formats = plan_capabilities(V714, arch).kv_formats
    assert not {"fp8_e4m3fn", "fp8_e4m3fnuz"} <= formats
    assert "fp8_ds_mla" not in formats
    assert "bf16" in formats


def test_plan_for_an_unknown_architecture_is_conservative_and_says_so():
    caps = plan_capabilities(V714, "gfx1201")
    assert caps.kv_formats == frozenset({"bf16"})
    assert caps.versions["shared_memory_per_block"] == "unknown"
    assert caps.versions["product"] == "unknown"
    assert "gfx1201 is not in this backend's architecture table" in caps.reasons["kv_formats"]
    assert caps.batch_copy == "native"  # data movement does not depend on the architecture


def test_plan_uses_the_copy_loop_on_gfx908_where_batch_copies_corrupt_memory():
    caps = plan_capabilities(V714, "gfx908:sramecc+:xnack-")
    assert caps.batch_copy == "loop"
    assert caps.copy_attributes is False
    assert "rocm-systems #11662" in caps.reasons["batch_copy"]


def test_plan_records_versions_as_strings_for_reports():
    caps = plan_capabilities(V721, GFX942)
    assert caps.versions["hip_runtime"] == "7.2.53211"
    assert caps.versions["hip_runtime_int"] == str(V721)
    assert caps.versions["arch_features"] == "sramecc+,xnack-"
    assert all(isinstance(v, str) for v in caps.versions.values())
    assert caps.stats_dtype == torch.uint64


def test_plan_is_pure_the_same_inputs_give_equal_capabilities():
    assert plan_capabilities(V713, "gfx950") == plan_capabilities(V713, "gfx950")


@pytest.mark.parametrize("bad", [0, -1, "70200000", 7.2, True])
def test_plan_rejects_a_version_that_is_not_a_positive_int(bad):
    with pytest.raises(InvalidArgumentError, match="runtime_version must be a positive int"):
        plan_capabilities(bad, GFX942)


@pytest.mark.parametrize("bad", ["sm_90", "942", "gfx94", "gfx942:sramecc", "", "GFX"])
def test_plan_rejects_an_architecture_that_is_not_a_gfx_target(bad):
    with pytest.raises(InvalidArgumentError, match="is not an AMD gfx target"):
        plan_capabilities(V721, bad)


def test_plan_refuses_hip_runtimes_older_than_6_0():
    with pytest.raises(UnsupportedCapabilityError, match=r"HIP runtime 5\.7\.31061 is older than 6\.0\.0"):
        plan_capabilities(hip_version(5, 7, 31061), GFX942)


def test_hip_version_round_trips_the_runtime_encoding():
    assert hip_version(7, 2, 53211) == 70253211
    assert str(HipVersion.from_int(71460850)) == "7.14.60850"
    assert HipVersion.from_int(70253211) > HipVersion.from_int(70253210)


def test_parse_arch_splits_base_and_features():
    parsed = parse_arch("gfx942:sramecc+:xnack-")
    assert (parsed.base, parsed.features) == ("gfx942", (("sramecc", True), ("xnack", False)))


def test_importing_the_package_loads_neither_the_binding_nor_the_backend(tmp_path):
    code = textwrap.dedent(
        """
        import sys
        import hisparse_hal.vendors.rocm as rocm
        rocm.plan_capabilities(70253211, "gfx950")
        loaded = [m for m in ("hisparse_hal.vendors.rocm.runtime", "hisparse_hal.vendors.rocm.backend",
                              "hisparse_hal.vendors.gpu.backend") if m in sys.modules]
        import torch
        print(loaded, torch.cuda.is_initialized())
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] False"  # the False is the GPU-run check (always False on a CPU build)
