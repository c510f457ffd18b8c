"""The ctypes binding to the HIP runtime (``libamdhip64``): the only module that calls into it.

Every call's ``hipError_t`` is checked and turned into ``DeviceRuntimeError`` with HIP's error name and,
for a batch, the failing index. Functions are bound by address through typed prototypes, so a simulated
runtime exercises the same C ABI. Signatures follow ROCm's ``hip_runtime_api.h`` (hipMemcpyBatchAsync:
dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, stream).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from hisparse_hal.errors import (
    BackendUnavailableError,
    DeviceRuntimeError,
    InvalidArgumentError,
)
from hisparse_hal.regions import SwapBatch
from hisparse_hal.vendors.gpu.runtime import SIZE_MAX, descriptor_index, nonempty_descriptors

from .capabilities import MAX_BATCH_DESCRIPTORS

__all__ = [
    "LIBRARY_NAMES",
    "HipMemLocation",
    "HipMemcpyAttributes",
    "SymbolTable",
    "SharedLibrary",
    "HipRuntime",
    "library_directories",
    "find_hip_library",
    "load_hip_library",
    "mapped_hip_libraries",
]

log = logging.getLogger(__name__)

#: Tried in this order (vLLM's ROCm fallback does the same): the development link, then ROCm 7, then 6.
LIBRARY_NAMES = ("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6")

HIP_SUCCESS = 0
HIP_MEMCPY_DEFAULT = 4  # hipMemcpyDefault: direction inferred from the pointers (unified addressing)
HIP_HOST_REGISTER_PORTABLE = 0x1  # registered for every device of the process
HIP_HOST_REGISTER_MAPPED = 0x2  # mapped into the device address space: hipHostGetDevicePointer works
HIP_MEMCPY_SRC_ACCESS_ORDER_STREAM = 0x1  # hipMemcpySrcAccessOrderStream
#: Codes meaning the runtime or its context is gone: teardown at interpreter exit, or a sticky device
#: fault after which every call fails (the same policy as the CUDA binding).
_CONTEXT_LOST = {
    4: "hipErrorDeinitialized", 201: "hipErrorInvalidContext", 709: "hipErrorContextIsDestroyed",
    700: "hipErrorIllegalAddress", 719: "hipErrorLaunchFailure",
}


class HipMemLocation(ctypes.Structure):
    """``hipMemLocation``: a location type and id (both ``int``)."""

    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class HipMemcpyAttributes(ctypes.Structure):
    """``hipMemcpyAttributes`` (ROCm driver_types.h): 24 bytes, 4-byte aligned."""

    _fields_ = [
        ("srcAccessOrder", ctypes.c_int),
        ("srcLocHint", HipMemLocation),
        ("dstLocHint", HipMemLocation),
        ("flags", ctypes.c_uint),
    ]


_c = ctypes
_PROTOTYPES = {
    "hipRuntimeGetVersion": _c.CFUNCTYPE(_c.c_int, _c.c_void_p),
    "hipGetErrorName": _c.CFUNCTYPE(_c.c_void_p, _c.c_int),  # const char*, read with string_at
    "hipMemcpyAsync": _c.CFUNCTYPE(_c.c_int, _c.c_void_p, _c.c_void_p, _c.c_size_t, _c.c_int, _c.c_void_p),
    "hipMemcpyBatchAsync": _c.CFUNCTYPE(
        _c.c_int, _c.c_void_p, _c.c_void_p, _c.c_void_p, _c.c_size_t,
        _c.c_void_p, _c.c_void_p, _c.c_size_t, _c.c_void_p, _c.c_void_p,
    ),
    "hipHostRegister": _c.CFUNCTYPE(_c.c_int, _c.c_void_p, _c.c_size_t, _c.c_uint),
    "hipHostUnregister": _c.CFUNCTYPE(_c.c_int, _c.c_void_p),
    "hipHostGetDevicePointer": _c.CFUNCTYPE(_c.c_int, _c.c_void_p, _c.c_void_p, _c.c_uint),
}
_OPTIONAL = {"hipMemcpyBatchAsync"}  # absent before ROCm 7.1 (vLLM #41737)


class SymbolTable(Protocol):
    """A loaded library: where it came from and the address of an exported symbol (None if absent)."""

    path: str

    def address(self, name: str) -> int | None:
        """The symbol's address, or None when the library does not export it."""
        ...


class SharedLibrary:
    """A library opened with ``dlopen`` (``ctypes.CDLL``)."""

    def __init__(self, library: ctypes.CDLL, path: str) -> None:
        self._library = library
        self.path = path

    def address(self, name: str) -> int | None:
        """``dlsym``: the symbol's address, or None when it is not exported."""
        try:
            function = getattr(self._library, name)
        except AttributeError:
            return None
        return ctypes.cast(function, ctypes.c_void_p).value


# --------------------------------------------------------------------------- finding the library
def library_directories(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Directories searched for ``libamdhip64``, in order, without duplicates.

    torch's ROCm wheels bundle the runtime in ``torch/lib``; then ``$ROCM_PATH/lib``, ``$HIP_PATH/lib``,
    ``/opt/rocm/lib``, each ``LD_LIBRARY_PATH`` entry and the usual system library directories.
    """
    env = os.environ if environ is None else environ
    found: list[Path] = []
    try:
        import torch

        found.append(Path(torch.__file__).parent / "lib")
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    for variable in ("ROCM_PATH", "HIP_PATH"):
        if env.get(variable):
            found.append(Path(env[variable]) / "lib")
    found.append(Path("/opt/rocm/lib"))
    found.extend(Path(p) for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p)
    found.extend(Path(p) for p in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib64", "/lib"))
    unique: list[Path] = []
    for path in found:
        if path not in unique:
            unique.append(path)
    return unique


def find_hip_library(
    directories: Sequence[Path] | None = None, exists: Callable[[Path], bool] = Path.exists
) -> tuple[Path | None, list[str]]:
    """Look for the runtime library on disk without loading it (the probe's check).

    Returns:
        ``(path or None, every path tried)``; names are tried in :data:`LIBRARY_NAMES` order.
    """
    tried: list[str] = []
    for name in LIBRARY_NAMES:
        for directory in library_directories() if directories is None else directories:
            candidate = directory / name
            tried.append(str(candidate))
            if exists(candidate):
                return candidate, tried
    return None, tried


def mapped_hip_libraries(maps_text: str | None = None) -> list[str]:
    """Paths of ``libamdhip64`` already mapped into this process (read from ``/proc/self/maps``).

    torch's HIP build loads its runtime at import; binding any other copy would give the process two
    HIP runtimes whose streams and registrations do not know each other, so that copy is loaded first.
    """
    if maps_text is None:
        try:
            maps_text = Path("/proc/self/maps").read_text()
        except OSError:
            return []
    found: list[str] = []
    for line in maps_text.splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if "libamdhip64" in Path(path).name and path not in found:
            found.append(path)
    return found


def load_hip_library(
    loader: Callable[[str], ctypes.CDLL] = ctypes.CDLL,
    directories: Sequence[Path] | None = None,
    exists: Callable[[Path], bool] = Path.exists,
    preferred: Sequence[str] = (),
) -> SharedLibrary:
    """``dlopen`` the HIP runtime: ``preferred`` paths first (the copy torch already mapped), then each
    name of :data:`LIBRARY_NAMES` in order, from the known directories, then by bare name through the
    dynamic linker.

    Raises:
        BackendUnavailableError: nothing loaded; the message lists every path tried and why it failed.
    """
    tried: list[str] = []
    attempts: list[str] = list(preferred)
    for name in LIBRARY_NAMES:
        attempts += [str(d / name) for d in (library_directories() if directories is None else directories)]
        attempts.append(name)
    for candidate in attempts:
        if "/" in candidate and not exists(Path(candidate)):
            tried.append(f"{candidate}: not present")
            continue
        try:
            return SharedLibrary(loader(candidate), candidate)
        except OSError as exc:
            where = "" if "/" in candidate else " (dynamic linker search)"
            tried.append(f"{candidate}{where}: {exc}")
    raise BackendUnavailableError(
        "the HIP runtime library could not be loaded; install ROCm or a ROCm build of torch, or set "
        "ROCM_PATH. Tried:\n  " + "\n  ".join(tried)
    )


# --------------------------------------------------------------------------- the binding
class HipRuntime:
    """The HIP runtime calls the ROCm backend makes (a ``CopyRuntime`` for the shared GPU layer).

    Args:
        library: a :class:`SymbolTable` (a ``dlopen``-ed ``libamdhip64``, or a test simulator).

    Raises:
        BackendUnavailableError: a required symbol is missing (names every one).
    """

    label = "HIP runtime"

    def __init__(self, library: SymbolTable) -> None:
        self.library = library
        self.path = library.path
        missing = [name for name in _PROTOTYPES if name not in _OPTIONAL and library.address(name) is None]
        if missing:
            raise BackendUnavailableError(f"{library.path} does not export {missing}; it is not a usable HIP runtime")
        self._functions = {}
        for name, prototype in _PROTOTYPES.items():
            address = library.address(name)
            if address is not None:
                self._functions[name] = prototype(address)
        # One attribute for the whole batch: read sources in stream order (a DMA engine allowed to read
        # early copies data before the kernel producing it finishes, vLLM #39306). Hints stay zero, as
        # in ROCm's own hip-tests. attrsIdxs holds numAttrs entries (CUDA cuMemcpyBatchAsync docs).
        self._stream_order = HipMemcpyAttributes(HIP_MEMCPY_SRC_ACCESS_ORDER_STREAM)
        self._attribute_index = (ctypes.c_size_t * 1)(0)

    @classmethod
    def load(
        cls, loader: Callable[[str], ctypes.CDLL] = ctypes.CDLL, directories: Sequence[Path] | None = None
    ) -> HipRuntime:
        """Load ``libamdhip64`` (the copy torch mapped, if any; see :func:`load_hip_library`) and bind it.

        Raises:
            BackendUnavailableError: the library was not found or is not a HIP runtime.
        """
        return cls(load_hip_library(loader, directories, preferred=mapped_hip_libraries()))

    # ----------------------------------------------------------------- errors and versions
    def error_name(self, code: int) -> str:
        """HIP's symbolic name for ``code`` (``hipGetErrorName``)."""
        pointer = self._functions["hipGetErrorName"](code)
        return ctypes.string_at(pointer).decode(errors="replace") if pointer else f"hipError_t({code})"

    def _check(self, call: str, status: int, detail: str = "", index: int | None = None) -> None:
        if status != HIP_SUCCESS:
            raise DeviceRuntimeError(call, status, self.error_name(status), detail, index)

    def runtime_version(self) -> int:
        """``hipRuntimeGetVersion``: major*10,000,000 + minor*100,000 + patch.

        Raises:
            DeviceRuntimeError: the call failed.
        """
        version = ctypes.c_int(0)
        self._check("hipRuntimeGetVersion", self._functions["hipRuntimeGetVersion"](ctypes.addressof(version)))
        return version.value

    def has_batch_copy(self) -> bool:
        """Whether ``hipMemcpyBatchAsync`` is exported (ROCm 7.1 and later)."""
        return "hipMemcpyBatchAsync" in self._functions

    def is_context_lost(self, error: DeviceRuntimeError) -> bool:
        """Whether ``error`` means the runtime or its context is gone (deinitialized, destroyed)."""
        return error.code in _CONTEXT_LOST

    # ----------------------------------------------------------------- copies
    def copy_batch(self, batch: SwapBatch, stream: int, *, use_attributes: bool) -> None:
        """One ``hipMemcpyBatchAsync`` over the batch's descriptor tensors, passed by ``data_ptr()``.

        Args:
            batch: at most :data:`MAX_BATCH_DESCRIPTORS` validated descriptors (int64 arrays share the
                layout of ``void*`` and ``size_t`` arrays on 64-bit Linux). Zero-byte descriptors are
                left out, vectorized; an error's index is still in the numbering of ``batch``.
            stream: the ``hipStream_t`` handle.
            use_attributes: pass one attribute (source read in stream order) for every copy; only where
                the runtime accepts attributes (7.13+; 7.2.1-7.2.3 return 801, ROCm/clr #273).

        Raises:
            InvalidArgumentError: more descriptors than the cap (the caller must chunk), or no symbol.
            DeviceRuntimeError: the call failed; ``index`` is the failing descriptor the runtime named.
        """
        function = self._functions.get("hipMemcpyBatchAsync")
        if function is None:
            raise InvalidArgumentError(f"{self.path} has no hipMemcpyBatchAsync (ROCm < 7.1); use copy_each")
        if batch.count > MAX_BATCH_DESCRIPTORS:
            raise InvalidArgumentError(
                f"hipMemcpyBatchAsync given {batch.count} descriptors; more than {MAX_BATCH_DESCRIPTORS} fault the "
                "GPU (vLLM #43018; rocm-systems #9915), chunk the batch first"
            )
        # Zero-byte copies move nothing and HIP documents nothing about them in a batch: leave them out.
        dst, src, sizes, positions = nonempty_descriptors(batch)
        count = int(sizes.numel())
        if count == 0:
            return
        fail_index = ctypes.c_size_t(SIZE_MAX)
        if use_attributes:
            attrs, attr_index, num_attrs = (
                ctypes.addressof(self._stream_order),
                ctypes.addressof(self._attribute_index),
                1,
            )
        else:
            attrs, attr_index, num_attrs = None, None, 0
        status = function(
            dst.data_ptr(), src.data_ptr(), sizes.data_ptr(), count,
            attrs, attr_index, num_attrs, ctypes.addressof(fail_index), stream,
        )
        if status != HIP_SUCCESS:
            index = descriptor_index(fail_index.value, count, positions)
            detail = f"{count} copies on stream {stream:#x}" + (
                "" if index is None else f"; the runtime stopped at copy {index}"
            )
            self._check("hipMemcpyBatchAsync", status, detail, index)

    def copy_each(self, batch: SwapBatch, stream: int) -> None:
        """One ``hipMemcpyAsync`` (``hipMemcpyDefault``) per non-empty descriptor: the fallback before ROCm 7.1.

        Raises:
            DeviceRuntimeError: naming the failing descriptor; the ones before it were enqueued.
        """
        memcpy = self._functions["hipMemcpyAsync"]
        dst, src, sizes, positions = nonempty_descriptors(batch)
        for i, (d, s, n) in enumerate(zip(dst.tolist(), src.tolist(), sizes.tolist(), strict=True)):
            status = memcpy(d, s, n, HIP_MEMCPY_DEFAULT, stream)
            if status != HIP_SUCCESS:
                index = descriptor_index(i, len(dst), positions)
                self._check(
                    "hipMemcpyAsync", status,
                    f"{n} bytes {s:#x} -> {d:#x}; descriptors before {index} were already enqueued", index,
                )

    # ----------------------------------------------------------------- host registration
    def register_host(self, address: int, size: int) -> int:
        """``hipHostRegister`` (mapped, portable), then ``hipHostGetDevicePointer`` for the alias.

        Returns:
            The device address of ``address``; on MI355X it differs from the host address (SGLang
            #33968, #35233), so kernels must use it, while runtime copies take the host address.

        Raises:
            DeviceRuntimeError: registration, or the alias query (after which the range is released).
        """
        flags = HIP_HOST_REGISTER_MAPPED | HIP_HOST_REGISTER_PORTABLE
        status = self._functions["hipHostRegister"](address, size, flags)
        self._check("hipHostRegister", status, f"{size} bytes at {address:#x}")
        alias = ctypes.c_void_p(0)
        status = self._functions["hipHostGetDevicePointer"](ctypes.addressof(alias), address, 0)
        if status != HIP_SUCCESS:
            try:
                self.unregister_host(address)
            except DeviceRuntimeError:
                log.exception("releasing %#x after a failed hipHostGetDevicePointer", address)
            self._check("hipHostGetDevicePointer", status, f"host address {address:#x} (registration released)")
        return int(alias.value or 0)

    def unregister_host(self, address: int) -> None:
        """``hipHostUnregister``.

        Raises:
            DeviceRuntimeError: the call failed (``is_context_lost`` tells teardown to tolerate it).
        """
        self._check("hipHostUnregister", self._functions["hipHostUnregister"](address), f"host address {address:#x}")

