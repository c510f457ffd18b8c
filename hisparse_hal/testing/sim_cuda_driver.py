"""SIMULATOR of the CUDA driver library (libcuda.so.1), for unit tests on machines without a GPU.

This is NOT the NVIDIA driver and proves nothing about hardware. It exposes, as attributes named like
libcuda's exported symbols, real C function pointers (``ctypes.CFUNCTYPE`` callbacks with cuda.h's
signatures), so ``CudaDriver`` binds it exactly as it binds libcuda, and ``cuGetProcAddress`` hands
back a real function pointer. "Device memory" is host memory the test declares with
:meth:`SimulatedCudaDriver.allocate_device`; copies move real bytes with ``ctypes.memmove``.

Documented driver behaviours it reproduces (sources in vendor-facts.md):

- no ``cuMemcpyBatchAsync`` before 12.8; asking ``cuGetProcAddress`` for a version above the driver's
  is ``CUDA_ERROR_INVALID_VALUE``; at 13.0 and later the name resolves to the ``_v2`` ABI without
  ``failIdx`` unless the 12.8 ABI is requested (quirks 1-2);
- the batch call rejects the legacy default stream with ``CUDA_ERROR_INVALID_VALUE`` (quirk 3);
- the batch call requires one attribute entry per copy (cuda-python ``memcpy_batch_async`` docs) and
  rejects zero-byte entries (rapidsai/rmm #2509);
- a batch above ``crash_above`` descriptors "crashes": it returns ``CUDA_ERROR_ILLEGAL_ADDRESS`` and
  poisons the context, so every later call fails with it (quirk 4, and the sticky error of quirk 7);
- copies and registrations need a current context (``CUDA_ERROR_INVALID_CONTEXT`` otherwise);
- overlapping or unknown host registrations (``CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`` /
  ``..._NOT_REGISTERED``); one registration of ``max_register_bytes`` or more fails (quirk 5);
- a registration that fails on a chosen call (``fail_register_call``), to prove rollback;
- a lost context (``lose_context``): every call returns ``CUDA_ERROR_DEINITIALIZED`` (teardown);
- ``CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM`` (91) as chosen by
  ``host_pointer_usable``; where it is 0, ``cuMemHostGetDevicePointer`` hands back an address that differs
  from the host pointer (host + :data:`DEVICE_ALIAS_OFFSET`) and fails for a range registered without
  ``CU_MEMHOSTREGISTER_DEVICEMAP``; where it is 1, it hands back the host pointer (CUDA driver API,
  cuMemHostGetDevicePointer). Its ``Flags`` must be 0.

Behaviour the real driver leaves unspecified (what is copied when a batch fails) is simplified: a
failing batch copies nothing.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Collection
from typing import Any

import torch

SIZE_MAX = 2**64 - 1
CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 91
DEVICEMAP = 0x02
#: Where the simulated device cannot use host pointers, a registered range's device alias is this far
#: above its host address (any value that differs works: nothing dereferences the alias).
DEVICE_ALIAS_OFFSET = 0x7F00_0000_0000

ERROR_NAMES = {
    0: "CUDA_SUCCESS",
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    201: "CUDA_ERROR_INVALID_CONTEXT",
    500: "CUDA_ERROR_NOT_FOUND",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    709: "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    712: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
    713: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
    999: "CUDA_ERROR_UNKNOWN",
}
CODES = {name: code for code, name in ERROR_NAMES.items()}

# Prototypes written from cuda.h, independently of the binding under test.
_R = ctypes.c_int
_V = ctypes.c_void_p
PROTOTYPES = {
    "cuInit": ctypes.CFUNCTYPE(_R, ctypes.c_uint),
    "cuDriverGetVersion": ctypes.CFUNCTYPE(_R, _V),
    "cuGetErrorName": ctypes.CFUNCTYPE(_R, _R, _V),
    "cuDeviceGet": ctypes.CFUNCTYPE(_R, _V, ctypes.c_int),
    "cuDeviceGetAttribute": ctypes.CFUNCTYPE(_R, _V, ctypes.c_int, ctypes.c_int),
    "cuDevicePrimaryCtxRetain": ctypes.CFUNCTYPE(_R, _V, ctypes.c_int),
    "cuCtxGetCurrent": ctypes.CFUNCTYPE(_R, _V),
    "cuCtxPushCurrent_v2": ctypes.CFUNCTYPE(_R, _V),
    "cuCtxPopCurrent_v2": ctypes.CFUNCTYPE(_R, _V),
    "cuMemcpyAsync": ctypes.CFUNCTYPE(_R, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, _V),
    "cuMemHostRegister_v2": ctypes.CFUNCTYPE(_R, _V, ctypes.c_size_t, ctypes.c_uint),
    "cuMemHostUnregister": ctypes.CFUNCTYPE(_R, _V),
    "cuMemHostGetDevicePointer_v2": ctypes.CFUNCTYPE(_R, _V, _V, ctypes.c_uint),
    "cuGetProcAddress_v2": ctypes.CFUNCTYPE(_R, ctypes.c_char_p, _V, ctypes.c_int, ctypes.c_uint64, _V),
}
# cuMemcpyBatchAsync at the 12.8 ABI (with failIdx) and the 13.0 _v2 ABI (without).
BATCH_V1 = ctypes.CFUNCTYPE(_R, _V, _V, _V, ctypes.c_size_t, _V, _V, ctypes.c_size_t, _V, _V)
BATCH_V2 = ctypes.CFUNCTYPE(_R, _V, _V, _V, ctypes.c_size_t, _V, _V, ctypes.c_size_t, _V)


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint), ("id", ctypes.c_int)]


class _Attributes(ctypes.Structure):
    _fields_ = [
        ("srcAccessOrder", ctypes.c_uint),
        ("srcLocHint", _Location),
        ("dstLocHint", _Location),
        ("flags", ctypes.c_uint),
    ]


class SimulatedCudaDriver:
    """A simulated libcuda (see the module docstring). Attributes named ``cu*`` are C function pointers.

    Args:
        driver_version: what ``cuDriverGetVersion`` reports (12080 = 12.8).
        device_count: devices the simulated driver sees.
        crash_above: a batch with more descriptors than this poisons the context (None: never).
        fail_register_call: the 1-based ``cuMemHostRegister`` call that fails with out-of-memory.
        max_register_bytes: one registration of at least this many bytes fails (None: no limit).
        host_pointer_usable: the value of device attribute 91 (CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM).
        device_pointer_error: an error name every ``cuMemHostGetDevicePointer`` returns (None: none).
        fail_unregister_calls: the ``cuMemHostUnregister`` calls (1-based) that fail with
            CUDA_ERROR_UNKNOWN and leave the range registered.
    """

    # Two of the function pointers __init__ sets (one per PROTOTYPES entry), declared for the tests that call them.
    cuGetProcAddress_v2: Callable[..., int]
    cuCtxPushCurrent_v2: Callable[..., int]

    def __init__(
        self,
        driver_version: int = 12080,
        *,
        device_count: int = 1,
        crash_above: int | None = None,
        fail_register_call: int | None = None,
        max_register_bytes: int | None = None,
        host_pointer_usable: bool = True,
        device_pointer_error: str | None = None,
        fail_unregister_calls: Collection[int] = (),
    ) -> None:
        self.driver_version = driver_version
        self.device_count = device_count
        self.crash_above = crash_above
        self.fail_register_call = fail_register_call
        self.max_register_bytes = max_register_bytes
        self.host_pointer_usable = host_pointer_usable
        self.device_pointer_error = device_pointer_error
        self.fail_unregister_calls = frozenset(fail_unregister_calls)
        self._unregister_calls = 0
        #: Every call: (symbol, details dict).
        self.calls: list[tuple[str, dict[str, Any]]] = []
        #: Exceptions raised inside callbacks (a callback must never raise into C); tests assert empty.
        self.callback_errors: list[BaseException] = []
        self.initialized = False
        self.poisoned_with: int | None = None
        self.registered: dict[int, tuple[int, int]] = {}  # address -> (size, flags)
        self._register_calls = 0
        self._device_memory: list[tuple[int, int, torch.Tensor]] = []
        self._bad_addresses: set[int] = set()
        self._tls = threading.local()
        self._name_buffers = {code: ctypes.create_string_buffer(name.encode()) for code, name in ERROR_NAMES.items()}
        self._callbacks: list[Any] = []
        for symbol, prototype in PROTOTYPES.items():
            if symbol == "cuGetProcAddress_v2" and driver_version < 12000:
                continue  # the 5-argument form exists from CUDA 12.0
            setattr(self, symbol, self._export(prototype, getattr(self, "_" + symbol)))
        self._batch_v1 = self._export(BATCH_V1, self._batch_12080)
        self._batch_v2 = self._export(BATCH_V2, self._batch_13000)

    # ----------------------------------------------------------------- test controls
    def allocate_device(self, nbytes: int) -> torch.Tensor:
        """Host memory the simulated device treats as device memory (kept alive by the simulator)."""
        tensor = torch.zeros(nbytes, dtype=torch.uint8)
        self._device_memory.append((tensor.data_ptr(), tensor.data_ptr() + nbytes, tensor))
        return tensor

    def fail_copies_touching(self, address: int) -> None:
        """Make any copy whose source or destination starts at ``address`` fail (invalid value)."""
        self._bad_addresses.add(address)

    def lose_context(self, code: int = CODES["CUDA_ERROR_DEINITIALIZED"]) -> None:
        """From now on every call fails with ``code``, as after driver shutdown."""
        self.poisoned_with = code

    def calls_to(self, symbol: str) -> list[dict[str, Any]]:
        """The details of every call to ``symbol``."""
        return [details for name, details in self.calls if name == symbol]

    # ----------------------------------------------------------------- plumbing
    def _export(self, prototype: Any, method: Callable[..., int]) -> Any:
        def guarded(*args: Any) -> int:
            try:
                return method(*args)
            except BaseException as exc:  # noqa: BLE001 - never raise into C
                self.callback_errors.append(exc)
                return CODES["CUDA_ERROR_UNKNOWN"]

        callback = prototype(guarded)
        self._callbacks.append(callback)
        return callback

    def _stack(self) -> list[int]:
        if not hasattr(self._tls, "stack"):
            self._tls.stack = []
        return self._tls.stack

    def _gate(self, needs_context: bool) -> int:
        if self.poisoned_with is not None:
            return self.poisoned_with
        if not self.initialized:
            return CODES["CUDA_ERROR_NOT_INITIALIZED"]
        if needs_context and not self._stack():
            return CODES["CUDA_ERROR_INVALID_CONTEXT"]
        return 0

    def _known(self, address: int, size: int) -> bool:
        if address in self._bad_addresses:
            return False
        end = address + size
        for start, stop, _ in self._device_memory:
            if start <= address and end <= stop:
                return True
        for start, (length, _flags) in self.registered.items():
            if start <= address and end <= start + length:
                return True
        return False

    @staticmethod
    def _write_pointer(where: int | None, value: int | None) -> None:
        if where:
            ctypes.c_void_p.from_address(where).value = value

    @staticmethod
    def _write_int(where: int | None, value: int) -> None:
        if where:
            ctypes.c_int.from_address(where).value = value

    # ----------------------------------------------------------------- driver entry points
    def _cuInit(self, flags: int) -> int:
        self.calls.append(("cuInit", {"flags": flags}))
        if self.poisoned_with is not None:
            return self.poisoned_with
        if flags != 0:
            return CODES["CUDA_ERROR_INVALID_VALUE"]
        if self.device_count == 0:
            return CODES["CUDA_ERROR_NO_DEVICE"]
        self.initialized = True
        return 0

    def _cuDriverGetVersion(self, out: int | None) -> int:
        if not out:
            return CODES["CUDA_ERROR_INVALID_VALUE"]
        self._write_int(out, self.driver_version)
        return 0

    def _cuGetErrorName(self, code: int, out: int | None) -> int:
        buffer = self._name_buffers.get(code)
        if buffer is None or not out:
            return CODES["CUDA_ERROR_INVALID_VALUE"]
        self._write_pointer(out, ctypes.addressof(buffer))
        return 0

    def _cuDeviceGet(self, out: int | None, ordinal: int) -> int:
        status = self._gate(needs_context=False)
        if status:
            return status
        if not 0 <= ordinal < self.device_count:
            return CODES["CUDA_ERROR_INVALID_DEVICE"]
        self._write_int(out, ordinal)
        return 0

    def _cuDeviceGetAttribute(self, out: int | None, attribute: int, device: int) -> int:
        self.calls.append(("cuDeviceGetAttribute", {"attribute": attribute, "device": device}))
        status = self._gate(needs_context=False)
        if status:
            return status
        if not 0 <= device < self.device_count:
            return CODES["CUDA_ERROR_INVALID_DEVICE"]
        if not out or attribute != CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
            return CODES["CUDA_ERROR_INVALID_VALUE"]  # the only attribute the simulator knows
        self._write_int(out, int(self.host_pointer_usable))
        return 0

    def _cuDevicePrimaryCtxRetain(self, out: int | None, device: int) -> int:
        status = self._gate(needs_context=False)
        if status:
            return status
        if not 0 <= device < self.device_count:
            return CODES["CUDA_ERROR_INVALID_DEVICE"]
        self.calls.append(("cuDevicePrimaryCtxRetain", {"device": device}))
        self._write_pointer(out, self.primary_context(device))
        return 0

    @staticmethod
    def primary_context(device: int) -> int:
        """The simulated primary context handle of ``device``."""
        return 0x5000 + device

    def _cuCtxGetCurrent(self, out: int | None) -> int:
        status = self._gate(needs_context=False)
        if status:
            return status
        stack = self._stack()
        self._write_pointer(out, stack[-1] if stack else 0)
        return 0

    def _cuCtxPushCurrent_v2(self, context: int | None) -> int:
        status = self._gate(needs_context=False)
        if status:
            return status
        if not context:
            return CODES["CUDA_ERROR_INVALID_CONTEXT"]
        self._stack().append(context)
        self.calls.append(("cuCtxPushCurrent", {"context": context}))
        return 0

    def _cuCtxPopCurrent_v2(self, out: int | None) -> int:
        status = self._gate(needs_context=True)
        if status:
            return status
        self._write_pointer(out, self._stack().pop())
        self.calls.append(("cuCtxPopCurrent", {}))
        return 0

    def _cuGetProcAddress_v2(
        self, symbol: bytes, pfn: int | None, version: int, flags: int, status_out: int | None
    ) -> int:
        self.calls.append(("cuGetProcAddress", {"symbol": symbol, "version": version, "flags": flags}))
        if self.poisoned_with is not None:
            return self.poisoned_with
        if not pfn or version > self.driver_version:
            return CODES["CUDA_ERROR_INVALID_VALUE"]
        self._write_pointer(pfn, 0)
        if symbol != b"cuMemcpyBatchAsync" or self.driver_version < 12080:
            self._write_int(status_out, 1)  # CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
            return 0
        if version < 12080:
            self._write_int(status_out, 2)  # CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
            return 0
        chosen = self._batch_v2 if version >= 13000 else self._batch_v1
        self._write_pointer(pfn, ctypes.cast(chosen, ctypes.c_void_p).value)
        self._write_int(status_out, 0)
        return 0

    def _copy_one(self, dst: int, src: int, size: int) -> bool:
        if size and not (self._known(src, size) and self._known(dst, size)):
            return False
        return True

    def _cuMemcpyAsync(self, dst: int, src: int, size: int, stream: int | None) -> int:
        status = self._gate(needs_context=True)
        self.calls.append(("cuMemcpyAsync", {"dst": dst, "src": src, "size": size, "stream": stream or 0}))
        if status:
            return status
        if not self._copy_one(dst, src, size):
            return CODES["CUDA_ERROR_INVALID_VALUE"]
        if size:
            ctypes.memmove(dst, src, size)
        return 0

    def _batch(
        self,
        abi: int,
        dsts: int | None,
        srcs: int | None,
        sizes: int | None,
        count: int,
        attrs: int | None,
        attrs_idxs: int | None,
        num_attrs: int,
        fail_idx: int | None,
        stream: int | None,
    ) -> int:
        if fail_idx:
            ctypes.c_size_t.from_address(fail_idx).value = SIZE_MAX
        status = self._gate(needs_context=True)
        order = _Attributes.from_address(attrs).srcAccessOrder if attrs and num_attrs else None
        self.calls.append(("cuMemcpyBatchAsync", {"abi": abi, "count": count, "stream": stream or 0,
                                                  "num_attrs": num_attrs, "src_access_order": order}))
        if status:
            return status
        if not stream:
            return CODES["CUDA_ERROR_INVALID_VALUE"]  # legacy default stream (vLLM cache_kernels.cu; cudf #20800)
        if count == 0 or not (dsts and srcs and sizes):
            return CODES["CUDA_ERROR_INVALID_VALUE"]
        if self.crash_above is not None and count > self.crash_above:
            self.poisoned_with = CODES["CUDA_ERROR_ILLEGAL_ADDRESS"]  # the "segfault" of vLLM #49276
            return self.poisoned_with
        if num_attrs < 1 or not attrs or not attrs_idxs or ctypes.c_size_t.from_address(attrs_idxs).value != 0:
            return CODES["CUDA_ERROR_INVALID_VALUE"]
        if order not in (1, 2, 3):
            return CODES["CUDA_ERROR_INVALID_VALUE"]
        d = (ctypes.c_uint64 * count).from_address(dsts)
        s = (ctypes.c_uint64 * count).from_address(srcs)
        n = (ctypes.c_size_t * count).from_address(sizes)
        for i in range(count):
            # The batch call rejects zero-byte entries (rapidsai/rmm #2509), unlike cuMemcpyAsync.
            if n[i] == 0 or not self._copy_one(d[i], s[i], n[i]):
                if fail_idx:
                    ctypes.c_size_t.from_address(fail_idx).value = i
                return CODES["CUDA_ERROR_INVALID_VALUE"]
        for i in range(count):
            if n[i]:
                ctypes.memmove(d[i], s[i], n[i])
        return 0

    def _batch_12080(self, dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, fail_idx, stream) -> int:
        return self._batch(12080, dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, fail_idx, stream)

    def _batch_13000(self, dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, stream) -> int:
        return self._batch(13000, dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, None, stream)

    def _cuMemHostRegister_v2(self, address: int | None, size: int, flags: int) -> int:
        status = self._gate(needs_context=True)
        self._register_calls += 1
        self.calls.append(("cuMemHostRegister", {"address": address or 0, "size": size, "flags": flags}))
        if status:
            return status
        if not address or size == 0 or flags & ~0x0F:
            return CODES["CUDA_ERROR_INVALID_VALUE"]
        if self.fail_register_call == self._register_calls:
            return CODES["CUDA_ERROR_OUT_OF_MEMORY"]
        if self.max_register_bytes is not None and size >= self.max_register_bytes:
            return CODES["CUDA_ERROR_INVALID_VALUE"]
        for start, (length, _flags) in self.registered.items():
            if address < start + length and start < address + size:
                return CODES["CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"]
        self.registered[address] = (size, flags)
        return 0

    def _cuMemHostUnregister(self, address: int | None) -> int:
        status = self._gate(needs_context=True)
        self.calls.append(("cuMemHostUnregister", {"address": address or 0}))
        self._unregister_calls += 1
        if status:
            return status
        if self._unregister_calls in self.fail_unregister_calls:
            return CODES["CUDA_ERROR_UNKNOWN"]
        if not address or address not in self.registered:
            return CODES["CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"]
        del self.registered[address]
        return 0

    def _cuMemHostGetDevicePointer_v2(self, out: int | None, address: int | None, flags: int) -> int:
        status = self._gate(needs_context=True)
        self.calls.append(("cuMemHostGetDevicePointer", {"address": address or 0, "flags": flags}))
        if status:
            return status
        if self.device_pointer_error is not None:
            return CODES[self.device_pointer_error]
        if not out or not address or flags != 0:
            return CODES["CUDA_ERROR_INVALID_VALUE"]
        for start, (length, registered_flags) in self.registered.items():
            if start <= address < start + length:
                if self.host_pointer_usable:
                    ctypes.c_uint64.from_address(out).value = address
                    return 0
                if not registered_flags & DEVICEMAP:
                    return CODES["CUDA_ERROR_INVALID_VALUE"]  # not mapped into the device's address space
                ctypes.c_uint64.from_address(out).value = address + DEVICE_ALIAS_OFFSET
                return 0
        return CODES["CUDA_ERROR_INVALID_VALUE"]
