"""``CpuBackend``: the CPU reference device, the whole contract on host memory.

A real backend, and the conformance suite's oracle: pinning registers host ranges and page-locks them
where the OS allows, swaps and gathers move real bytes, IPC events work across processes through
shared memory, and capture records swaps and gathers for replay. Host work is synchronous: when a
member returns, its bytes have moved (outside a capture).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hisparse_hal.backend import HiSparseBackend
from hisparse_hal.cache_ops.selection import with_cache_ops
from hisparse_hal.capabilities import Capabilities
from hisparse_hal.errors import InvalidArgumentError, InvalidDescriptorError
from hisparse_hal.events import HalEvent, check_timeout_s
from hisparse_hal.gather import check_row_ids, gather_rows
from hisparse_hal.regions import Region, SwapBatch
from hisparse_hal.settings import event_timeout_s as event_timeout_s_from_env

from .byte_copy import SwapMoveReport, move_swap_batch
from .capabilities import plan_capabilities
from .delayed_work import DelayedWork
from .graph import (
    CapturedOp,
    CpuGraph,
    capture_graph,
    current_graph,
    refuse_while_capturing,
)
from .ipc_event import CpuIpcEvent, create_event, import_event
from .runtime import PageLocker, memlock_limit, probe_page_lock

__all__ = ["CpuBackend"]

_CPU = torch.device("cpu")


class CpuBackend(HiSparseBackend):
    """The CPU reference device.

    Args:
        event_timeout_s: bound of IPC event waits in seconds (default ``HISPARSE_HAL_EVENT_TIMEOUT_S``,
            else 30).

    Operations refused while capturing (``CaptureMisuseError``, the capture stays usable): those that
    change host state or cross a process boundary, which a graph cannot record: ``pin_tensor``,
    ``unpin_tensor``, ``register_region``, ``unregister_region``, ``prepare_kv_cache_views``,
    ``create_ipc_event``, ``export_event``, ``import_event`` and event ``record``/``wait``/``synchronize``.
    Validation and queries (``validate_kv_cache_config``, ``capabilities``, event ``query``) are allowed.
    """

    name = "cpu"

    def __init__(self, *, event_timeout_s: float | None = None) -> None:
        super().__init__()
        #: Bound of every IPC event wait, in seconds (events copy it at creation or import).
        self.event_timeout_s = (event_timeout_s_from_env() if event_timeout_s is None
                                else check_timeout_s(event_timeout_s, "event_timeout_s"))
        self.page_locker = PageLocker()
        #: How the last executed swap was moved (vectorized / memmove), for tests and benchmarks.
        self.last_swap: SwapMoveReport | None = None
        self._delayed = DelayedWork()  # empty unless a test arms delay_next_swap
        self._pin_locked = True
        locks, detail = probe_page_lock()
        self._capabilities = with_cache_ops(plan_capabilities(locks, detail, memlock_limit()), _CPU)

    # ----------------------------------------------------------------- identity
    @property
    def device(self) -> torch.device:
        """``torch.device("cpu")``."""
        return _CPU

    @property
    def capabilities(self) -> Capabilities:
        """Everything on: native (vectorized) batch copy, IPC events without a cycle limit, shared
        host pool, graph capture, every KV format; ``versions`` says whether ``mlock`` works here."""
        return self._capabilities

    # ----------------------------------------------------------------- pinning and regions
    def pin_tensor(self, tensor: torch.Tensor) -> None:
        """Register a host tensor and page-lock it where the OS allows (see the base class); whether it
        was locked is ``host_registration(tensor).page_locked``.

        Raises:
            CaptureMisuseError: while capturing. InvalidArgumentError: as the base class.
        """
        refuse_while_capturing("pin_tensor")
        super().pin_tensor(tensor)

    def unpin_tensor(self, tensor: torch.Tensor) -> None:
        """Unlock and forget a pinned tensor (see the base class).

        Raises:
            CaptureMisuseError: while capturing. InvalidArgumentError: not pinned here.
        """
        refuse_while_capturing("unpin_tensor")
        self._delayed.drain()
        super().unpin_tensor(tensor)

    def register_region(
        self, address: int, size: int, label: str = "", *, device: torch.device | None = None
    ) -> Region:
        """Make a host range a swap source or destination (see the base class).

        Raises:
            CaptureMisuseError: while capturing. InvalidArgumentError: a non-CPU device, or as the base.
        """
        refuse_while_capturing("register_region")
        if device is not None and torch.device(device) != _CPU:
            raise InvalidArgumentError(f"register_region: the CPU device only knows host memory, got device {device}")
        return super().register_region(address, size, label, device=_CPU)

    def unregister_region(self, region: Region) -> None:
        """Forget an explicit region once delayed swaps in flight have landed (they may write it).
        Raises ``CaptureMisuseError`` while capturing."""
        refuse_while_capturing("unregister_region")
        self._delayed.drain()
        super().unregister_region(region)

    def prepare_kv_cache_views(
        self, kv_cache_config: Any, kv_caches: dict[str, Any], forward_context: dict[str, Any]
    ) -> None:
        """Install typed views (see the base class: any config object is read) once delayed swaps in flight have
        landed (they may write the cache regions this replaces). Raises ``CaptureMisuseError`` while capturing."""
        refuse_while_capturing("prepare_kv_cache_views")
        self._delayed.drain()
        super().prepare_kv_cache_views(kv_cache_config, kv_caches, forward_context)

    def _register_host_chunk(self, address: int, size: int, index: int) -> int | None:
        # Called under the base class's lock, chunk 0 first; _host_page_locked() follows the last chunk.
        if index == 0:
            self._pin_locked = True
        self._pin_locked = self.page_locker.lock(address, size) and self._pin_locked
        return None

    def _unregister_host_chunk(self, address: int, size: int) -> None:
        self.page_locker.unlock(address, size)

    def _host_page_locked(self) -> bool:
        return self._pin_locked

    # ----------------------------------------------------------------- swaps and gathers
    def delay_next_swap(self, seconds: float) -> None:
        """Test hook (off by default): the next swap lands on a background thread ``seconds`` later, as
        a GPU copy lands after ``record()`` returns. IPC records wait for it; so do unpinning and the
        backend's next swap. The conformance IPC tier uses it to catch a ``wait()`` that does not wait.
        """
        self._delayed.delay_next(seconds)

    def _enqueue_swap(self, batch: SwapBatch) -> None:
        graph = current_graph()
        if graph is None:
            def move() -> None:
                self.last_swap = move_swap_batch(batch)

            self._delayed.run(move)
            return
        used = torch.unique(torch.cat([batch.src_region, batch.dst_region])).tolist()
        regions = tuple(batch.regions[i] for i in used)

        def check() -> None:
            self._release_if_stale()  # a pinned tensor moved since the capture: its region goes
            live = set(self.regions.snapshot())
            for region in regions:
                if region not in live:
                    raise InvalidDescriptorError(
                        f"replay: a captured swap uses region {region.label!r} [{region.start:#x}, "
                        f"{region.end:#x}), released after the capture; nothing was replayed. Keep captured "
                        "memory pinned or registered while the graph lives"
                    )

        def run() -> None:
            self.last_swap = move_swap_batch(batch)

        graph.record(CapturedOp("swap_blocks_batch", run, check))

    def gather_resident_rows(self, source: torch.Tensor, destination: torch.Tensor, row_ids: torch.Tensor) -> None:
        """One-pass gather (see the base class). While capturing, the gather is recorded, not run.

        Arguments are checked in full at capture time, ids included (the CPU device can read them then,
        a GPU cannot): a dry run into a scratch buffer, so ``destination`` is untouched. The graph keeps
        references to the three tensors, as a GPU graph keeps pointers: ids updated in place before a
        replay are the ids that replay gathers (and are range-checked again first).

        Raises:
            InvalidArgumentError: bad types, devices, shapes, or an id out of range (naming it).
        """
        graph = current_graph()
        if graph is None:
            super().gather_resident_rows(source, destination, row_ids)
            return
        self._check_gather_device(source, destination)
        scratch = destination
        if isinstance(destination, torch.Tensor):
            scratch = torch.empty_strided(destination.size(), destination.stride(), dtype=destination.dtype)
        gather_rows(source, scratch, row_ids, check_range=True)

        def check() -> None:
            try:
                check_row_ids(row_ids, source.shape[0], source.shape[1])
            except InvalidArgumentError as error:
                raise InvalidArgumentError(f"replay: captured {error}; nothing was replayed") from None

        graph.record(CapturedOp("gather_resident_rows", lambda: gather_rows(source, destination, row_ids), check))

    def _enqueue_cache_op(self, name: str, run: Callable[[], None], check: Callable[[], None]) -> None:
        """Run a cache op now, or, while this thread captures, check its arguments and record it.

        The graph keeps references to the op's tensors, as a GPU graph keeps pointers: ids and plans
        written into them in place before a replay are what that replay reads. Arguments are checked at
        capture (so a bad call fails there, recording nothing) and again before each replay.

        Raises:
            InvalidArgumentError: an argument the op rejects (at capture, or at replay before anything ran).
        """
        graph = current_graph()
        if graph is None:
            run()
            return
        check()

        def check_again() -> None:
            try:
                check()
            except InvalidArgumentError as error:
                raise InvalidArgumentError(f"replay: captured {name}: {error}; nothing was replayed") from None

        graph.record(CapturedOp(name, run, check_again))

    def synchronize(self) -> None:
        """Wait for the swaps a :meth:`delay_next_swap` left in flight (returns at once when none is; every
        other piece of work on the host device has completed when its call returns).

        Raises:
            Exception: the first failure of a delayed swap, as a GPU stream reports an earlier fault.
        """
        self._delayed.drain()

    # ----------------------------------------------------------------- capture
    def is_current_stream_capturing(self) -> bool:
        """True inside :meth:`capture` on this thread (the CPU device's current stream is per thread)."""
        return current_graph() is not None

    @contextlib.contextmanager
    def capture(self) -> Iterator[CpuGraph]:
        """Capture this thread's swaps, gathers and cache ops; yields a :class:`CpuGraph` to ``replay()`` after.

        Raises:
            CaptureMisuseError: already capturing on this thread (nested capture).
        """
        with capture_graph() as graph:
            yield graph

    # ----------------------------------------------------------------- IPC events
    def create_ipc_event(self) -> CpuIpcEvent:
        """A new event other processes can import; its shared file lives until it is closed or collected.

        Raises:
            CaptureMisuseError: while capturing.
        """
        refuse_while_capturing("create_ipc_event")
        event = create_event(self.event_timeout_s)
        event.host_work = self._delayed
        return event

    def export_event(self, event: HalEvent) -> bytes:
        """Picklable bytes naming the event's shared file, its creator pid and a random token.

        Raises:
            InvalidArgumentError: not an event from :meth:`create_ipc_event` (an imported one included),
                or a closed one. CaptureMisuseError: while capturing.
        """
        refuse_while_capturing("export_event")
        if not isinstance(event, CpuIpcEvent) or not event.owner:
            raise InvalidArgumentError(
                f"export_event: expected an event from create_ipc_event, got {type(event).__name__}"
                + (" that was itself imported" if isinstance(event, CpuIpcEvent) else "")
            )
        if event.closed:
            raise InvalidArgumentError(f"export_event: event {event.name} is closed")
        return event.handle

    def import_event(self, device: torch.device | str, handle: bytes) -> CpuIpcEvent:
        """Open an event exported by another process.

        Raises:
            InvalidArgumentError: a non-CPU device; a malformed handle (naming the problem); a handle
                exported by this same process (import only works in another process, as on CUDA and
                HIP); an event whose exporter exited or closed it. CaptureMisuseError: while capturing.
        """
        refuse_while_capturing("import_event")
        try:
            target = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise InvalidArgumentError(f"import_event: {device!r} is not a device: {exc}") from None
        if target.type != "cpu":
            raise InvalidArgumentError(f"import_event: the CPU device imports events on 'cpu', got {target}")
        event = import_event(handle, self.event_timeout_s)
        event.host_work = self._delayed
        return event
