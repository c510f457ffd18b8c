"""The GPU backend CUDA and ROCm share through torch's device module for their device, written once.

A vendor subclass supplies a :class:`~hisparse_hal.vendors.gpu.runtime.CopyRuntime` (its binding to libcuda
or libamdhip64) and its ``Capabilities``; this layer picks the copy path per swap (native batch or per-copy
loop), chunks at the descriptor cap, pins through the runtime, captures into the device module's graph and
carries IPC events, all through :mod:`.device_module`. Invariant: no device call is made for work that has
already been rejected.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections.abc import Iterator
from typing import ClassVar

import torch

from hisparse_hal.backend import HiSparseBackend
from hisparse_hal.cache_ops.selection import with_cache_ops
from hisparse_hal.capabilities import Capabilities
from hisparse_hal.errors import (
    CaptureMisuseError,
    DeviceRuntimeError,
    InvalidArgumentError,
    InvalidDescriptorError,
    UnsupportedCapabilityError,
)
from hisparse_hal.events import HalEvent, check_timeout_s
from hisparse_hal.gather import gather_rows, new_fault_record, raise_recorded_fault
from hisparse_hal.regions import SwapBatch
from hisparse_hal.settings import event_timeout_s as event_timeout_s_from_env

from .device_module import GpuDeviceModule, device_module_for
from .events import GpuIpcEvent, decode_event_handle, encode_event_handle
from .gather_check import TritonIdCheck, triton_check_available
from .graph import GpuCapturedGraph
from .host_aliases import HostAliasMap
from .runtime import CopyRuntime

__all__ = ["TorchGpuBackend", "LEGACY_DEFAULT_STREAM", "BATCH_COPY_MODES"]

log = logging.getLogger(__name__)

#: The legacy default stream's handle (``cudaStreamLegacy`` as torch reports the default stream).
LEGACY_DEFAULT_STREAM = 0
BATCH_COPY_MODES = ("auto", "loop")


class TorchGpuBackend(HiSparseBackend):
    """The shared GPU backend: streams, graphs and events from the device's torch module, copies from a runtime.

    Args:
        capabilities: the vendor's ``plan_capabilities`` result for this device.
        runtime: the vendor binding (:class:`CopyRuntime`).
        device_index: the GPU ordinal (after ``CUDA_VISIBLE_DEVICES``/``HIP_VISIBLE_DEVICES``).
        device: where KV caches live; defaults to ``torch.device(device_type, device_index)``. Tests inject
            ``torch.device("cpu")`` with a simulated runtime.
        event_timeout_s: default bound of :meth:`GpuIpcEvent.synchronize`; None reads
            ``HISPARSE_HAL_EVENT_TIMEOUT_S`` (default 30 s), as the CPU device does.
        device_module: what this layer asks of torch for the device (streams, synchronisation, capture state,
            graphs, IPC events); default :func:`~.device_module.device_module_for` of ``device``. Simulators
            pass a stand-in (``hisparse_hal.testing.sim_device_module``).

    Swaps inside a graph capture are captured, never batched: the driver has no graph-node form of
    ``cuMemcpyBatchAsync`` (cuda-python ``cuda.core.utils.copy_batch`` docs), while each per-copy
    ``cuMemcpyAsync``/``hipMemcpyAsync`` becomes a memcpy node. A capturing swap that touches an
    explicit host region (possibly pageable, which a capture cannot hold) is rejected with
    ``CaptureMisuseError`` before any device call, so the capture stays valid. Pinning and unpinning
    while capturing are rejected the same way.
    """

    name = "gpu"
    #: torch's device type of the GPU: ``"cuda"`` on torch's CUDA and HIP builds alike.
    device_type: ClassVar[str] = "cuda"

    def __init__(
        self,
        capabilities: Capabilities,
        runtime: CopyRuntime,
        device_index: int,
        *,
        device: torch.device | None = None,
        event_timeout_s: float | None = None,
        device_module: GpuDeviceModule | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(device_index, int) or isinstance(device_index, bool) or device_index < 0:
            raise InvalidArgumentError(f"device_index must be an int >= 0, got {device_index!r}")
        # The one place the GPU backends choose their cache-ops implementation: by whether triton imports,
        # for the backend's GPU (not an injected test device), never by vendor.
        self._capabilities = with_cache_ops(capabilities, torch.device(self.device_type, device_index))
        self.runtime = runtime
        self.device_index = device_index
        self._device = device if device is not None else torch.device(self.device_type, device_index)
        #: torch's API for this device (:mod:`.device_module`): every stream, sync, graph and event call goes here.
        self.device_module = device_module if device_module is not None else device_module_for(self._device)
        self.event_timeout_s = (event_timeout_s_from_env() if event_timeout_s is None
                                else check_timeout_s(event_timeout_s, "event_timeout_s"))
        self._batch_copy_mode = "auto"
        #: The copy path of the last swap: ``"batch"`` or ``"loop"`` (for tests, benchmarks, logs).
        self.last_swap_path: str | None = None
        # Where gathers record an out-of-range id (device memory) and the fused check that writes it: made
        # here, never inside a capture (only a torch without this device defers them to the first gather).
        self._fault_record: torch.Tensor | None = None
        #: The gathers' fused device-side id check: two Triton launches where triton runs on this GPU, else
        #: None and the torch ops of :func:`~hisparse_hal.gather.gather_rows` check. Tests may install one
        #: (on :attr:`gather_fault_record`) that runs under triton's interpreter.
        self.gather_id_check: TritonIdCheck | None = None
        if self._device.type != self.device_type or torch.accelerator.is_available():
            self._build_gather_check()
        self._alias_map: tuple[int, HostAliasMap] | None = None  # (pin generation, table)
        self._capturing = threading.local()  # .graph: the GpuCapturedGraph this thread is capturing into

    # ----------------------------------------------------------------- identity
    @property
    def device(self) -> torch.device:
        """The device this backend's KV caches live on."""
        return self._device

    @property
    def capabilities(self) -> Capabilities:
        """The capabilities planned for this device (fixed at construction)."""
        return self._capabilities

    @property
    def batch_copy_mode(self) -> str:
        """``"auto"`` (native batch where possible) or ``"loop"`` (always per copy; for comparisons)."""
        return self._batch_copy_mode

    @batch_copy_mode.setter
    def batch_copy_mode(self, mode: str) -> None:
        if mode not in BATCH_COPY_MODES:
            raise InvalidArgumentError(f"batch_copy_mode must be one of {BATCH_COPY_MODES}, got {mode!r}")
        self._batch_copy_mode = mode

    def _device_scope(self) -> contextlib.AbstractContextManager[object]:
        """Make this backend's GPU torch's current device for the block (no-op for an injected host device)."""
        return self.device_module.scope()

    # ----------------------------------------------------------------- swaps
    def _current_stream_handle(self) -> int:
        """The raw handle of torch's current stream on this device (0 is the legacy default stream)."""
        return self.device_module.current_stream_handle()

    def _swap_path(self, stream: int, capturing: bool) -> str:
        if self._batch_copy_mode == "loop" or self._capabilities.batch_copy == "loop":
            return "loop"
        if not self.runtime.has_batch_copy():
            return "loop"
        if stream == LEGACY_DEFAULT_STREAM:
            # The batch call rejects the legacy stream with an invalid-value error (vLLM
            # cache_kernels.cu; cudf #20800), so that stream gets the per-copy loop.
            return "loop"
        if capturing:
            # No graph-node form of the batch call exists (cuda-python cuda.core.utils.copy_batch).
            return "loop"
        return "batch"

    def _check_capturable(self, batch: SwapBatch) -> None:
        """Reject, before any device call, a capturing swap that touches an explicit host region."""
        unsafe = torch.tensor(
            [r.kind == "explicit" and r.device.type == "cpu" for r in batch.regions],
            dtype=torch.bool,
        )
        hit = unsafe[batch.src_region] | unsafe[batch.dst_region]
        if bool(hit.any()):
            i = int(hit.nonzero()[0])
            region = batch.regions[int(batch.src_region[i] if unsafe[batch.src_region[i]] else batch.dst_region[i])]
            raise CaptureMisuseError(
                f"swap descriptor {i} touches explicit host region {region.label!r}, which may be pageable "
                "and cannot be copied inside a graph capture; pin it with pin_tensor, or swap outside "
                "the capture. Nothing was enqueued and the capture is still valid"
            )

    def _enqueue_swap(self, batch: SwapBatch) -> None:
        capturing = self.is_current_stream_capturing()
        if capturing:
            self._check_capturable(batch)
            graph = getattr(self._capturing, "graph", None)
            if graph is not None:
                used = torch.unique(torch.cat([batch.src_region, batch.dst_region])).tolist()
                graph.regions.update(batch.regions[i] for i in used)
        with self._device_scope():
            stream = self._current_stream_handle()
            path = self._swap_path(stream, capturing)
            self.last_swap_path = path
            if path == "loop":
                self.runtime.copy_each(batch, stream)
                return
            cap = self._capabilities.max_batch_descriptors
            use_attributes = self._capabilities.copy_attributes
            offset = 0
            for chunk in batch.chunks(cap):
                try:
                    self.runtime.copy_batch(chunk, stream, use_attributes=use_attributes)
                except DeviceRuntimeError as error:
                    raise _shift_error(error, offset) from error
                offset += chunk.count

    # ----------------------------------------------------------------- gathers
    def _build_gather_check(self) -> None:
        self._fault_record = new_fault_record(self._device)
        if self._device.type == self.device_type and triton_check_available(self._device):
            self.gather_id_check = TritonIdCheck(self._fault_record)

    @property
    def gather_fault_record(self) -> torch.Tensor:
        """The device-side record of the first out-of-range gather id (``int64[5]``, see
        :func:`~hisparse_hal.gather.new_fault_record`)."""
        if self._fault_record is None:
            self._build_gather_check()
        assert self._fault_record is not None
        return self._fault_record

    def gather_resident_rows(self, source: torch.Tensor, destination: torch.Tensor, row_ids: torch.Tensor) -> None:
        """One-pass gather (see the base class) that never reads back to the host, captured or not.

        Ids are range-checked on the device: an out-of-range id reads a clamped row (row 0 or the last
        row, never memory outside ``source``) and the first one is kept in a device-side record. The
        caller learns of it from :meth:`raise_gather_faults` (``InvalidArgumentError`` naming the id), which
        it calls where the step synchronizes anyway. Captured gathers check on every replay.

        Raises:
            InvalidArgumentError: bad types, devices or shapes (found on the host, before any device work).
        """
        self._check_gather_device(source, destination)
        record = self.gather_fault_record
        if self.gather_id_check is not None:
            gather_rows(source, destination, row_ids, device_check=self.gather_id_check)
        else:
            gather_rows(source, destination, row_ids, fault_record=record)

    def raise_gather_faults(self) -> None:
        """Read the device-side gather fault record (waits for the gathers before it on the current stream).

        Raises:
            InvalidArgumentError: naming the first out-of-range id since the last call (then cleared).
        """
        if self._fault_record is not None:
            raise_recorded_fault(self._fault_record)

    # ----------------------------------------------------------------- host pinning
    def pin_tensor(self, tensor: torch.Tensor) -> None:
        """Pin a host tensor through the runtime (chunked, rolled back on failure); see the base class.

        Raises:
            CaptureMisuseError: called while the current stream is capturing (host registration is not
                a capturable call); nothing was registered.
        """
        self._refuse_while_capturing("pin_tensor")
        with self._device_scope():
            super().pin_tensor(tensor)

    def unpin_tensor(self, tensor: torch.Tensor) -> None:
        """Release a pinned tensor chunk by chunk, after the device's queued copies (which may still write
        the pool) have landed; a lost device context is logged, not raised.

        Raises:
            CaptureMisuseError: called while the current stream is capturing; nothing was released.
        """
        self._refuse_while_capturing("unpin_tensor")
        with self._device_scope():
            super().unpin_tensor(tensor)

    # ----------------------------------------------------------------- device access to pinned host memory
    def device_address_of_host(self, host_tensor: torch.Tensor) -> int:
        """The address a kernel on this GPU uses for the first byte of ``host_tensor``.

        ``host_tensor`` must lie inside memory pinned with :meth:`pin_tensor` (a whole pinned tensor or a
        view into one, e.g. one layer of a host pool). Where ``capabilities.host_pointer_alias`` is True
        (ROCm: ``hipHostRegister`` memory may have a device address other than its host address, SGLang
        #33968/#35233; CUDA where device attribute 91 is unset: ``cuMemHostGetDevicePointer``) it is the
        registration's device alias plus the offset into the chunk; otherwise the
        host address itself (CUDA unified addressing).

        Raises:
            InvalidArgumentError: not a contiguous CPU tensor, or not inside this backend's pinned memory
                (or across two registration chunks whose aliases are not contiguous).
            UnsupportedCapabilityError: the registration recorded no device alias although the capability
                says one is needed.
        """
        if not isinstance(host_tensor, torch.Tensor) or host_tensor.device.type != "cpu":
            where = host_tensor.device if isinstance(host_tensor, torch.Tensor) else type(host_tensor).__name__
            raise InvalidArgumentError(f"device_view_of_host: expected a pinned CPU tensor, got {where}")
        if not host_tensor.is_contiguous():
            raise InvalidArgumentError(
                f"device_view_of_host: the host tensor must be contiguous, got strides {host_tensor.stride()}"
            )
        start = host_tensor.data_ptr()
        end = start + max(host_tensor.numel() * host_tensor.element_size(), 1)
        return self._host_aliases().translate_range(start, end, "device_view_of_host")

    def device_addresses(self, host_addresses: torch.Tensor) -> torch.Tensor:
        """Translate addresses inside pinned host tensors to the device addresses kernels must use.

        Where ``capabilities.host_pointer_alias`` is True the device address of registered host memory can
        differ from its host address (ROCm on MI355X, ROCm 7.2: SGLang #33968, #35233, #36966; CUDA where
        device attribute 91 is unset), and a kernel given the host address faults; otherwise each address is
        its own device address, and this only checks that it is pinned. Runtime copies
        (``swap_blocks_batch``) keep host addresses. Vectorized; the input is not modified.

        Args:
            host_addresses: 1-D int64 CPU tensor of addresses inside tensors pinned by this backend.

        Returns:
            An int64 tensor of the same shape with each address's device address.

        Raises:
            InvalidArgumentError: not a 1-D int64 CPU tensor, or an address outside every pinned tensor (the
                first is named).
            UnsupportedCapabilityError: a registration recorded no device alias although one is needed.
        """
        return self._host_aliases().translate(host_addresses, "device_addresses")

    def device_address(self, host_address: int) -> int:
        """The device address of one address inside a pinned host tensor (see :meth:`device_addresses`).

        Raises:
            InvalidArgumentError: the address is not inside a tensor pinned by this backend.
        """
        return int(self.device_addresses(torch.tensor([host_address], dtype=torch.int64))[0])

    def _host_aliases(self) -> HostAliasMap:
        """The translation table of the live registrations, rebuilt only after a pin or unpin (a pinned tensor
        whose memory moved is released first, so kernels are never given its old address)."""
        self._release_if_stale()
        generation = self.pin_generation  # read before the registrations: a racing pin only forces a rebuild
        cached = self._alias_map
        if cached is not None and cached[0] == generation:
            return cached[1]
        aliases = HostAliasMap(self.pinned_registrations(), self.name, self._capabilities.host_pointer_alias)
        self._alias_map = (generation, aliases)
        return aliases

    def device_view_of_host(self, host_tensor: torch.Tensor) -> torch.Tensor:
        """A tensor on this GPU that aliases pinned ``host_tensor`` (same shape and dtype, no copy).

        Built from :meth:`device_address_of_host` through ``__cuda_array_interface__`` (version 2, so
        torch does not synchronize any stream). Kernels reading it read host memory over the bus. The view
        does not keep the registration alive: unpinning while it is in use is the caller's error.

        Raises:
            InvalidArgumentError, UnsupportedCapabilityError: as :meth:`device_address_of_host`; also a
                device alias that an injected non-GPU test device cannot dereference.
        """
        address = self.device_address_of_host(host_tensor)
        if self._device.type != self.device_type:
            # Simulated backends in tests inject the CPU device: there only the host address is readable.
            if address == host_tensor.data_ptr():
                return host_tensor
            raise UnsupportedCapabilityError(
                f"device_view_of_host: device alias {address:#x} of host memory at {host_tensor.data_ptr():#x} "
                f"cannot be dereferenced on the injected device {self._device}"
            )
        nbytes = host_tensor.numel() * host_tensor.element_size()
        exported = _DeviceArray(address, nbytes, host_tensor)
        with self._device_scope():
            raw = torch.as_tensor(exported, device=self._device)
        return raw.view(host_tensor.dtype).view(host_tensor.shape)

    def _refuse_while_capturing(self, member: str) -> None:
        if self.is_current_stream_capturing():
            raise CaptureMisuseError(
                f"{member} cannot run while the current stream is capturing: host registration is not "
                "a capturable operation; call it before or after the capture (the capture is still valid)"
            )

    def synchronize(self) -> None:
        """Block until the work queued on every stream of this GPU has completed (``torch.accelerator.synchronize``
        through :attr:`device_module`).

        Raises:
            RuntimeError: torch's error of a failed device (a lost context, an earlier asynchronous fault).
        """
        self.device_module.synchronize()

    def _wait_for_device_work(self) -> None:
        """Wait for this GPU's queued work before host memory is unregistered: a copy into the pool still
        queued on any stream must land while the range is registered. A lost context is logged (teardown)."""
        try:
            self.synchronize()
        except RuntimeError as error:
            log.warning("%s: could not wait for device work before unregistering host memory: %s",
                        self.runtime.label, error)

    def _register_host_chunk(self, address: int, size: int, index: int) -> int | None:
        return self.runtime.register_host(address, size)

    def _unregister_host_chunk(self, address: int, size: int) -> None:
        try:
            self.runtime.unregister_host(address)
        except DeviceRuntimeError as error:
            if not self.runtime.is_context_lost(error):
                raise
            # At interpreter exit or after a fatal device error the context is gone; the
            # registration dies with the process, so leaking it is the only safe choice.
            log.warning(
                "%s: host chunk %#x (+%d bytes) left registered, the device context is gone: %s",
                self.runtime.label, address, size, error,
            )

    # ----------------------------------------------------------------- graphs
    def is_current_stream_capturing(self) -> bool:
        """True while torch's current stream is capturing (any status but none); creates no context
        (the device module's ``is_current_stream_capturing`` returns False where no context exists)."""
        return self.device_module.is_current_stream_capturing()

    def capture(self) -> contextlib.AbstractContextManager[GpuCapturedGraph]:
        """Capture this backend's work into the device module's graph (``torch.cuda.CUDAGraph`` on CUDA and HIP)
        on a side stream torch makes current; yields a :class:`GpuCapturedGraph` whose ``replay()`` works once
        the block ends.

        Raises:
            UnsupportedCapabilityError: ``capabilities.graph_capture`` is False on this runtime (the
                message carries ``capabilities.reasons["graph_capture"]``).
            CaptureMisuseError: a capture is already underway on the current stream.
        """
        if not self._capabilities.graph_capture:
            why = self._capabilities.reasons.get("graph_capture", "not supported")
            raise self._unsupported(f"capture() (capability graph_capture is False: {why})")
        if self.is_current_stream_capturing():
            raise CaptureMisuseError("capture() called while the current stream is already capturing")
        return self._capture_graph()

    @contextlib.contextmanager
    def _capture_graph(self) -> Iterator[GpuCapturedGraph]:
        with self._device_scope(), warnings.catch_warnings():
            # An empty capture is valid here (it replays as a no-op); torch warns that it "usually
            # means" a wrong stream, which is noise for this contract.
            warnings.filterwarnings("ignore", message="The CUDA Graph is empty", category=UserWarning)
            captured = GpuCapturedGraph(self.device_module.new_graph(), self._check_replay_regions)
            self._capturing.graph = captured
            try:
                with self.device_module.graph_capture(captured.graph):
                    yield captured
            finally:
                self._capturing.graph = None
            captured.complete = True

    def _check_replay_regions(self, graph: GpuCapturedGraph) -> None:
        """Before a replay: every region the captured swaps named is still registered (stale pins released)."""
        self._release_if_stale()
        live = set(self.regions.snapshot())
        for region in graph.regions:
            if region not in live:
                raise InvalidDescriptorError(
                    f"replay: a captured swap uses region {region.label!r} [{region.start:#x}, {region.end:#x}), "
                    "released after the capture; nothing was replayed. Keep captured memory pinned or registered "
                    "while the graph lives"
                )

    # ----------------------------------------------------------------- IPC events
    def create_ipc_event(self) -> GpuIpcEvent:
        """A new interprocess event on this device (timing disabled), created eagerly on it."""
        self._require_ipc("create_ipc_event")
        with self._device_scope():
            event = self.device_module.ipc_event()
            event.ipc_handle()  # torch creates the event lazily on the *current* device; fix it now
        return GpuIpcEvent(event, self.device_index, self.event_timeout_s, imported=False)

    def export_event(self, event: HalEvent) -> bytes:
        """Picklable bytes: the 64-byte IPC handle, device index and exporting process.

        Call it on the thread that uses the device, not from a pickling hook (cuda-python #1145). The
        event must outlive every importer's use of it.

        Raises:
            InvalidArgumentError: ``event`` was not created by :meth:`create_ipc_event`.
        """
        self._require_ipc("export_event")
        if not isinstance(event, GpuIpcEvent) or event.imported:
            raise InvalidArgumentError(
                f"export_event: expected an event from create_ipc_event, got {type(event).__name__}"
                + (" that was itself imported" if isinstance(event, GpuIpcEvent) else "")
            )
        with self._device_scope():
            handle = bytes(event.torch_event.ipc_handle())
        return encode_event_handle(event.device_index, handle)

    def import_event(self, device: torch.device | int | str, handle: bytes) -> GpuIpcEvent:
        """Open an event exported by another process, to wait on from ``device``.

        Raises:
            InvalidArgumentError: malformed handle, a non-GPU device, or a handle exported by this same
                process (CUDA and HIP reject same-process opens, ROCm hip #2882: use the original event).
        """
        self._require_ipc("import_event")
        same_process, _exported_on, raw = decode_event_handle(handle)
        target = torch.device(device) if not isinstance(device, int) else torch.device(self.device_type, device)
        if target.type != self.device_type:
            raise InvalidArgumentError(
                f"import_event: device must be a GPU device ('{self.device_type}'), got {target}"
            )
        if same_process:
            raise InvalidArgumentError(
                "import_event: this handle was exported by this same process; CUDA and HIP refuse to open "
                "an IPC event in its own process (ROCm hip #2882). Use the original event here and "
                "import the handle only in other processes"
            )
        index = target.index if target.index is not None else self.device_index
        with self.device_module.scope(index):
            event = self.device_module.open_ipc_event(index, raw)
        return GpuIpcEvent(event, index, self.event_timeout_s, imported=True)

    def _require_ipc(self, member: str) -> None:
        if not self._capabilities.ipc_events:
            raise self._unsupported(f"{member} (this device has no IPC events)")


class _DeviceArray:
    """Exports ``nbytes`` at a device address as a 1-D uint8 array through ``__cuda_array_interface__``.

    Keeps the host tensor referenced while torch holds this object (torch keeps it alive with the view).
    """

    def __init__(self, address: int, nbytes: int, owner: torch.Tensor) -> None:
        self.owner = owner
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, False),
            "strides": None,
            "version": 2,
        }


def _shift_error(error: DeviceRuntimeError, offset: int) -> DeviceRuntimeError:
    """Re-base a chunk's failing index onto the whole batch and say what was already enqueued."""
    index = None if error.index is None else error.index + offset
    detail = getattr(error, "detail", "")
    if offset:
        done = f"descriptors before {offset} were already enqueued in earlier chunks"
        detail = f"{detail}; {done}" if detail else done
    return DeviceRuntimeError(error.call, error.code, error.error_name, detail, index)
