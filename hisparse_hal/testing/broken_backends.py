"""Deliberately broken backends for the conformance suite's self-test: each is the CPU reference device
with ONE planted bug in one area. The suite must fail each of them, in that area.

Not simulators of any vendor: test doubles that prove the suite catches real classes of defect.
Build one with ``hisparse-hal conformance --factory broken_backends:<Class>`` (tests/ on the path).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import torch

from hisparse_hal.backend import _Pin
from hisparse_hal.cache_ops.bound import CacheOps
from hisparse_hal.capabilities import Capabilities
from hisparse_hal.host_registration import PAGE_BYTES, HostChunk, HostRegistration, plan_host_chunks
from hisparse_hal.kv_cache import KVCacheConfig
from hisparse_hal.regions import Region, SwapBatch
from hisparse_hal.vendors.cpu.backend import CpuBackend
from hisparse_hal.vendors.cpu.byte_copy import move_swap_batch
from hisparse_hal.vendors.cpu.graph import current_graph, refuse_while_capturing

__all__ = [
    "BROKEN",
    "MUST_FAIL",
    "SwapOneByteShort",
    "SwapDropsLastDescriptorOfChunk",
    "GatherConvertsValues",
    "GatherMinusOneReadsLastRow",
    "PinWithoutRollback",
    "CaptureRunsImmediately",
    "CapturingAlwaysFalse",
    "IpcWaitReturnsAtOnce",
    "UnstableCapabilities",
    "DeviceNoTensorReports",
    "ConfigAcceptsNonPositiveSizes",
    "StatsCounterNotZeroed",
    "CacheOpsCountDuplicatesAsMisses",
    "CacheOpsMissesDoNotSpill",
    "CacheOpsLruHitsBeforeFills",
    "SwapCrashesTheProcess",
]


class SwapOneByteShort(CpuBackend):
    """Swaps: the last descriptor of every batch copies one byte too few."""

    def _enqueue_swap(self, batch: SwapBatch) -> None:
        sizes = batch.sizes.clone()
        if int(sizes[-1]) > 0:
            sizes[-1] -= 1
        # size_range=None: the checked (uniform) bounds no longer describe the shortened sizes.
        super()._enqueue_swap(dataclasses.replace(batch, sizes=sizes, size_range=None))


class SwapDropsLastDescriptorOfChunk(CpuBackend):
    """Swaps: batches are chunked at 8192 descriptors and the last descriptor of each full chunk is lost."""

    def _enqueue_swap(self, batch: SwapBatch) -> None:
        for chunk in batch.chunks(8192):
            if chunk.count == 8192:
                chunk = SwapBatch(
                    chunk.src[:-1],
                    chunk.dst[:-1],
                    chunk.sizes[:-1],
                    chunk.src_region[:-1],
                    chunk.dst_region[:-1],
                    chunk.regions,
                )
            super()._enqueue_swap(chunk)


class GatherConvertsValues(CpuBackend):
    """Gathers: when dtypes differ, values are converted instead of the bytes being preserved."""

    def gather_resident_rows(self, source: torch.Tensor, destination: torch.Tensor, row_ids: torch.Tensor) -> None:
        if source.dtype == destination.dtype:
            return super().gather_resident_rows(source, destination, row_ids)
        rows = row_ids.to(torch.long).clamp_min(0)
        block_size = source.shape[1]
        payload = source[rows // block_size, rows % block_size].float()
        width = destination.shape[-1]
        destination.copy_(payload.reshape(len(rows), -1)[:, :width].to(destination.dtype).view(destination.shape))


class GatherMinusOneReadsLastRow(CpuBackend):
    """Gathers: id -1 is used as a Python index, so it reads the last row instead of row 0."""

    def gather_resident_rows(self, source: torch.Tensor, destination: torch.Tensor, row_ids: torch.Tensor) -> None:
        total = source.shape[0] * source.shape[1]
        fixed = torch.where(row_ids == -1, torch.full_like(row_ids, total - 1), row_ids)
        super().gather_resident_rows(source, destination, fixed)


class PinWithoutRollback(CpuBackend):
    """Pinning: chunks are registered one by one and, when one fails, the earlier ones stay registered."""

    def pin_tensor(self, tensor: torch.Tensor) -> None:
        refuse_while_capturing("pin_tensor")
        address, size = self._host_range(tensor, "pin_tensor")
        block = tensor[0].numel() * tensor.element_size() if tensor.dim() >= 2 else PAGE_BYTES
        if (address, size) in self._pins:
            return super().pin_tensor(tensor)  # the ordinary double-pin error
        chunks, regions = [], []
        for index, (a, s) in enumerate(plan_host_chunks(address, size, block, self.host_chunk_bytes)):
            alias = self._register_host_chunk(a, s, index)  # a failure here leaves earlier chunks behind
            chunks.append(HostChunk(a, s, alias))
            regions.append(self.regions.add(Region(a, s, "pinned_host", f"pinned {a:#x}", torch.device("cpu"), alias)))
            record = HostRegistration(address, size, tuple(chunks), True, None)
            self._pins[(address, size)] = _Pin(record, tuple(regions), tensor)
            self._publish_pins()


class CaptureRunsImmediately(CpuBackend):
    """Capture: a swap issued while capturing runs at once (and again on replay)."""

    def _enqueue_swap(self, batch: SwapBatch) -> None:
        if current_graph() is not None:
            move_swap_batch(batch)
        super()._enqueue_swap(batch)


class CapturingAlwaysFalse(CpuBackend):
    """Capture: ``is_current_stream_capturing`` never reports a capture."""

    def is_current_stream_capturing(self) -> bool:
        return False


class IpcWaitReturnsAtOnce(CpuBackend):
    """IPC events: ``wait``/``synchronize`` return without waiting for the record."""

    @staticmethod
    def _no_wait(event):
        event._wait_for = lambda *args, **kwargs: None
        return event

    def create_ipc_event(self):
        return self._no_wait(super().create_ipc_event())

    def import_event(self, device, handle):
        return self._no_wait(super().import_event(device, handle))


class UnstableCapabilities(CpuBackend):
    """Probe: every read of ``capabilities`` returns a different value."""

    _reads = 0

    @property
    def capabilities(self) -> Capabilities:
        type(self)._reads += 1
        base = super().capabilities
        return dataclasses.replace(base, reasons={**base.reasons, "versions": f"read {type(self)._reads}"})


class DeviceNoTensorReports(CpuBackend):
    """Probe: ``device`` is ``cpu:0``, which no tensor reports (a tensor made there says ``cpu``)."""

    @property
    def device(self) -> torch.device:
        return torch.device("cpu", 0)


class ConfigAcceptsNonPositiveSizes(CpuBackend):
    """KV config: a config with a zero or negative block count, block size or row width is accepted."""

    def validate_kv_cache_config(self, kv_cache_config: KVCacheConfig) -> None:
        if min(kv_cache_config.num_blocks, kv_cache_config.block_size, kv_cache_config.row_width) <= 0:
            return
        super().validate_kv_cache_config(kv_cache_config)


class _StatsNotZeroedOps(CacheOps):
    def new_stats_counter(self) -> torch.Tensor:
        counter = super().new_stats_counter()
        counter.view(torch.int64).fill_(7)  # what torch.empty can hand back on a GPU
        return counter


class StatsCounterNotZeroed(CpuBackend):
    """Stats: ``new_stats_counter`` is allocated but not zeroed (leftover values instead of ``[0, 0]``)."""

    def create_cache_ops(self, runtime: Any) -> CacheOps:
        return _StatsNotZeroedOps(self, runtime)


def _runs(request_ids: torch.Tensor | None, rows: int) -> list[range]:
    """Consecutive batch rows of one request (a run); every row is its own run without request ids."""
    if request_ids is None:
        return [range(r, r + 1) for r in range(rows)]
    ids, runs, start = request_ids.tolist(), [], 0
    for r in range(1, rows + 1):
        if r == rows or ids[r] != ids[start]:
            runs.append(range(start, r))
            start = r
    return runs


class _MisplannedResolveOps(CacheOps):
    """Runs the real resolve, then applies ``distort(args)`` to its outputs (a planted bug in one output)."""

    distort: Callable[[tuple[Any, ...]], None]

    def __post_init__(self) -> None:
        super().__post_init__()
        real = self._entries

        def resolve_residency(*args: Any) -> None:
            dgi_before = args[5].clone()
            real.resolve_residency(*args)
            type(self).distort((*args, dgi_before))

        object.__setattr__(self, "_entries", dataclasses.replace(real, resolve_residency=resolve_residency))


# vLLM 0.34.0 positions of resolve's arguments the distortions touch.
_HOT, _STATS, _REQUEST_IDS, _SWAP_DEVICE, _SWAP_COUNTS = 4, 10, 13, 18, 19


def _duplicates_as_misses(args: tuple[Any, ...]) -> None:
    """Every later reference, in its run, to a hot row loaded this step is counted as a miss, not a hit."""
    hot_indices, stats, request_ids = args[_HOT], args[_STATS], args[_REQUEST_IDS]
    swap_device, swap_counts = args[_SWAP_DEVICE], args[_SWAP_COUNTS]
    if stats is None or swap_counts is None:
        return
    top_k = hot_indices.shape[1]
    moved = 0
    for run in _runs(request_ids, hot_indices.shape[0]):
        loads = sum(max(int(c), 0) for c in swap_counts[run.start:run.stop].tolist())
        loaded = set(swap_device.reshape(-1)[run.start * top_k:run.start * top_k + loads].tolist())
        seen: set[int] = set()
        for h in hot_indices[run.start:run.stop].reshape(-1).tolist():
            if h >= 0 and h in loaded:
                moved += h in seen
                seen.add(h)
    stats.view(torch.int64).add_(torch.tensor([-moved, moved], device=stats.device))


def _no_spill_into_later_rows(args: tuple[Any, ...]) -> None:
    global_indices, swap_counts, request_ids = args[3], args[_SWAP_COUNTS], args[_REQUEST_IDS]
    if swap_counts is None:
        return
    for run in _runs(request_ids, global_indices.shape[0]):
        swap_counts[run.start + 1:run.stop] = 0


def _hits_before_fills_in_lru(args: tuple[Any, ...]) -> None:
    """The LRU row becomes [unused evictables, hits, filled slots] instead of [unused, filled, hits]."""
    dgi, lru, dgi_before = args[5], args[6], args[-1]
    for state in range(dgi.shape[0]):
        filled = {s for s in range(dgi.shape[1]) if int(dgi[state, s]) != int(dgi_before[state, s])}
        order = lru[state].tolist()
        last = max((i for i, slot in enumerate(order) if slot in filled), default=None)
        if last is None:
            continue
        head, hits = order[:last + 1], order[last + 1:]
        new = [x for x in head if x not in filled] + hits + [x for x in head if x in filled]
        lru[state] = torch.tensor(new, dtype=lru.dtype, device=lru.device)


class _LruHitsFirstOps(_MisplannedResolveOps):
    distort = staticmethod(_hits_before_fills_in_lru)


class CacheOpsLruHitsBeforeFills(CpuBackend):
    """Cache ops: the LRU order puts the step's hits before its newly filled slots (fills evicted later)."""

    def create_cache_ops(self, runtime: Any) -> CacheOps:
        return _LruHitsFirstOps(self, runtime)


class _DuplicatesOps(_MisplannedResolveOps):
    distort = staticmethod(_duplicates_as_misses)


class _NoSpillOps(_MisplannedResolveOps):
    distort = staticmethod(_no_spill_into_later_rows)


class CacheOpsCountDuplicatesAsMisses(CpuBackend):
    """Cache ops: a page referenced twice in a run counts two misses (the second reference is a hit)."""

    def create_cache_ops(self, runtime: Any) -> CacheOps:
        return _DuplicatesOps(self, runtime)


class CacheOpsMissesDoNotSpill(CpuBackend):
    """Cache ops: a run's misses beyond its first row's top-k are not counted in the later rows' swap lists."""

    def create_cache_ops(self, runtime: Any) -> CacheOps:
        return _NoSpillOps(self, runtime)


class SwapRingOverwritesEvery256thBatch(CpuBackend):
    """Scenario: swaps pass through a 256-slot ring that overwrites its oldest slot, so every 256th batch is
    lost; only a long run sees it (ROCm 7.2's 32-slot IPC ring is the real-world shape of such a bug)."""

    _batches = 0

    def _enqueue_swap(self, batch: SwapBatch) -> None:
        self._batches += 1
        if self._batches % 256:
            super()._enqueue_swap(batch)


class SwapCrashesTheProcess(CpuBackend):
    """Swaps: the copy dereferences address 0, killing the process (as a fault in a vendor library would)."""

    def _enqueue_swap(self, batch: SwapBatch) -> None:
        import ctypes
        import faulthandler

        faulthandler.disable()  # keep the test log short; the runner reports the crash
        ctypes.string_at(0)


class VersionsDifferPerProcess(CpuBackend):
    """Run record: each process that builds it reports another runtime version (``capabilities.versions`` names
    the process id), as workers on different GPUs or drivers would; every test passes, the run must not."""

    @property
    def capabilities(self) -> Capabilities:
        base = super().capabilities
        return dataclasses.replace(base, versions={**base.versions, "runtime": f"process {os.getpid()}"})


class CrashesAndVersionsDifferPerProcess(VersionsDifferPerProcess, SwapCrashesTheProcess):
    """Run record: a swap kills the process and the process the runner resumes with reports another runtime
    version (a driver updated, or another GPU picked, between a crash and its resume)."""


#: Each broken backend, the area the suite must fail it in, and a -k expression that reaches its bug.
BROKEN = {
    "SwapOneByteShort": ("swaps", "swaps"),
    "SwapDropsLastDescriptorOfChunk": ("swaps", "swaps"),
    "GatherConvertsValues": ("gathers", "gathers"),
    "GatherMinusOneReadsLastRow": ("gathers", "gathers"),
    "PinWithoutRollback": ("pinning", "pinning"),
    "CaptureRunsImmediately": ("capture", "capture"),
    # Caught in the probe tier (graph_capture is declared but capture is never reported), which gates the rest.
    "CapturingAlwaysFalse": ("probe", "capture or probe"),
    "IpcWaitReturnsAtOnce": ("ipc", "test_ipc"),
    "UnstableCapabilities": ("probe", "probe or stats"),
    "DeviceNoTensorReports": ("probe", "probe or stats"),
    "ConfigAcceptsNonPositiveSizes": ("config", "test_config"),
    "StatsCounterNotZeroed": ("stats", "test_stats or test_config"),
    "CacheOpsCountDuplicatesAsMisses": ("cache_ops", "test_cache_ops"),
    "CacheOpsMissesDoNotSpill": ("cache_ops", "test_cache_ops"),
    "CacheOpsLruHitsBeforeFills": ("cache_ops", "test_cache_ops"),
    "SwapRingOverwritesEvery256thBatch": ("scenario", "1000_steps_on_the_event_free_barrier_path"),
}

#: Tests that must be among the failures of a broken backend, where its area has more than one way to catch it.
MUST_FAIL = {
    # The pending-record test catches it too; this one proves the pool's bytes are ordered by the event alone.
    "IpcWaitReturnsAtOnce": ("test_ipc.py::test_ipc_consumer_reads_exactly_the_bytes_written_before_the_record",),
}
