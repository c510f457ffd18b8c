"""The vendor-neutral backend contract, ``HiSparseBackend``, and the logic every vendor shares.

Members and argument order follow the reference interface (vllm.v1.hisparse.backend). The shared
parts live here once: descriptor validation against known regions, chunked host registration with
rollback, KV config validation and views, one-pass gathers. A vendor overrides the hooks named
``_enqueue_swap``, ``_register_host_chunk``/``_unregister_host_chunk`` and the event and capture
members; a member it does not implement raises ``UnsupportedCapabilityError`` naming it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from .capabilities import Capabilities
from .errors import InvalidArgumentError, InvalidDescriptorError, UnpinError, UnsupportedCapabilityError
from .events import CapturedGraph, HalEvent
from .gather import check_gather_destination, gather_rows
from .host_registration import (
    PAGE_BYTES,
    HostChunk,
    HostRegistration,
    default_chunk_bytes,
    plan_host_chunks,
    register_in_chunks,
    unwritable_part,
)
from .kv_layout import KVCacheLayout, build_kv_views, describe_kv_cache
from .regions import Region, RegionTable, SwapBatch, check_region

if TYPE_CHECKING:
    from .cache_ops.bound import CacheOps
    from .probing import ProbeResult

__all__ = ["HiSparseBackend"]

log = logging.getLogger(__name__)


class _Pin:
    """One pinned tensor: its record, its regions, and what proves its memory is still where it was pinned.

    Holds the tensor's storage, so the allocator cannot free or reuse the pinned memory; ``resize_`` can still
    move the storage's data and ``set_`` re-point the tensor, which :meth:`why_stale` detects (two pointer
    reads and a weak reference). ``chunks_left`` are the chunks still registered.
    """

    __slots__ = ("record", "regions", "tensor", "storage", "storage_address", "storage_end", "chunks_left")

    def __init__(self, record: HostRegistration, regions: tuple[Region, ...], tensor: torch.Tensor) -> None:
        self.record = record
        self.regions = regions
        self.tensor = weakref.ref(tensor)
        self.storage: torch.UntypedStorage | None = tensor.untyped_storage()
        self.storage_address = self.storage.data_ptr()
        self.storage_end = record.address + record.size - self.storage_address  # bytes of storage needed
        self.chunks_left: tuple[HostChunk, ...] = record.chunks

    def why_stale(self) -> str | None:
        """None while the pinned range is still the tensor's memory; otherwise what moved."""
        storage = self.storage
        if storage is None:
            return None
        address = storage.data_ptr()
        if address != self.storage_address:
            return f"its storage moved from {self.storage_address:#x} to {address:#x} (resize_)"
        if storage.nbytes() < self.storage_end:
            return f"its storage shrank to {storage.nbytes()} bytes"
        tensor = self.tensor()
        if tensor is not None and tensor.data_ptr() != self.record.address:
            return f"the tensor now starts at {tensor.data_ptr():#x} (resize_ or set_)"
        return None


class HiSparseBackend:
    """Device operations for HiSparse KV-cache offload, one instance per device.

    Subclasses set ``name`` and implement ``device``, ``capabilities`` and the vendor hooks. Probing
    is not done here: see :mod:`hisparse_hal.registry`.
    """

    #: Registry name of the backend (``"cuda"``, ``"rocm"``, ``"cpu"``, ...).
    name: ClassVar[str] = "abstract"

    def __init__(self) -> None:
        self.regions = RegionTable()
        #: Largest single host registration; tests and conformance may lower it to force chunking.
        self.host_chunk_bytes = default_chunk_bytes()
        self._lock = threading.RLock()
        self._pins: dict[tuple[int, int], _Pin] = {}  # (address, size) when pinned -> its pin
        #: The pins swaps may name, an immutable snapshot replaced under the lock (read without it).
        self._live_pins: tuple[_Pin, ...] = ()
        #: Tensors whose stale pin a swap released: their unpin_tensor is a no-op.
        self._released: list[weakref.ref[torch.Tensor]] = []
        self._cache_regions: tuple[Region, ...] = ()
        self._explicit: dict[int, Region] = {}
        self._pin_generation = 0

    @classmethod
    def from_probe(cls, probe: ProbeResult) -> HiSparseBackend:
        """Construct from the probe result that selected this backend (its facts: versions, devices)."""
        return cls()

    # ----------------------------------------------------------------- identity and capabilities
    @property
    def device(self) -> torch.device:
        """The ``torch.device`` this backend's KV caches live on."""
        raise self._unsupported("device")

    @property
    def capabilities(self) -> Capabilities:
        """What this backend can do on its device (stable across calls)."""
        raise self._unsupported("capabilities")

    @property
    def supports_shared_host_pool(self) -> bool:
        """Whether all local tensor-parallel ranks may share one pinned host pool."""
        return self.capabilities.shared_host_pool

    @property
    def stats_dtype(self) -> torch.dtype:
        """Dtype of the ``[hits, misses]`` device counter."""
        return self.capabilities.stats_dtype

    def check_available(self) -> None:
        """Raise ``BackendUnavailableError`` (with the reason) when this backend's probe fails.

        A backend that is not registered (built by a factory) has no probe and is taken as available.
        """
        from .probing import check_registered_backend

        check_registered_backend(self.name)

    def _unsupported(self, member: str) -> UnsupportedCapabilityError:
        return UnsupportedCapabilityError(
            f"backend {self.name!r} ({type(self).__qualname__}) does not implement {member}"
        )

    # ----------------------------------------------------------------- host pinning
    def pin_tensor(self, tensor: torch.Tensor) -> None:
        """Pin (page-lock and register) a host tensor so swaps may target it.

        Registration happens in chunks of at most ``host_chunk_bytes`` that end on page and block
        boundaries (block = one slice along dim 0); if any chunk fails, the registered ones are
        released in reverse order and nothing stays pinned. All chunks become regions in one table
        change, so pinning costs time linear in the chunk count.

        Lifetime: the pin holds a reference to the tensor's storage until :meth:`unpin_tensor` (or until a
        stale pin is released, below), so its memory cannot be freed and its address reused while swaps may
        name it: dropping every other reference without unpinning keeps the memory allocated and registered.
        Memory that moves from under the pin (``resize_`` reallocating the storage, ``set_`` re-pointing the
        tensor, the storage resized) makes the pin stale: the next swap naming it raises
        ``InvalidDescriptorError`` naming the region and copies nothing, and the stale registration and page
        lock are released at that swap, or at the next pin, registration, captured replay, host-address
        translation or unpin, whichever comes first; ``unpin_tensor`` of the moved tensor then succeeds.
        A pinned ``mmap`` therefore stays exported until unpinned (``mmap.close`` raises ``BufferError``).
        vLLM 0.34.0 relies on none of this: it unpins every pool at teardown
        (``vllm/v1/hisparse/runtime.py:373``) before closing the shared mapping, and when an unpin fails it
        keeps a still-exported mapping mapped (``vllm/v1/kv_offload/cpu/shared_offload_region.py:443-455``).

        Raises:
            InvalidArgumentError: not a tensor, not on the CPU, not contiguous, empty, memory that is not
                writable (a read-only mapping; see :func:`~hisparse_hal.host_registration.unwritable_part`),
                or overlapping a tensor or region already known (naming it).
            DeviceRuntimeError: the vendor's registration call failed (after rollback).
        """
        address, size = self._host_range(tensor, "pin_tensor")
        block_bytes = (tensor[0].numel() * tensor.element_size()) if tensor.dim() >= 2 else PAGE_BYTES
        self._refuse_unwritable(address, size, "pin_tensor", "tensor")
        with self._lock:
            self._release_stale_pins()
            pending = self._pins.get((address, size))
            if pending is not None:
                retry = "; its release failed earlier: call unpin_tensor again" if not pending.regions else ""
                raise InvalidArgumentError(
                    f"pin_tensor: tensor at {address:#x} ({size} bytes) is already pinned{retry}; "
                    "unpin it first"
                )
            region = self.regions.overlapping(address, address + size)
            if region is not None:
                raise InvalidArgumentError(
                    f"pin_tensor: tensor at {address:#x} ({size} bytes) overlaps known region "
                    f"{region.label!r} [{region.start:#x}, {region.end:#x})"
                )
            plan = plan_host_chunks(address, size, block_bytes, self.host_chunk_bytes)
            if len(plan) > 1:
                log.info("pinning %d bytes at %#x in %d chunks", size, address, len(plan))
            chunks = register_in_chunks(plan, self._register_host_chunk, self._unregister_host_chunk)
            regions = tuple(
                Region(chunk.address, chunk.size, "pinned_host",
                       f"pinned host {address:#x} chunk {i + 1}/{len(chunks)}", torch.device("cpu"),
                       chunk.device_alias)
                for i, chunk in enumerate(chunks)
            )
            try:
                self.regions.update(add=regions)
            except BaseException:
                for chunk in reversed(chunks):
                    self._unregister_host_chunk(chunk.address, chunk.size)
                raise
            record = HostRegistration(address, size, chunks, self._host_page_locked(), chunks[0].device_alias)
            self._pins[(address, size)] = _Pin(record, regions, tensor)
            self._publish_pins()

    def unpin_tensor(self, tensor: torch.Tensor) -> None:
        """Release a tensor pinned with :meth:`pin_tensor`, chunk by chunk in reverse order.

        Every chunk is released even when one fails; chunks whose release failed stay tracked, so calling
        ``unpin_tensor`` again retries exactly those (the tensor is no longer a swap region either way).
        A tensor moved by ``resize_``/``set_`` after pinning is found by identity and its old range
        released; one whose stale registration a swap already released unpins as a no-op.

        Every failure is a ``RuntimeError`` (vLLM 0.34.0 catches only that, ``vllm/v1/hisparse/runtime.py:374``).

        Raises:
            UnpinError: the tensor is not a pinned host tensor of this backend (an ``InvalidArgumentError``
                and a ``RuntimeError``).
            DeviceRuntimeError: the vendor's release call failed for some chunk (the first failure; the
                other chunks were still released).
        """
        with self._lock:
            key = self._pin_key_of(tensor)
            if key is None:
                if self._forget_released(tensor):
                    return
                try:
                    address, size = self._host_range(tensor, "unpin_tensor")
                except InvalidArgumentError as error:
                    raise UnpinError(str(error)) from None
                raise UnpinError(
                    f"unpin_tensor: tensor at {address:#x} ({size} bytes) was not pinned by "
                    f"backend {self.name!r}"
                )
            failure = self._release_pin(key)
        if failure is not None:
            raise failure

    def host_registration(self, tensor: torch.Tensor) -> HostRegistration:
        """The registration record of a pinned tensor (chunks, page-lock state, device alias).

        Raises:
            InvalidArgumentError: the tensor is not pinned by this backend.
        """
        address, size = self._host_range(tensor, "host_registration")
        with self._lock:
            pin = self._pins.get((address, size))
        if pin is None or not pin.regions:
            raise InvalidArgumentError(f"tensor at {address:#x} ({size} bytes) is not pinned by {self.name!r}")
        return pin.record

    @property
    def pin_generation(self) -> int:
        """Moves on every successful :meth:`pin_tensor` and every release (:meth:`unpin_tensor`, a stale pin
        released): what is known about pinned memory at one value (device views, address translations)
        stays true until it moves."""
        return self._pin_generation

    def pinned_registrations(self) -> tuple[HostRegistration, ...]:
        """Every live host registration (swaps may name it), in no particular order."""
        return tuple(pin.record for pin in self._live_pins)

    def _host_range(self, tensor: object, member: str) -> tuple[int, int]:
        if not isinstance(tensor, torch.Tensor):
            raise InvalidArgumentError(f"{member}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type != "cpu":
            raise InvalidArgumentError(f"{member}: tensor must be in host memory, got device {tensor.device}")
        if not tensor.is_contiguous():
            raise InvalidArgumentError(f"{member}: tensor must be contiguous, got strides {tensor.stride()}")
        size = tensor.numel() * tensor.element_size()
        if size == 0:
            raise InvalidArgumentError(f"{member}: tensor is empty (shape {tuple(tensor.shape)})")
        return tensor.data_ptr(), size

    @staticmethod
    def _refuse_unwritable(address: int, size: int, member: str, what: str) -> None:
        """Raise ``InvalidArgumentError`` when some of the host range is not writable memory of this process."""
        problem = unwritable_part(address, size)
        if problem is not None:
            raise InvalidArgumentError(
                f"{member}: {what} [{address:#x}, {address + size:#x}) ({size} bytes) is not writable host "
                f"memory: {problem}; swaps write into it, so only writable memory can be registered"
            )

    def _pin_key_of(self, tensor: object) -> tuple[int, int] | None:
        """The ``_pins`` key of ``tensor``: by its current range, else by identity (it moved). Under the lock."""
        if isinstance(tensor, torch.Tensor):
            for key, pin in self._pins.items():
                if pin.tensor() is tensor:
                    return key
            with contextlib.suppress(InvalidArgumentError):
                key = self._host_range(tensor, "unpin_tensor")
                if key in self._pins:
                    return key
        return None

    def _forget_released(self, tensor: object) -> bool:
        """Whether ``tensor``'s stale pin was already released (forgetting it). Under the lock."""
        for i, ref in enumerate(self._released):
            if ref() is tensor:
                del self._released[i]
                return True
        return False

    def _release_pin(self, key: tuple[int, int]) -> BaseException | None:
        """Under the lock: drop the pin's regions, release every chunk left, in reverse; keep the failed ones
        tracked. Returns the first failure (None when all chunks are released and the pin is forgotten)."""
        pin = self._pins[key]
        if pin.regions:
            self.regions.update(remove=pin.regions)
            pin.regions = ()
        self._wait_for_device_work()
        failed: list[HostChunk] = []
        first: BaseException | None = None
        for chunk in reversed(pin.chunks_left):
            try:
                self._unregister_host_chunk(chunk.address, chunk.size)
            except Exception as error:  # noqa: BLE001 - release every chunk, raise the first failure
                failed.append(chunk)
                first = first or error
        pin.chunks_left = tuple(reversed(failed))
        if not failed:
            del self._pins[key]
            pin.storage = None
        self._publish_pins()
        if first is not None:
            log.warning("%s: %d of %d host chunks of %#x stay registered after a failed release; unpin again "
                        "to retry", self.name, len(failed), len(pin.record.chunks), pin.record.address)
        return first

    def _release_stale_pins(self) -> tuple[Region, ...]:
        """Release every pin whose tensor's memory moved (``resize_``, ``set_``); returns their regions.

        The release errors of a stale pin are logged, its failed chunks stay tracked for ``unpin_tensor``.
        """
        released: list[Region] = []
        with self._lock:
            for key, pin in list(self._pins.items()):
                why = pin.why_stale() if pin.regions else None
                if why is None:
                    continue
                log.warning("%s: releasing pinned host %#x (%d bytes): %s without unpin_tensor", self.name,
                            key[0], key[1], why)
                released.extend(pin.regions)
                tensor = pin.tensor
                if self._release_pin(key) is None and tensor() is not None:
                    self._released = [ref for ref in self._released if ref() is not None]
                    self._released.append(tensor)
        return tuple(released)

    def _release_if_stale(self) -> None:
        """Release stale pins, if any (a few pointer reads when none is): before a captured replay, or before
        translating host addresses for kernels."""
        if any(pin.why_stale() is not None for pin in self._live_pins):
            self._release_stale_pins()

    def _refuse_stale_regions(self, batch: SwapBatch) -> None:
        """Before a swap: release stale pins, and refuse ``batch`` (naming the region) when it names one."""
        pins = self._live_pins
        if not pins or all(pin.why_stale() is None for pin in pins):
            return
        reasons = {region: pin.why_stale() for pin in pins for region in pin.regions}
        released = set(self._release_stale_pins())
        if not released:
            return
        stale = torch.tensor([region in released for region in batch.regions], dtype=torch.bool)
        hit = stale[batch.src_region] | stale[batch.dst_region]
        if bool(hit.any()):
            i = int(hit.nonzero()[0])
            k = int(batch.src_region[i]) if bool(stale[batch.src_region[i]]) else int(batch.dst_region[i])
            region = batch.regions[k]
            raise InvalidDescriptorError(
                f"swap descriptor {i} names region {region.label!r} [{region.start:#x}, {region.end:#x}), "
                f"whose tensor's memory is no longer there ({reasons.get(region) or 'moved'}); its registration "
                "was released and nothing was copied. Unpin a tensor before resizing or re-pointing it",
                i,
            )

    def _publish_pins(self) -> None:
        """Under the lock: publish the immutable snapshot the swap path reads, and move the generation."""
        self._live_pins = tuple(pin for pin in self._pins.values() if pin.regions)
        self._pin_generation += 1

    def _wait_for_device_work(self) -> None:
        """Vendor hook: wait for queued copies that may touch host memory about to be unregistered."""

    def _register_host_chunk(self, address: int, size: int, index: int) -> int | None:
        """Vendor hook: register one host chunk; return its device alias or None."""
        raise self._unsupported("pin_tensor")

    def _unregister_host_chunk(self, address: int, size: int) -> None:
        """Vendor hook: release one host chunk registered by ``_register_host_chunk``."""
        raise self._unsupported("unpin_tensor")

    def _host_page_locked(self) -> bool:
        """Vendor hook: whether registered host memory is really page-locked."""
        return True

    # ----------------------------------------------------------------- explicit regions
    def register_region(
        self, address: int, size: int, label: str = "", *, device: torch.device | None = None
    ) -> Region:
        """Make ``[address, address + size)`` a valid swap source or destination.

        For memory the backend did not pin and no cache view covers (a staging buffer, say). The range
        must stay mapped and writable for as long as the region is registered: the backend keeps no
        reference to the memory, so the caller unregisters it before freeing or unmapping it (a swap
        into freed memory corrupts whatever the allocator put there).

        Raises:
            InvalidArgumentError: address or size not an int (a bool is refused), non-positive size,
                negative address, a range past the int64 address space, host memory that is not mapped
                writable (checked for host regions), or overlap with a known region.
        """
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (address, size)):
            raise InvalidArgumentError(f"register_region: address and size must be ints, got {address!r}, {size!r}")
        region = Region(address, size, "explicit", label or f"explicit {address:#x}", device or self.device)
        check_region(region)
        with self._lock:
            self._release_stale_pins()
            if region.device.type == "cpu" and self.regions.overlapping(region.start, region.end) is None:
                self._refuse_unwritable(address, size, "register_region", f"region {region.label!r}")
            self.regions.add(region)
            self._explicit[address] = region
        return region

    def unregister_region(self, region: Region) -> None:
        """Forget a region added with :meth:`register_region`.

        Raises:
            InvalidArgumentError: the region was not registered explicitly.
        """
        with self._lock:
            if self._explicit.get(region.start) != region:
                raise InvalidArgumentError(f"unregister_region: {region.label!r} was not registered explicitly")
            self.regions.remove(region)
            del self._explicit[region.start]

    # ----------------------------------------------------------------- KV cache config and views
    def validate_kv_cache_config(self, kv_cache_config: Any) -> None:
        """Validate device cache formats before allocating or pinning storage.

        Takes this package's :class:`~hisparse_hal.kv_cache.KVCacheConfig`, or any other object read as a config
        described by tensor placements (vLLM 0.34.0's ``KVCacheConfig``, called at
        ``vllm/v1/hisparse/binding.py:139``): only the fields it carries are checked, so what vLLM's base backend
        accepts (anything, ``backend.py:36-37``) is accepted unless a field it carries is wrong. Both are read once,
        by :func:`hisparse_hal.kv_layout.describe_kv_cache`.

        Raises:
            InvalidArgumentError: a malformed config (see :func:`hisparse_hal.kv_layout.describe_kv_cache`).
            UnsupportedCapabilityError: a format this device cannot hold, or a shared host pool it cannot
                provide.
        """
        self._describe_kv_cache(kv_cache_config)

    def _describe_kv_cache(self, kv_cache_config: Any) -> KVCacheLayout:
        """``kv_cache_config`` checked against this device and described in one form."""
        return describe_kv_cache(kv_cache_config, kv_formats=self.capabilities.kv_formats,
                                 shared_host_pool=self.supports_shared_host_pool, where=self._where())

    def _where(self) -> str:
        arch = self.capabilities.versions.get("arch")
        return f"backend {self.name!r}" + (f" ({arch})" if arch else "")

    def prepare_kv_cache_views(
        self,
        kv_cache_config: Any,
        kv_caches: dict[str, Any],
        forward_context: dict[str, Any],
    ) -> None:
        """Make the KV caches' device bytes known swap regions (replacing those of an earlier call).

        With this package's :class:`~hisparse_hal.kv_cache.KVCacheConfig`, each layer's entry in
        ``kv_caches`` becomes a typed ``[num_blocks, block_size, row_width]`` view of the same storage at
        its offset, and each layer's bytes a region. With a placement config (vLLM 0.34.0, called once per
        cache initialization at ``vllm/v1/hisparse/binding.py:150``, for the profiling cache and then the
        real one), ``kv_caches`` is left as vLLM built it (its binder makes the views) and each distinct
        device storage behind a device-resident layer becomes one region, so the worker's spills from
        resident rows to the host pool (``swap_blocks_batch``) are accepted. Nothing is allocated, owned or
        kept per step; ``forward_context`` is left untouched. On error nothing changes.

        Raises:
            InvalidArgumentError, UnsupportedCapabilityError: as :meth:`validate_kv_cache_config`, or a
                layer missing, misplaced, too small or overlapping another or a pinned host region.
        """
        self.validate_kv_cache_config(kv_cache_config)  # a vendor's override (its hints) refuses first
        views, regions = build_kv_views(self._describe_kv_cache(kv_cache_config), kv_caches, self.device)
        self._replace_cache_regions(regions)
        kv_caches.update(views)

    def _replace_cache_regions(self, regions: list[Region]) -> None:
        """Swap the KV-cache regions of the last ``prepare_kv_cache_views`` for ``regions`` in one table change:
        all or none, and no swap ever sees neither set."""
        with self._lock:
            self._release_stale_pins()
            self.regions.update(remove=self._cache_regions, add=regions)
            self._cache_regions = tuple(regions)

    # ----------------------------------------------------------------- per-step operations
    def _enqueue_cache_op(self, name: str, run: Callable[[], None], check: Callable[[], None]) -> None:
        """Vendor hook: run one cache op (``name``) on the current stream.

        ``check`` validates the op's arguments (metadata only) and ``run`` checks and runs it. The default
        runs it at once: on a GPU a capture records the kernels it launches. A device whose capture is
        not a stream capture (the CPU device) records it instead.
        """
        run()

    def create_cache_ops(self, runtime: Any) -> CacheOps:
        """The per-step operations bound to ``runtime`` (see :class:`~hisparse_hal.cache_ops.bound.CacheOps`),
        what vLLM 0.34.0 stores as ``runtime.cache_ops`` (``runtime.py:781``).

        Registers the runtime's ``device_global_indices`` table(s) (``runtime.index_group.device_global_indices``
        in vLLM 0.34.0, read defensively) so ``hisparse_invalidate_written_slots`` can resolve their addresses;
        other engines register theirs with :meth:`register_cache_op_table`.

        Args:
            runtime: vLLM's ``HiSparseRuntime`` (or None / any object for engines without one).

        Returns:
            The :class:`~hisparse_hal.cache_ops.bound.CacheOps`.
        """
        from .cache_ops import tables
        from .cache_ops.bound import CacheOps

        if runtime is not None:
            tables.register_runtime_tables(runtime)
        return CacheOps(self, runtime)

    def register_cache_op_table(self, table: torch.Tensor) -> None:
        """Make a ``device_global_indices`` table resolvable by address in ``hisparse_invalidate_written_slots``.

        Raises:
            InvalidArgumentError: not a contiguous int32 2-D tensor.
        """
        from .cache_ops import tables

        tables.register_table(table)

    def swap_blocks_batch(self, src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor) -> None:
        """Enqueue copies of ``sizes[i]`` bytes from ``src[i]`` to ``dst[i]`` on the current stream.

        The whole batch is checked first: three 1-D int64 CPU tensors of equal length, sizes >= 0, and
        every range inside one known region (pinned host tensor, prepared cache layer, or explicit
        region). The descriptor arrays may be reused once this returns; the data must stay valid until
        the stream reaches the copy. Batches over ``capabilities.max_batch_descriptors`` are chunked.

        Overlapping descriptors (a destination overlapping another descriptor's source or destination,
        or its own source) are accepted: every byte they touch is inside a known region, so they cannot
        corrupt memory outside the batch's destinations. Their result is defined only on the CPU device
        (in order, each like memmove); vendor batch calls run one batch's copies in no set order
        ("dependent copies within a batch will result in undefined behavior", cuMemcpyBatchAsync), so an
        engine must issue dependent copies in separate calls.

        Raises:
            InvalidDescriptorError: naming the first bad descriptor (or the region of a pinned tensor whose
                memory moved, see :meth:`pin_tensor`); nothing was copied.
            DeviceRuntimeError: the vendor's copy call failed.
        """
        batch = self.regions.check_swap_batch(src, dst, sizes)
        if batch.count == 0:
            return
        self._refuse_stale_regions(batch)
        self._enqueue_swap(batch)

    def _enqueue_swap(self, batch: SwapBatch) -> None:
        """Vendor hook: copy a validated, non-empty batch on the current stream."""
        raise self._unsupported("swap_blocks_batch")

    def gather_resident_rows(self, source: torch.Tensor, destination: torch.Tensor, row_ids: torch.Tensor) -> None:
        """Copy resident rows into staging without changing their payload format.

        Row id ``b * block_size + o`` names row ``o`` of block ``b`` of ``source``
        (``[num_blocks, block_size, row_width]``, possibly strided); ``-1`` reads row 0. When dtypes
        differ the bytes are preserved. One pass into ``destination``, asynchronous on the current
        stream. Outside a capture, ids are range-checked first. (GPU backends check ids on the device
        instead and report a bad one through :meth:`raise_gather_faults`.)

        Raises:
            InvalidArgumentError: bad types, devices, shapes, a destination overlapping the source or
                requiring grad, or an id out of range (naming it).
        """
        self._check_gather_device(source, destination)
        gather_rows(source, destination, row_ids, check_range=not self.is_current_stream_capturing())

    def raise_gather_faults(self) -> None:
        """Raise the first out-of-range row id that an earlier gather found but could not report.

        Backends that check ids on the host before copying (the CPU device) raise from
        :meth:`gather_resident_rows` itself and have nothing to report here. GPU backends check on the
        device, without a read-back; call this where the step synchronizes anyway (it reads one small
        device record, waiting for the gathers before it on the current stream).

        Raises:
            InvalidArgumentError: naming the first bad id (index within its gather, value, valid range)
                recorded since the last call; the record is then cleared.
        """

    def _check_gather_device(self, source: object, destination: object) -> None:
        """The checks that read no data: both tensors on this device, and a writable destination apart
        from the source (also run where the gather itself is only recorded, as in a capture)."""
        for name, value in (("source", source), ("destination", destination)):
            if isinstance(value, torch.Tensor) and value.device != self.device:
                raise InvalidArgumentError(
                    f"gather {name} is on {value.device}, but backend {self.name!r} runs on {self.device}"
                )
        if isinstance(source, torch.Tensor) and isinstance(destination, torch.Tensor):
            check_gather_destination(source, destination)

    def device_view_of_host(self, host_tensor: torch.Tensor) -> torch.Tensor:
        """A tensor on this backend's device that aliases the host tensor ``host_tensor`` (no copy).

        Kernels read host rows through it (zero-copy). On a device whose memory is host memory (the CPU
        reference device) it is ``host_tensor`` itself; GPU backends build a device view of pinned memory.

        Raises:
            InvalidArgumentError: not a CPU tensor.
            UnsupportedCapabilityError: this backend cannot address host memory from its device.
        """
        if not isinstance(host_tensor, torch.Tensor) or host_tensor.device.type != "cpu":
            where = host_tensor.device if isinstance(host_tensor, torch.Tensor) else type(host_tensor).__name__
            raise InvalidArgumentError(f"device_view_of_host: expected a CPU tensor, got {where}")
        if self.device.type == "cpu":
            return host_tensor
        raise self._unsupported("device_view_of_host")

    # ----------------------------------------------------------------- synchronisation, graphs and events
    def synchronize(self) -> None:
        """Block until all work this backend has queued on its device has completed: on a GPU, every stream of the
        device (``torch.accelerator.synchronize``); on the host device, any swap still in flight. Benchmarks and
        the tensor-parallel scenario call it before reading a timer or the bytes a swap wrote.

        Not one of vLLM 0.34.0's members: hisparse-hal's own, so the vLLM-facing classes do not expose it.

        Raises:
            UnsupportedCapabilityError: the backend does not implement it.
        """
        raise self._unsupported("synchronize")

    def is_current_stream_capturing(self) -> bool:
        """True while the current stream is being captured (any status but "none"). Never creates a
        device context."""
        raise self._unsupported("is_current_stream_capturing")

    def capture(self) -> contextlib.AbstractContextManager[CapturedGraph]:
        """A context manager that captures this backend's work on the current stream and yields a graph
        with ``replay()``; ``is_current_stream_capturing()`` is True inside it.

        Raises:
            UnsupportedCapabilityError: the backend cannot capture.
            CaptureMisuseError: a capture is already underway.
        """
        raise self._unsupported("capture")

    def create_ipc_event(self) -> HalEvent:
        """Create an event that can be exported to another process."""
        raise self._unsupported("create_ipc_event")

    def export_event(self, event: HalEvent) -> bytes:
        """A picklable handle for ``event``, to pass to :meth:`import_event` in another process."""
        raise self._unsupported("export_event")

    def import_event(self, device: torch.device, handle: bytes) -> HalEvent:
        """Open an event exported by another process on ``device``."""
        raise self._unsupported("import_event")
