"""The only module that talks to the CUDA driver: ctypes over ``libcuda.so.1``, loaded on first use.

Invariants: every return code is checked and becomes a ``DeviceRuntimeError`` carrying the driver's
error name (an unchecked error would surface later at an unrelated call, xcena maru #64); every copy and
registration runs with the device's primary context current (the one torch's runtime uses), pushed and
popped only when another context is current (device queries need none); the batch path hands the
descriptor tensors' memory to the driver as is, with no per-descriptor Python; registered host memory
yields a device alias exactly where the device cannot use its host pointer.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from hisparse_hal.errors import BackendUnavailableError, DeviceRuntimeError
from hisparse_hal.regions import SwapBatch
from hisparse_hal.vendors.gpu.runtime import SIZE_MAX, descriptor_index, nonempty_descriptors

__all__ = [
    "CudaDriver",
    "CUmemcpyAttributes",
    "CUmemLocation",
    "load_libcuda",
    "LIBCUDA_CANDIDATES",
    "CONTEXT_LOST_ERRORS",
    "CU_MEMCPY_SRC_ACCESS_ORDER_STREAM",
    "CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM",
    "BATCH_ABI_VERSION",
    "SIZE_MAX",
]

log = logging.getLogger(__name__)

#: Where libcuda is looked for, in order (the driver installs the versioned soname).
LIBCUDA_CANDIDATES: tuple[str, ...] = (
    "libcuda.so.1",
    "libcuda.so",
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",
    "/usr/lib/wsl/lib/libcuda.so.1",
)

CUDA_SUCCESS = 0
#: ABI version at which ``cuMemcpyBatchAsync`` still has ``failIdx``; CUDA 13 headers map the name to
#: ``cuMemcpyBatchAsync_v2`` without it (vLLM csrc/cache_kernels.cu), so the version is explicit.
BATCH_ABI_VERSION = 12080
CU_GET_PROC_ADDRESS_DEFAULT = 0
CU_GET_PROC_ADDRESS_SUCCESS = 0
CU_MEMHOSTREGISTER_PORTABLE = 0x01
CU_MEMHOSTREGISTER_DEVICEMAP = 0x02
#: Non-zero when the device may address memory registered with cuMemHostRegister by its host pointer;
#: zero means kernels must use cuMemHostGetDevicePointer's address (CUDA driver API, cuDeviceGetAttribute
#: and cuMemHostRegister / cuMemHostGetDevicePointer).
CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 91
CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 0x1
CU_MEMCPY_FLAG_DEFAULT = 0x0

#: Errors after which the context is gone or unusable (destroyed, driver shut down, or a sticky
#: fault that poisons the context until the process exits).
CONTEXT_LOST_ERRORS = frozenset({
    "CUDA_ERROR_DEINITIALIZED",
    "CUDA_ERROR_NOT_INITIALIZED",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    "CUDA_ERROR_INVALID_CONTEXT",
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
})


class CUmemLocation(ctypes.Structure):
    """``CUmemLocation``: a location type and an id (both 32-bit)."""

    _fields_ = [("type", ctypes.c_uint), ("id", ctypes.c_int)]


class CUmemcpyAttributes(ctypes.Structure):
    """``CUmemcpyAttributes`` (CUDA 12.8): source access order, two location hints, flags; 24 bytes."""

    _fields_ = [
        ("srcAccessOrder", ctypes.c_uint),
        ("srcLocHint", CUmemLocation),
        ("dstLocHint", CUmemLocation),
        ("flags", ctypes.c_uint),
    ]


_P = ctypes.c_void_p
_CUresult = ctypes.c_int
# Driver prototypes, by exported symbol (the header's macros name the _v2 entry points).
_PROTOTYPES: dict[str, Any] = {
    "cuInit": ctypes.CFUNCTYPE(_CUresult, ctypes.c_uint),
    "cuDriverGetVersion": ctypes.CFUNCTYPE(_CUresult, _P),
    "cuGetErrorName": ctypes.CFUNCTYPE(_CUresult, _CUresult, _P),
    "cuDeviceGet": ctypes.CFUNCTYPE(_CUresult, _P, ctypes.c_int),
    # cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
    "cuDeviceGetAttribute": ctypes.CFUNCTYPE(_CUresult, _P, ctypes.c_int, ctypes.c_int),
    "cuDevicePrimaryCtxRetain": ctypes.CFUNCTYPE(_CUresult, _P, ctypes.c_int),
    "cuCtxGetCurrent": ctypes.CFUNCTYPE(_CUresult, _P),
    "cuCtxPushCurrent_v2": ctypes.CFUNCTYPE(_CUresult, _P),
    "cuCtxPopCurrent_v2": ctypes.CFUNCTYPE(_CUresult, _P),
    # cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
    "cuMemcpyAsync": ctypes.CFUNCTYPE(_CUresult, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, _P),
    # cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
    "cuMemHostRegister_v2": ctypes.CFUNCTYPE(_CUresult, _P, ctypes.c_size_t, ctypes.c_uint),
    "cuMemHostUnregister": ctypes.CFUNCTYPE(_CUresult, _P),
    # cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int Flags), Flags must be 0
    "cuMemHostGetDevicePointer_v2": ctypes.CFUNCTYPE(_CUresult, _P, _P, ctypes.c_uint),
    # cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
    #                  CUdriverProcAddressQueryResult *symbolStatus)   (CUDA 12 signature)
    "cuGetProcAddress_v2": ctypes.CFUNCTYPE(_CUresult, ctypes.c_char_p, _P, ctypes.c_int, ctypes.c_uint64, _P),
}
#: cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
#:     CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, CUstream)
BATCH_PROTOTYPE = ctypes.CFUNCTYPE(_CUresult, _P, _P, _P, ctypes.c_size_t, _P, _P, ctypes.c_size_t, _P, _P)


def load_libcuda(candidates: Sequence[str] = LIBCUDA_CANDIDATES) -> ctypes.CDLL:
    """Load the CUDA driver library from the first candidate that opens.

    Raises:
        BackendUnavailableError: none opened; the message lists every path tried and why it failed.
    """
    failures = []
    for path in candidates:
        try:
            return ctypes.CDLL(path)
        except OSError as exc:
            failures.append(f"{path}: {exc}")
    raise BackendUnavailableError(
        "cannot load the CUDA driver library; tried " + "; ".join(failures)
        + ". Install the NVIDIA driver or add its library folder to LD_LIBRARY_PATH"
    )


def _bind(library: Any, symbol: str, prototype: Any) -> Any | None:
    """A callable for ``symbol`` with ``prototype``, or None when the library does not export it.

    Works for a ``ctypes.CDLL`` and for any object whose attributes are ctypes function pointers.
    """
    try:
        exported = getattr(library, symbol)
    except AttributeError:
        return None
    address = ctypes.cast(exported, ctypes.c_void_p).value
    return prototype(address) if address else None


class CudaDriver:
    """The CUDA driver as the shared GPU layer's ``CopyRuntime``, for one device ordinal.

    Args:
        device_ordinal: the CUDA device (after ``CUDA_VISIBLE_DEVICES``), torch's device index.
        library: a loaded driver library (tests pass ``hisparse_hal.testing.sim_cuda_driver``);
            None loads ``libcuda.so.1`` on first use.

    The device's primary context (shared with torch's runtime) is retained on first use and kept
    for the life of the process, as torch does.
    """

    label = "CUDA driver"

    def __init__(self, device_ordinal: int = 0, library: Any | None = None) -> None:
        self.device_ordinal = device_ordinal
        self._library = library
        self._lock = threading.Lock()
        self._fns: dict[str, Any] | None = None
        self._context: int | None = None
        self._batch: Any | None = None
        self._batch_resolved = False
        self._driver_version: int | None = None
        self._host_pointer_usable: bool | None = None
        # One attribute entry for every copy: read sources in stream order (vLLM #39306).
        self._attributes = CUmemcpyAttributes(
            srcAccessOrder=CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, flags=CU_MEMCPY_FLAG_DEFAULT
        )
        self._attribute_index = ctypes.c_size_t(0)

    # ----------------------------------------------------------------- loading and errors
    def _functions(self) -> dict[str, Any]:
        if self._fns is None:
            with self._lock:
                if self._fns is None:
                    library = self._library if self._library is not None else load_libcuda()
                    fns: dict[str, Any] = {name: _bind(library, name, proto) for name, proto in _PROTOTYPES.items()}
                    required = [n for n in _PROTOTYPES if n != "cuGetProcAddress_v2" and fns[n] is None]
                    if required:
                        raise BackendUnavailableError(
                            f"the CUDA driver library lacks {required}; the driver is too old or not a "
                            "CUDA driver"
                        )
                    code = fns["cuInit"](0)
                    if code != CUDA_SUCCESS:
                        raise DeviceRuntimeError("cuInit", code, _error_name(fns, code))
                    self._library = library
                    self._fns = fns
        return self._fns

    def error_name(self, code: int) -> str:
        """The driver's name for ``code`` (``CUDA_ERROR_INVALID_VALUE``), or ``CUresult <code>``."""
        return _error_name(self._fns, code)

    def _check(self, call: str, code: int, detail: str = "", index: int | None = None) -> None:
        if code != CUDA_SUCCESS:
            raise DeviceRuntimeError(call, code, self.error_name(code), detail, index)

    def driver_version(self) -> int:
        """``cuDriverGetVersion``: 12080 for CUDA 12.8."""
        if self._driver_version is None:
            value = ctypes.c_int()
            self._check("cuDriverGetVersion", self._functions()["cuDriverGetVersion"](ctypes.byref(value)))
            self._driver_version = value.value
        return self._driver_version

    def is_context_lost(self, error: DeviceRuntimeError) -> bool:
        """Whether ``error`` means the context is destroyed, the driver shut down, or a sticky fault."""
        return error.error_name in CONTEXT_LOST_ERRORS

    def host_pointer_usable_on_device(self) -> bool:
        """Whether kernels on this device may use a registered host range's own address.

        Reads ``CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM`` once (``cuInit``,
        ``cuDeviceGet``, ``cuDeviceGetAttribute``; no context is created). Where it is 0, the device
        reaches registered memory only through ``cuMemHostGetDevicePointer``'s address, which differs
        from the host address (CUDA driver API, cuDeviceGetAttribute and cuMemHostRegister).

        Raises:
            DeviceRuntimeError: a bad ordinal or a failed attribute query, with the driver's error name.
        """
        if self._host_pointer_usable is None:
            value = ctypes.c_int()
            code = self._functions()["cuDeviceGetAttribute"](
                ctypes.byref(value), CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, self._device()
            )
            self._check("cuDeviceGetAttribute", code,
                        f"CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM of device ordinal {self.device_ordinal}")
            self._host_pointer_usable = value.value != 0
        return self._host_pointer_usable

    def _device(self) -> int:
        device = ctypes.c_int()
        self._check("cuDeviceGet", self._functions()["cuDeviceGet"](ctypes.byref(device), self.device_ordinal),
                    f"device ordinal {self.device_ordinal}")
        return device.value

    # ----------------------------------------------------------------- context
    def _primary_context(self) -> int:
        if self._context is None:
            fns = self._functions()
            device = self._device()
            context = ctypes.c_void_p()
            self._check("cuDevicePrimaryCtxRetain", fns["cuDevicePrimaryCtxRetain"](ctypes.byref(context), device),
                        f"device ordinal {self.device_ordinal}")
            self._context = context.value
        return self._context  # type: ignore[return-value]

    @contextlib.contextmanager
    def current_context(self) -> Iterator[dict[str, Any]]:
        """Run the block with this device's primary context current; yields the bound functions.

        Pushes the context only when another one (or none) is current, and pops it afterwards, so the
        caller's current device is left as it was.
        """
        fns = self._functions()
        context = self._primary_context()
        current = ctypes.c_void_p()
        self._check("cuCtxGetCurrent", fns["cuCtxGetCurrent"](ctypes.byref(current)))
        if current.value == context:
            yield fns
            return
        self._check("cuCtxPushCurrent", fns["cuCtxPushCurrent_v2"](context))
        popped = ctypes.c_void_p()
        try:
            yield fns
        except BaseException:
            code = fns["cuCtxPopCurrent_v2"](ctypes.byref(popped))
            if code != CUDA_SUCCESS:  # keep the block's error; the pop failed for the same cause
                log.warning("cuCtxPopCurrent after a failed call gave %s", self.error_name(code))
            raise
        self._check("cuCtxPopCurrent", fns["cuCtxPopCurrent_v2"](ctypes.byref(popped)))

    # ----------------------------------------------------------------- batch symbol
    def has_batch_copy(self) -> bool:
        """Whether ``cuMemcpyBatchAsync`` (12.8 ABI, with ``failIdx``) resolved on this driver."""
        if not self._batch_resolved:
            self._batch = self._resolve_batch()
            self._batch_resolved = True
        return self._batch is not None

    def _resolve_batch(self) -> Any | None:
        fns = self._functions()
        version = self.driver_version()
        if version < BATCH_ABI_VERSION:
            # Absent before 12.8, and asking cuGetProcAddress for a version above the driver's is an
            # error by contract (CUDA driver API, Driver Entry Point Access).
            log.info("CUDA driver %d < %d: no cuMemcpyBatchAsync, swaps use cuMemcpyAsync", version, BATCH_ABI_VERSION)
            return None
        get_proc = fns["cuGetProcAddress_v2"]
        if get_proc is None:
            log.warning("CUDA driver %d exports no cuGetProcAddress_v2; swaps use cuMemcpyAsync", version)
            return None
        pointer = ctypes.c_void_p()
        status = ctypes.c_int(-1)
        code = get_proc(b"cuMemcpyBatchAsync", ctypes.byref(pointer), BATCH_ABI_VERSION,
                        CU_GET_PROC_ADDRESS_DEFAULT, ctypes.byref(status))
        if code != CUDA_SUCCESS or status.value != CU_GET_PROC_ADDRESS_SUCCESS or not pointer.value:
            log.warning(
                "cuGetProcAddress(cuMemcpyBatchAsync, %d) gave %s, query status %d; swaps use cuMemcpyAsync",
                BATCH_ABI_VERSION, self.error_name(code) if code else "CUDA_SUCCESS", status.value,
            )
            return None
        return BATCH_PROTOTYPE(pointer.value)

    # ----------------------------------------------------------------- copies
    def copy_batch(self, batch: SwapBatch, stream: int, *, use_attributes: bool) -> None:
        """One ``cuMemcpyBatchAsync`` call for the whole ``batch`` on ``stream``.

        Zero-byte descriptors are left out, vectorized (the batch call rejects them, rapidsai/rmm
        #2509); the failing index is reported in the numbering of ``batch``. ``use_attributes``
        passes one attribute entry that makes every copy read its source in stream order; CUDA
        requires attributes for each copy, so False is only for comparisons.

        Raises:
            DeviceRuntimeError: the symbol is missing, or the call failed (error name, failing index).
        """
        batch_call = self._batch if self.has_batch_copy() else None
        if batch_call is None:
            raise DeviceRuntimeError(
                "cuMemcpyBatchAsync", 500, "CUDA_ERROR_NOT_FOUND",
                f"driver {self.driver_version()} has no batch copy; use copy_each",
            )
        dst, src, sizes, positions = nonempty_descriptors(batch)
        count = int(sizes.numel())
        if count == 0:
            return
        fail = ctypes.c_size_t(SIZE_MAX)
        with self.current_context():
            code = batch_call(
                dst.data_ptr(), src.data_ptr(), sizes.data_ptr(), count,
                ctypes.byref(self._attributes) if use_attributes else None,
                ctypes.byref(self._attribute_index) if use_attributes else None,
                1 if use_attributes else 0,
                ctypes.byref(fail),
                stream or None,
            )
            if code != CUDA_SUCCESS:  # raised inside the context so the pop cannot mask it
                raise DeviceRuntimeError(
                    "cuMemcpyBatchAsync", code, self.error_name(code),
                    f"{count} descriptors on stream {stream:#x}", descriptor_index(fail.value, count, positions),
                )

    def copy_each(self, batch: SwapBatch, stream: int) -> None:
        """One ``cuMemcpyAsync`` per non-empty descriptor on ``stream`` (capturable, any stream).

        Raises:
            DeviceRuntimeError: a copy failed; earlier copies were enqueued (index names the failure).
        """
        dst, src, sizes, positions = nonempty_descriptors(batch)
        if sizes.numel() == 0:
            return
        with self.current_context() as fns:
            memcpy: Callable[..., int] = fns["cuMemcpyAsync"]
            handle = stream or None
            for i, (d, s, n) in enumerate(zip(dst.tolist(), src.tolist(), sizes.tolist(), strict=True)):
                code = memcpy(d, s, n, handle)
                if code != CUDA_SUCCESS:
                    raise DeviceRuntimeError(
                        "cuMemcpyAsync", code, self.error_name(code),
                        f"copy of {n} bytes {s:#x} -> {d:#x} on stream {stream:#x}",
                        descriptor_index(i, len(dst), positions),
                    )

    # ----------------------------------------------------------------- host registration
    def register_host(self, address: int, size: int) -> int | None:
        """``cuMemHostRegister(address, size, flags)``, plus the device alias where the device needs one.

        Where :meth:`host_pointer_usable_on_device` is True the flags are ``PORTABLE`` and the result is
        None: kernels may use ``address`` itself. Where it is False the flags add ``DEVICEMAP`` (the
        mapping ``cuMemHostGetDevicePointer`` reads) and the result is
        ``cuMemHostGetDevicePointer(address, 0)``, the address kernels must use (CUDA driver API,
        cuMemHostRegister). Runtime copies take the host address either way.

        Returns:
            The device alias of ``address``, or None when the host address is valid on the device.

        Raises:
            DeviceRuntimeError: the driver refused the registration (e.g. already registered, or out
                of memory), or the alias query failed (the range is then released again).
        """
        usable = self.host_pointer_usable_on_device()
        flags = CU_MEMHOSTREGISTER_PORTABLE if usable else CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP
        with self.current_context() as fns:
            self._check("cuMemHostRegister", fns["cuMemHostRegister_v2"](address, size, flags),
                        f"registering {size} bytes at {address:#x}")
            if usable:
                return None
            alias = ctypes.c_uint64(0)
            code = fns["cuMemHostGetDevicePointer_v2"](ctypes.byref(alias), address, 0)
            if code != CUDA_SUCCESS:
                # A registration whose device address is unknown is useless to kernels: release it.
                release = fns["cuMemHostUnregister"](address)
                outcome = "the registration was released"
                if release != CUDA_SUCCESS:  # keep the alias error; say why the range stays registered
                    outcome = f"releasing the registration failed too ({self.error_name(release)})"
                self._check("cuMemHostGetDevicePointer", code,
                            f"device alias of {address:#x} (+{size} bytes); {outcome}")
        return int(alias.value)

    def unregister_host(self, address: int) -> None:
        """``cuMemHostUnregister(address)``.

        Raises:
            DeviceRuntimeError: the driver refused (not registered, or the context is gone: see
                :meth:`is_context_lost`).
        """
        with self.current_context() as fns:
            self._check("cuMemHostUnregister", fns["cuMemHostUnregister"](address), f"releasing {address:#x}")


def _error_name(fns: dict[str, Any] | None, code: int) -> str:
    name = ctypes.c_char_p()
    if fns is not None and fns["cuGetErrorName"](code, ctypes.byref(name)) == CUDA_SUCCESS and name.value:
        return name.value.decode("ascii", "replace")
    return f"CUresult {code}"
