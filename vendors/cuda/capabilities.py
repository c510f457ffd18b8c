"""What the CUDA backend can do, decided from the driver version and the GPU architecture.

One pure function, :func:`plan_capabilities`, holds every CUDA version quirk of the device layer; it
touches no device and imports no driver binding. The only outside input is the descriptor-cap
environment variable, read through :func:`batch_cap_from_env`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from hisparse_hal.capabilities import Capabilities, CapabilityReasons
from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.settings import positive_setting

__all__ = [
    "plan_capabilities",
    "batch_cap_from_env",
    "format_driver_version",
    "parse_arch",
    "BATCH_CAP_ENV",
    "DEFAULT_MAX_BATCH",
    "NATIVE_BATCH_MIN_DRIVER",
    "MIN_DRIVER",
    "CUDA_KV_FORMATS",
]

#: Environment variable overriding the descriptors per ``cuMemcpyBatchAsync`` call.
BATCH_CAP_ENV = "HISPARSE_HAL_CUDA_MAX_BATCH"
#: Default cap: a CUDA 13.0 / r580 driver segfaulted at 51,828 descriptors in one call (vLLM #49276);
#: 8192 stays far below it while still amortising the per-call cost over thousands of copies.
DEFAULT_MAX_BATCH = 8192
#: ``cuMemcpyBatchAsync`` exists from CUDA 12.8 (vLLM csrc/cache_kernels.cu; vLLM #38460).
NATIVE_BATCH_MIN_DRIVER = 12080
#: Oldest driver the backend supports (CUDA 12.0: cuGetProcAddress with a query result, primary
#: context created by cudaSetDevice).
MIN_DRIVER = 12000
#: NVIDIA holds OCP fp8 (``float8_e4m3fn``, max 448), never AMD gfx942's fnuz flavour (vLLM rocm.py;
#: #45563); ``fp8_ds_mla`` rows are 656 bytes (vLLM runtime.py).
CUDA_KV_FORMATS = frozenset({"bf16", "fp8_e4m3fn", "fp8_ds_mla"})

_ARCH = re.compile(r"^sm_(\d{2,3})([af]?)$")


def format_driver_version(version: int) -> str:
    """``12080`` -> ``"12.8"`` (the encoding of ``cuDriverGetVersion``: 1000 * major + 10 * minor)."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def parse_arch(arch: object) -> int:
    """The compute capability of ``"sm_90"``/``"sm_90a"``/``"sm_100"`` as an int (90, 100).

    Raises:
        InvalidArgumentError: not a string of the form ``sm_<digits>`` with an optional ``a``/``f``.
    """
    match = _ARCH.match(arch) if isinstance(arch, str) else None
    if match is None:
        raise InvalidArgumentError(
            f"CUDA architecture must look like 'sm_90' (compute capability 9.0), got {arch!r}"
        )
    return int(match.group(1))


def batch_cap_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """The descriptor cap set in ``HISPARSE_HAL_CUDA_MAX_BATCH``, or None when unset.

    Raises:
        InvalidArgumentError: the value is not a positive integer (the message quotes it).
    """
    return positive_setting(
        BATCH_CAP_ENV,
        None,
        lambda text: int(text, 10),
        "a positive integer number of descriptors per batch call",
        environ,
        default_text=str(DEFAULT_MAX_BATCH),
    )


def plan_capabilities(
    driver_version: int,
    arch: str,
    *,
    max_batch_descriptors: int | None = None,
    host_pointer_alias: bool = False,
) -> Capabilities:
    """Decide the CUDA backend's capabilities for one device.

    Args:
        driver_version: as ``cuDriverGetVersion`` / ``nvmlSystemGetCudaDriverVersion`` report it
            (12080 is CUDA 12.8).
        arch: the device's architecture, ``"sm_90"``.
        max_batch_descriptors: the per-call descriptor cap; None reads ``HISPARSE_HAL_CUDA_MAX_BATCH``
            and falls back to :data:`DEFAULT_MAX_BATCH`.
        host_pointer_alias: True where the device's ``CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM``
            is 0, so kernels must use ``cuMemHostGetDevicePointer``'s address (read by
            :meth:`~hisparse_hal.vendors.cuda.runtime.CudaDriver.host_pointer_usable_on_device`).

    Returns:
        The :class:`Capabilities`: native batch copy from 12.8 (per-copy loop before), the cap, IPC
        events, graph capture, a shareable host pool, ``host_pointer_alias`` as given, OCP fp8 formats.

    Raises:
        InvalidArgumentError: a non-positive or non-int driver version, a malformed architecture, or
            a bad cap (argument or environment variable).
    """
    if not isinstance(driver_version, int) or isinstance(driver_version, bool) or driver_version <= 0:
        raise InvalidArgumentError(
            f"driver_version must be a positive int as cuDriverGetVersion reports it (12080 = 12.8), "
            f"got {driver_version!r}"
        )
    parse_arch(arch)
    cap, cap_source = _batch_cap(max_batch_descriptors)
    native = driver_version >= NATIVE_BATCH_MIN_DRIVER
    driver = format_driver_version(driver_version)
    reasons = CapabilityReasons()
    _explain_copy_path(native, driver, reasons)
    reasons.add("max_batch_descriptors",
        f"at most {cap} descriptors per batch call ({cap_source}); a CUDA 13.0 driver crashed at 51,828 "
        f"(vLLM #49276); set {BATCH_CAP_ENV} to change it"
    )
    if host_pointer_alias:
        reasons.add("host_pointer_alias",
            "the device cannot use host pointers of registered memory (CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM "
            "is 0): every registration records cuMemHostGetDevicePointer's address for kernels (CUDA driver "
            "API, cuMemHostRegister)"
        )
    if driver_version < MIN_DRIVER:
        reasons.add("versions",
                    f"driver {driver} is older than the supported minimum {format_driver_version(MIN_DRIVER)}")

    return Capabilities(
        batch_copy="native" if native else "loop",
        max_batch_descriptors=cap,
        ipc_events=True,
        ipc_event_max_cycles=None,
        shared_host_pool=True,
        graph_capture=True,
        host_pointer_alias=host_pointer_alias,
        kv_formats=CUDA_KV_FORMATS,
        versions={"driver": driver, "driver_api": str(driver_version), "arch": arch, "batch_cap": cap_source},
        copy_attributes=native,
        batch_copy_accelerated=native,
        reasons=reasons,
    )


def _batch_cap(max_batch_descriptors: int | None) -> tuple[int, str]:
    """The per-call descriptor cap and where it came from (``"argument"``, the environment variable, ``"default"``).

    Raises:
        InvalidArgumentError: a cap that is not a positive int (argument or environment variable).
    """
    if max_batch_descriptors is None:
        from_env = batch_cap_from_env()
        return (from_env, BATCH_CAP_ENV) if from_env is not None else (DEFAULT_MAX_BATCH, "default")
    if not isinstance(max_batch_descriptors, int) or isinstance(max_batch_descriptors, bool) \
            or max_batch_descriptors <= 0:
        raise InvalidArgumentError(f"max_batch_descriptors must be a positive int, got {max_batch_descriptors!r}")
    return max_batch_descriptors, "argument"


def _explain_copy_path(native: bool, driver: str, reasons: CapabilityReasons) -> None:
    """Why swaps use ``cuMemcpyBatchAsync`` (driver 12.8 and later) or the per-copy loop."""
    if not native:
        reasons.add("batch_copy",
            f"driver {driver} < 12.8 has no cuMemcpyBatchAsync: swaps use a per-copy cuMemcpyAsync loop "
            "(vLLM #38460)"
        )
        return
    reasons.add("batch_copy",
        f"driver {driver} >= 12.8: swaps use cuMemcpyBatchAsync, resolved with cuGetProcAddress at "
        "the 12.8 ABI because CUDA 13 headers remap the name to a _v2 without failIdx "
        "(vLLM csrc/cache_kernels.cu)"
    )
    reasons.add("copy_attributes",
        "batch copies read their sources in stream order (CU_MEMCPY_SRC_ACCESS_ORDER_STREAM) so a "
        "device-to-host copy never reads before the producing kernel ends (vLLM #39306)"
    )
    reasons.add("batch_copy",
        "the legacy default stream and graph captures use the per-copy cuMemcpyAsync loop: the batch "
        "call rejects stream 0 (vLLM cache_kernels.cu; cudf #20800) and has no graph-node form "
        "(cuda-python cuda.core.utils.copy_batch)"
    )
