"""The CUDA capability plan over the driver-version table and architectures (a pure function)."""

from __future__ import annotations

import pytest

from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.vendors.cuda import plan_capabilities
from hisparse_hal.vendors.cuda.capabilities import BATCH_CAP_ENV, DEFAULT_MAX_BATCH

ARCHS = ["sm_80", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_120"]


@pytest.fixture(autouse=True)
def _no_cap_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BATCH_CAP_ENV, raising=False)


@pytest.mark.parametrize(
    "driver_version, batch_copy, driver",
    [
        (11080, "loop", "11.8"),
        (12040, "loop", "12.4"),
        (12079, "loop", "12.7"),
        (12080, "native", "12.8"),
        (12090, "native", "12.9"),
        (13000, "native", "13.0"),
    ],
)
@pytest.mark.parametrize("arch", ARCHS)
def test_plan_uses_native_batch_copy_from_driver_12_8(
    driver_version: int, batch_copy: str, driver: str, arch: str
) -> None:
    caps = plan_capabilities(driver_version, arch)
    native = batch_copy == "native"
    assert caps.batch_copy == batch_copy
    assert caps.copy_attributes is native  # stream-ordered source reads ride on the batch attributes
    assert caps.batch_copy_accelerated is native
    assert caps.max_batch_descriptors == DEFAULT_MAX_BATCH
    assert caps.versions["driver"] == driver
    assert caps.versions["driver_api"] == str(driver_version)
    assert caps.versions["arch"] == arch
    assert (caps.ipc_events, caps.ipc_event_max_cycles, caps.shared_host_pool) == (True, None, True)
    assert (caps.graph_capture, caps.host_pointer_alias) == (True, False)
    assert caps.kv_formats == frozenset({"bf16", "fp8_e4m3fn", "fp8_ds_mla"})
    assert "fp8_e4m3fnuz" not in caps.kv_formats
    assert "vLLM #49276" in caps.reasons["max_batch_descriptors"]
    assert "cuMemcpyBatchAsync" in caps.reasons["batch_copy"]
    assert ("vLLM #38460" in caps.reasons["batch_copy"]) is not native
    assert ("copy_attributes" in caps.reasons) is native


def test_plan_records_the_host_pointer_alias_the_device_attribute_asks_for() -> None:
    caps = plan_capabilities(12080, "sm_90", host_pointer_alias=True)
    assert caps.host_pointer_alias is True
    why = caps.reasons["host_pointer_alias"]
    assert "CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM is 0" in why and "cuMemHostGetDevicePointer" in why
    default = plan_capabilities(12080, "sm_90")
    assert default.host_pointer_alias is False
    assert "host_pointer_alias" not in default.reasons


def test_plan_notes_that_a_pre_12_driver_is_below_the_supported_minimum() -> None:
    assert "older than the supported minimum 12.0" in plan_capabilities(11080, "sm_80").reasons["versions"]
    assert "versions" not in plan_capabilities(12080, "sm_90").reasons


def test_default_cap_is_far_below_the_descriptor_count_that_crashed_cuda_13() -> None:
    assert DEFAULT_MAX_BATCH * 4 < 51_828


def test_cap_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BATCH_CAP_ENV, "1024")
    caps = plan_capabilities(12080, "sm_90")
    assert caps.max_batch_descriptors == 1024
    assert caps.versions["batch_cap"] == BATCH_CAP_ENV


def test_cap_argument_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BATCH_CAP_ENV, "1024")
    assert plan_capabilities(12080, "sm_90", max_batch_descriptors=16).max_batch_descriptors == 16


@pytest.mark.parametrize("raw", ["0", "-5", "lots", "8k", "1.5"])
def test_bad_cap_in_the_environment_is_a_typed_error_naming_it(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(BATCH_CAP_ENV, raw)
    with pytest.raises(InvalidArgumentError, match=f"{BATCH_CAP_ENV} must be a positive integer .* got {raw!r}"):
        plan_capabilities(12080, "sm_90")


@pytest.mark.parametrize("cap", [0, -1, True, 2.5])
def test_bad_cap_argument_is_rejected(cap: object) -> None:
    with pytest.raises(InvalidArgumentError, match=f"max_batch_descriptors must be a positive int, got {cap!r}"):
        plan_capabilities(12080, "sm_90", max_batch_descriptors=cap)  # type: ignore[arg-type]


@pytest.mark.parametrize("arch", ["gfx942", "90", "sm90", "sm_9", "SM_90", "", None])
def test_malformed_architecture_is_rejected(arch: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"CUDA architecture must look like 'sm_90'.*got"):
        plan_capabilities(12080, arch)  # type: ignore[arg-type]


@pytest.mark.parametrize("version", [0, -12080, "12.8", 12.8, None, True])
def test_malformed_driver_version_is_rejected(version: object) -> None:
    with pytest.raises(InvalidArgumentError, match="driver_version must be a positive int"):
        plan_capabilities(version, "sm_90")  # type: ignore[arg-type]


def test_plan_is_stable_and_serialises() -> None:
    first, second = plan_capabilities(12090, "sm_90"), plan_capabilities(12090, "sm_90")
    assert first == second
    data = first.as_dict()
    assert data["kv_formats"] == ["bf16", "fp8_ds_mla", "fp8_e4m3fn"]
    assert data["stats_dtype"] == "uint64"
