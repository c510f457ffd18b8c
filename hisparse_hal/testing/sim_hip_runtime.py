"""SIMULATOR: a simulated HIP runtime (libamdhip64) for CPU-only tests. It is NOT AMD software.

It exports C-callable functions with HIP's signatures (ctypes callbacks), so the real ``HipRuntime``
binding drives it through the same C ABI as the real library. Copies move REAL host bytes
(``ctypes.memmove``) when the stream is synchronized. Each ROCm release behaves as documented:
7.0 has no hipMemcpyBatchAsync (vLLM #41737); 7.1 ignores copy attributes (vLLM #41737); 7.2.x return
hipErrorNotSupported (801) for numAttrs > 0 (ROCm/clr #273) and break IPC events after 32 record/wait
cycles (vLLM #57602); 7.13 accepts attributes; 7.14 batches for real. More than 8,192 copies in one
batch call fault the simulated GPU, stickily (vLLM #43018). Registered host memory gets a device alias
at host + ``alias_offset``: runtime copies must use host addresses, simulated kernels must use the
alias (SGLang #35233). Proves the backend's logic, never AMD hardware.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import itertools
import os
from collections import Counter
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any

import torch

from hisparse_hal.capabilities import Capabilities
from hisparse_hal.testing.sim_device_module import SimulatedDeviceModule
from hisparse_hal.vendors.rocm.capabilities import ROCM_RELEASE_HIP_VERSIONS, hip_version, plan_capabilities
from hisparse_hal.vendors.rocm.runtime import _PROTOTYPES, HipMemcpyAttributes, HipRuntime

__all__ = [
    "SimulatedRelease",
    "RELEASES",
    "SimulatedGpuFault",
    "SimulatedHipRuntime",
    "SimulatedIpcRing",
    "simulated_rocm_backend",
]

HIP_SUCCESS = 0
HIP_ERROR_INVALID_VALUE = 1
HIP_ERROR_OUT_OF_MEMORY = 2
HIP_ERROR_DEINITIALIZED = 4
HIP_ERROR_ILLEGAL_ADDRESS = 700
HIP_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712
HIP_ERROR_HOST_MEMORY_NOT_REGISTERED = 713
HIP_ERROR_NOT_SUPPORTED = 801
HIP_ERROR_UNKNOWN = 999
_NAMES = {
    0: "hipSuccess", 1: "hipErrorInvalidValue", 2: "hipErrorOutOfMemory", 4: "hipErrorDeinitialized",
    700: "hipErrorIllegalAddress", 712: "hipErrorHostMemoryAlreadyRegistered",
    713: "hipErrorHostMemoryNotRegistered", 801: "hipErrorNotSupported",
}
SIZE_MAX = (1 << 64) - 1
#: The batch size above which the simulated GPU faults (vLLM #43018; rocm-systems #9915).
BATCH_FAULT_ABOVE = 8192


@dataclasses.dataclass(frozen=True)
class SimulatedRelease:
    """How one ROCm release's HIP runtime behaves in the simulation.

    ``attributes``: ``"ignored"`` (accepted, no effect), ``"rejected"`` (801) or ``"accepted"``
    (validated and honoured). Patch numbers come from ``ROCM_RELEASE_HIP_VERSIONS`` where a source gives
    them; the others are illustrative (the decisions they feed depend only on major and minor).
    """

    label: str
    version: int
    batch_symbol: bool
    attributes: str
    internal_loop: bool
    ipc_ring_slots: int | None


RELEASES = {
    "7.0": SimulatedRelease("7.0", hip_version(7, 0, 0), False, "n/a", True, None),
    "7.1": SimulatedRelease("7.1", ROCM_RELEASE_HIP_VERSIONS["7.1.0"], True, "ignored", True, None),
    "7.2.0": SimulatedRelease("7.2.0", ROCM_RELEASE_HIP_VERSIONS["7.2.0"], True, "rejected", True, 32),
    "7.2.1": SimulatedRelease("7.2.1", ROCM_RELEASE_HIP_VERSIONS["7.2.1"], True, "rejected", True, 32),
    # 7.2.3's HIP patch is not published in our sources; HIP only bumps it on runtime changes (ROCm/hip #3703).
    "7.2.3": SimulatedRelease("7.2.3", ROCM_RELEASE_HIP_VERSIONS["7.2.1"], True, "rejected", True, 32),
    "7.13": SimulatedRelease("7.13", hip_version(7, 13, 0), True, "accepted", True, None),
    "7.14": SimulatedRelease("7.14", ROCM_RELEASE_HIP_VERSIONS["7.14.0"], True, "accepted", False, None),
}


class SimulatedGpuFault(RuntimeError):
    """What the simulated GPU raises where a real one would report 'Memory access fault by GPU'."""


@dataclasses.dataclass
class _Registration:
    size: int
    alias: int
    flags: int


class SimulatedHipRuntime:
    """A SIMULATED HIP runtime with a memory model: device allocations, registered host ranges and
    their aliases, and per-stream queues of copies that run at :meth:`synchronize`.

    Args:
        release: a key of :data:`RELEASES`.
        alias_offset: device alias = host address + this (0 models systems where they coincide).
        fail_register_on_call: the n-th ``hipHostRegister`` call (1-based) returns hipErrorOutOfMemory.
        fail_device_pointer_on_call: the n-th ``hipHostGetDevicePointer`` call returns hipErrorInvalidValue.
        fail_unregister_on_calls: the ``hipHostUnregister`` calls (1-based) that return hipErrorUnknown and
            leave the range registered.
        unknown_memory_is_device: treat memory never adopted nor registered as device memory (for suites
            that allocate "device" tensors on the CPU without telling the simulator); aliases still fail.
        run_copies_immediately: copy at enqueue instead of at :meth:`synchronize` (for callers whose
            synchronize is a no-op on the CPU device).
    """

    def __init__(
        self,
        release: str = "7.14",
        *,
        alias_offset: int = 1 << 47,
        fail_register_on_call: int | None = None,
        fail_device_pointer_on_call: int | None = None,
        fail_unregister_on_calls: Collection[int] = (),
        unknown_memory_is_device: bool = False,
        run_copies_immediately: bool = False,
    ) -> None:
        self.release = RELEASES[release]
        self.unknown_memory_is_device = unknown_memory_is_device
        self.run_copies_immediately = run_copies_immediately
        self.alias_offset = alias_offset
        self.fail_register_on_call = fail_register_on_call
        self.fail_device_pointer_on_call = fail_device_pointer_on_call
        self.fail_unregister_on_calls = frozenset(fail_unregister_on_calls)
        self.calls: Counter[str] = Counter()
        self.batch_sizes: list[int] = []
        self.batch_attribute_orders: list[tuple[int, ...]] = []
        self.copy_log: list[tuple[str, int, int, int]] = []  # (call, dst, src, size) as enqueued
        self.registrations: dict[int, _Registration] = {}
        self.device_memory: list[tuple[int, int, str]] = []
        self.pending: dict[int, list[tuple[int, int, int]]] = {}
        self.faulted = False
        self.shut_down = False
        self.last_error_detail = ""
        self._names = {code: ctypes.create_string_buffer(name.encode()) for code, name in _NAMES.items()}
        self._unknown_name = ctypes.create_string_buffer(b"hipErrorUnknown")
        self._callbacks = {
            "hipRuntimeGetVersion": self._runtime_get_version,
            "hipGetErrorName": self._get_error_name,
            "hipMemcpyAsync": self._memcpy_async,
            "hipMemcpyBatchAsync": self._memcpy_batch_async,
            "hipHostRegister": self._host_register,
            "hipHostUnregister": self._host_unregister,
            "hipHostGetDevicePointer": self._host_get_device_pointer,
        }
        if not self.release.batch_symbol:
            del self._callbacks["hipMemcpyBatchAsync"]
        #: Python exceptions raised inside a simulated C function (ctypes would otherwise print them and
        #: return 0, which reads as hipSuccess). Tests assert this stays empty.
        self.callback_errors: list[str] = []
        # C function pointers, kept alive as long as the simulator.
        self._c_functions = {name: _PROTOTYPES[name](self._guard(name, fn)) for name, fn in self._callbacks.items()}
        self.path = f"<SIMULATED libamdhip64, ROCm {self.release.label}>"

    def _guard(self, name: str, function):
        def guarded(*args):
            try:
                return function(*args)
            except Exception as exc:  # noqa: BLE001 - surfaced through callback_errors and hipErrorUnknown
                self.callback_errors.append(f"{name}: {type(exc).__name__}: {exc}")
                return 0 if name == "hipGetErrorName" else HIP_ERROR_UNKNOWN

        return guarded

    # ----------------------------------------------------------------- the library face
    def address(self, name: str) -> int | None:
        """``dlsym`` on the simulated library: the C function's address, None if not exported."""
        function = self._c_functions.get(name)
        return None if function is None else ctypes.cast(function, ctypes.c_void_p).value

    def runtime(self) -> HipRuntime:
        """The real binding, bound to this simulator."""
        return HipRuntime(self)

    # ----------------------------------------------------------------- memory model
    def adopt_device_memory(self, tensor: torch.Tensor, label: str = "device") -> None:
        """Declare a (CPU) tensor's bytes to be simulated device memory."""
        self.device_memory.append((tensor.data_ptr(), tensor.numel() * tensor.element_size(), label))

    def _classify(self, address: int, size: int) -> str:
        end = address + size
        for start, reg in self.registrations.items():
            if start <= address and end <= start + reg.size:
                return "host"
            if reg.alias <= address and end <= reg.alias + reg.size:
                return "alias"
        for start, length, _label in self.device_memory:
            if start <= address and end <= start + length:
                return "device"
        return "device" if self.unknown_memory_is_device else "unknown"

    def _copy_error(self, dst: int, src: int, size: int) -> str | None:
        for side, address in (("source", src), ("destination", dst)):
            kind = self._classify(address, size)
            if kind == "alias":
                return (f"{side} {address:#x} is the device alias of registered host memory; "
                        "runtime copies take the host address")
            if kind == "unknown":
                return f"{side} [{address:#x}, +{size}) is neither simulated device memory nor registered host memory"
        return None

    def synchronize(self, stream: int | None = None) -> None:
        """Run the queued copies of ``stream`` (every stream when None) in order, moving real bytes."""
        for handle in list(self.pending) if stream is None else [stream]:
            for dst, src, size in self.pending.pop(handle, []):
                ctypes.memmove(dst, src, size)

    def kernel_read(self, address: int, size: int) -> bytes:
        """What a simulated GPU kernel dereferencing ``address`` reads: device memory or a host alias.

        Raises:
            SimulatedGpuFault: a host address of registered memory (the MI355X fault of SGLang #33968),
                or any address the device cannot see.
        """
        kind = self._classify(address, size)
        if kind == "device":
            return ctypes.string_at(address, size)
        if kind == "alias":
            for start, reg in self.registrations.items():
                if reg.alias <= address < reg.alias + reg.size:
                    return ctypes.string_at(start + (address - reg.alias), size)
        raise SimulatedGpuFault(
            f"Memory access fault by GPU on address {address:#x} ({kind} address given to a kernel)"
        )

    def shutdown(self) -> None:
        """Model interpreter exit: every later call returns hipErrorDeinitialized."""
        self.shut_down = True

    def _status(self) -> int | None:
        if self.shut_down:
            return HIP_ERROR_DEINITIALIZED
        if self.faulted:
            return HIP_ERROR_ILLEGAL_ADDRESS
        return None

    # ----------------------------------------------------------------- the C functions
    def _runtime_get_version(self, out: int) -> int:
        self.calls["hipRuntimeGetVersion"] += 1
        ctypes.c_int.from_address(out).value = self.release.version
        return HIP_SUCCESS

    def _get_error_name(self, code: int) -> int:
        return ctypes.addressof(self._names.get(code, self._unknown_name))

    def _memcpy_async(self, dst: int | None, src: int | None, size: int, kind: int, stream: int | None) -> int:
        self.calls["hipMemcpyAsync"] += 1
        status = self._status()
        if status is not None:
            return status
        if kind != 4:
            self.last_error_detail = f"kind {kind} is not hipMemcpyDefault"
            return HIP_ERROR_INVALID_VALUE
        problem = self._copy_error(dst or 0, src or 0, size)
        if problem:
            self.last_error_detail = problem
            return HIP_ERROR_INVALID_VALUE
        self.copy_log.append(("hipMemcpyAsync", dst or 0, src or 0, size))
        self._enqueue(stream or 0, [(dst or 0, src or 0, size)])
        return HIP_SUCCESS

    def _enqueue(self, stream: int, copies: list[tuple[int, int, int]]) -> None:
        self.pending.setdefault(stream, []).extend(copies)
        if self.run_copies_immediately:
            self.synchronize(stream)

    def _memcpy_batch_async(
        self, dsts: int | None, srcs: int | None, sizes: int | None, count: int,
        attrs: int | None, attrs_idxs: int | None, num_attrs: int, fail_idx: int | None, stream: int | None,
    ) -> int:
        self.calls["hipMemcpyBatchAsync"] += 1
        if fail_idx:
            ctypes.c_size_t.from_address(fail_idx).value = SIZE_MAX
        status = self._status()
        if status is not None:
            return status
        if count > BATCH_FAULT_ABOVE:
            self.faulted = True  # the GPU is gone for this process, as on the real fault
            self.last_error_detail = f"{count} copies in one batch faulted the simulated GPU"
            return HIP_ERROR_ILLEGAL_ADDRESS
        if count == 0:
            return HIP_SUCCESS
        if not (dsts and srcs and sizes):
            return HIP_ERROR_INVALID_VALUE
        orders: tuple[int, ...] = ()
        if num_attrs:
            if self.release.attributes == "rejected":
                self.last_error_detail = "numAttrs > 0 is not supported on this release (ROCm/clr #273)"
                return HIP_ERROR_NOT_SUPPORTED
            if self.release.attributes == "accepted":
                checked = self._check_attributes(attrs, attrs_idxs, num_attrs, count)
                if checked is None:
                    return HIP_ERROR_INVALID_VALUE
                orders = checked
        dst_list = list((ctypes.c_uint64 * count).from_address(dsts))
        src_list = list((ctypes.c_uint64 * count).from_address(srcs))
        size_list = list((ctypes.c_uint64 * count).from_address(sizes))
        queued: list[tuple[int, int, int]] = []
        for i, (dst, src, size) in enumerate(zip(dst_list, src_list, size_list, strict=True)):
            problem = self._copy_error(dst, src, size)
            if problem:
                self.last_error_detail = f"copy {i}: {problem}"
                if fail_idx:
                    ctypes.c_size_t.from_address(fail_idx).value = i
                if self.release.internal_loop:  # the per-copy loop already enqueued the earlier copies
                    self._enqueue(stream or 0, queued)
                return HIP_ERROR_INVALID_VALUE
            queued.append((dst, src, size))
        self.batch_sizes.append(count)
        self.batch_attribute_orders.append(orders)
        self.copy_log.extend(("hipMemcpyBatchAsync", d, s, n) for d, s, n in queued)
        self._enqueue(stream or 0, queued)
        return HIP_SUCCESS

    def _check_attributes(
        self, attrs: int | None, attrs_idxs: int | None, num_attrs: int, count: int
    ) -> tuple[int, ...] | None:
        if not attrs or not attrs_idxs or num_attrs > count:
            self.last_error_detail = "attrs/attrsIdxs missing or more attributes than copies"
            return None
        entries = (HipMemcpyAttributes * num_attrs).from_address(attrs)
        starts = list((ctypes.c_size_t * num_attrs).from_address(attrs_idxs))
        if starts[0] != 0 or any(b <= a for a, b in itertools.pairwise(starts)) or starts[-1] >= count:
            self.last_error_detail = f"attrsIdxs {starts} must start at 0 and increase below {count}"
            return None
        if any(not 1 <= entry.srcAccessOrder <= 3 for entry in entries):
            self.last_error_detail = "srcAccessOrder must be Stream, DuringApiCall or Any"
            return None
        bounds = [*starts, count]
        return tuple(entries[k].srcAccessOrder for k in range(num_attrs) for _ in range(bounds[k], bounds[k + 1]))

    def _host_register(self, address: int | None, size: int, flags: int) -> int:
        self.calls["hipHostRegister"] += 1
        status = self._status()
        if status is not None:
            return status
        if self.fail_register_on_call == self.calls["hipHostRegister"]:
            self.last_error_detail = "injected registration failure"
            return HIP_ERROR_OUT_OF_MEMORY
        address = address or 0
        for start, reg in self.registrations.items():
            if address < start + reg.size and start < address + size:
                return HIP_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        self.registrations[address] = _Registration(size, address + self.alias_offset, flags)
        return HIP_SUCCESS

    def _host_unregister(self, address: int | None) -> int:
        self.calls["hipHostUnregister"] += 1
        status = self._status()
        if status is not None:
            return status
        if self.calls["hipHostUnregister"] in self.fail_unregister_on_calls:
            self.last_error_detail = "injected unregistration failure"
            return HIP_ERROR_UNKNOWN
        if self.registrations.pop(address or 0, None) is None:
            return HIP_ERROR_HOST_MEMORY_NOT_REGISTERED
        return HIP_SUCCESS

    def _host_get_device_pointer(self, out: int, host: int | None, flags: int) -> int:
        self.calls["hipHostGetDevicePointer"] += 1
        status = self._status()
        if status is not None:
            return status
        if self.fail_device_pointer_on_call == self.calls["hipHostGetDevicePointer"]:
            return HIP_ERROR_INVALID_VALUE
        for start, reg in self.registrations.items():
            if start <= (host or 0) < start + reg.size:
                ctypes.c_void_p.from_address(out).value = reg.alias + ((host or 0) - start)
                return HIP_SUCCESS
        return HIP_ERROR_INVALID_VALUE


class SimulatedIpcRing:
    """SIMULATED ROCm 7.2.x IPC event: a ring of ``slots`` signals indexed without the modulo, so the
    33rd record makes later waits read past the ring and stop blocking, silently (rocm-systems #11511).

    Stands in for ``torch.cuda.Event(interprocess=True)`` (``record``, ``wait``, ``query``,
    ``ipc_handle``, ``from_ipc_handle``).
    """

    def __init__(self, slots: int | None = 32) -> None:
        self.slots = slots
        self.records = 0
        self.waits = 0
        self.broken = False

    def event_class(self) -> type:
        """A class with torch.cuda.Event's constructor shape, bound to this ring."""
        ring = self

        class _Event:
            def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
                self.ring = ring

            @classmethod
            def from_ipc_handle(cls, device: object, handle: bytes) -> _Event:
                return cls(interprocess=True)

            def ipc_handle(self) -> bytes:
                return b"\x5a" * 64

            def record(self, stream: object | None = None) -> None:
                ring.records += 1
                if ring.slots is not None and ring.records > ring.slots:
                    ring.broken = True

            def wait(self, stream: object | None = None) -> None:
                ring.waits += 1

            def query(self) -> bool:
                return True

        return _Event


class _SimulatedRocmBackendMixin:
    """Test-only: the device module is a :class:`SimulatedDeviceModule` on the simulator's stream whose
    synchronisation lands every queued copy; ``simulated_stream`` and ``simulated_capturing`` reach into it."""

    simulator: SimulatedHipRuntime  # set by simulated_rocm_backend
    device_module: Any  # a SimulatedDeviceModule, set by simulated_rocm_backend

    if TYPE_CHECKING:  # provided by the backend class this is mixed into (TorchGpuBackend)
        def device_address_of_host(self, host_tensor: torch.Tensor) -> int: ...

    @property
    def simulated_stream(self) -> int:
        """The raw stream handle swaps are enqueued on."""
        return int(self.device_module.stream)

    @simulated_stream.setter
    def simulated_stream(self, value: int) -> None:
        self.device_module.stream = value

    @property
    def simulated_capturing(self) -> bool:
        """What ``is_current_stream_capturing`` answers."""
        return bool(self.device_module.capturing)

    @simulated_capturing.setter
    def simulated_capturing(self, value: bool) -> None:
        self.device_module.capturing = value

    def device_view_of_host(self, host_tensor: torch.Tensor) -> torch.Tensor:
        """Simulated kernels run on the CPU, where only the host address is readable: resolve the real device
        address (the registration's alias), check that the simulated GPU reads the tensor's bytes there, and
        hand the kernels the host tensor itself."""
        address = self.device_address_of_host(host_tensor)
        nbytes = min(host_tensor.numel() * host_tensor.element_size(), 4096)
        seen = self.simulator.kernel_read(address, nbytes) if nbytes else b""
        if seen != ctypes.string_at(host_tensor.data_ptr(), nbytes):
            host = host_tensor.data_ptr()
            raise AssertionError(f"device address {address:#x} does not alias host memory at {host:#x}")
        return host_tensor


def simulated_rocm_backend(
    sim: SimulatedHipRuntime,
    arch: str = "gfx942:sramecc+:xnack-",
    *,
    capabilities: Capabilities | None = None,
    stream: int = 0x5000,
):
    """A real ``RocmBackend`` on the CPU device, driving ``sim`` through the real ``HipRuntime``."""
    from hisparse_hal.vendors.rocm.backend import RocmBackend

    class SimulatedRocmBackend(_SimulatedRocmBackendMixin, RocmBackend):
        pass

    runtime = sim.runtime()
    caps = capabilities or plan_capabilities(runtime.runtime_version(), arch, batch_symbol=runtime.has_batch_copy())
    # A device synchronisation is what it is on a real GPU: every queued copy lands.
    device_module = SimulatedDeviceModule(stream, on_synchronize=sim.synchronize)
    backend = SimulatedRocmBackend(caps, runtime, 0, device=torch.device("cpu"), device_module=device_module)
    backend.simulator = sim
    return backend


@contextlib.contextmanager
def capturing(backend) -> Iterator[None]:
    """Make the simulated backend report a capture in progress for the block."""
    backend.simulated_capturing = True
    try:
        yield
    finally:
        backend.simulated_capturing = False


def conformance_backend(release: str | None = None, arch: str | None = None) -> object:
    """A SIMULATED ROCm backend for running the conformance suite on the CPU (``--factory``).

    ``release`` and ``arch`` default to ``$SIM_HIP_RELEASE`` (7.14) and ``$SIM_HIP_ARCH`` (gfx950), which
    reach the suite's worker processes too.

    Graph capture and IPC events go through torch's device module, which this simulation does not provide, so
    they are declared absent and the suite skips those tiers; everything else runs through the real
    ``RocmBackend`` and ``HipRuntime`` against :class:`SimulatedHipRuntime`.
    """
    release = release or os.environ.get("SIM_HIP_RELEASE", "7.14")
    arch = arch or os.environ.get("SIM_HIP_ARCH", "gfx950")
    sim = SimulatedHipRuntime(release, unknown_memory_is_device=True, run_copies_immediately=True)
    backend = simulated_rocm_backend(sim, arch)
    backend._capabilities = dataclasses.replace(
        backend.capabilities, graph_capture=False, ipc_events=False, shared_host_pool=False,
        # The simulated GPU runs kernels on the CPU: the torch cache ops run there, Triton would need its
        # interpreter (about a second per generated sequence, too slow for the suite's 2,000).
        cache_ops="torch",
        reasons={
            **backend.capabilities.reasons,
            "graph_capture": f"SIMULATED HIP runtime (ROCm {release}): capture not simulated",
            "ipc_events": f"SIMULATED HIP runtime (ROCm {release}): IPC events not simulated",
            "shared_host_pool": f"SIMULATED HIP runtime (ROCm {release}): no IPC events to share a pool with",
            "cache_ops": "torch (the SIMULATED GPU runs kernels on the CPU)",
        },
    )
    backend.simulator = sim
    return backend
