"""Deliberately broken backends for the conformance suite's self-test: each is the CPU reference device
with ONE planted bug in one area. The suite must fail each of them, in that area.

Not simulators of any vendor: test doubles that prove the suite catches real classes of defect.
Build one with ``hisparse-hal conformance --factory broken_backends:<Class>`` (tests/ on the path).
"""

from __future__ import annotations

import dataclasses

import torch

from hisparse_hal.capabilities import Capabilities
from hisparse_hal.host_registration import PAGE_BYTES, HostChunk, HostRegistration, plan_host_chunks
from hisparse_hal.regions import Region, SwapBatch
from hisparse_hal.vendors.cpu.backend import CpuBackend
from hisparse_hal.vendors.cpu.byte_copy import move_swap_batch
from hisparse_hal.vendors.cpu.graph import current_graph, refuse_while_capturing

__all__ = ["BROKEN", "MUST_FAIL", "SwapOneByteShort", "SwapDropsLastDescriptorOfChunk", "GatherConvertsValues", "GatherMinusOneReadsLastRow",
           "PinWithoutRollback", "CaptureRunsImmediately", "CapturingAlwaysFalse", "IpcWaitReturnsAtOnce", "UnstableCapabilities", "DeviceNoTensorReports",
           "SwapCrashesTheProcess"]


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
                chunk = SwapBatch(chunk.src[:-1], chunk.dst[:-1], chunk.sizes[:-1], chunk.src_region[:-1], chunk.dst_region[:-1], chunk.regions)
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
            self._pins[(address, size)] = (HostRegistration(address, size, tuple(chunks), True, None), tuple(regions))


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
        return dataclasses.replace(base, notes=base.notes + (f"read {type(self)._reads}",))


class DeviceNoTensorReports(CpuBackend):
    """Probe: ``device`` is ``cpu:0``, which no tensor reports (a tensor made there says ``cpu``)."""

    @property
    def device(self) -> torch.device:
        return torch.device("cpu", 0)


class SwapCrashesTheProcess(CpuBackend):
    """Swaps: the copy dereferences address 0, killing the process (as a fault in a vendor library would)."""

    def _enqueue_swap(self, batch: SwapBatch) -> None:
        import ctypes
        import faulthandler

        faulthandler.disable()  # keep the test log short; the runner reports the crash
        ctypes.string_at(0)


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
}

#: Tests that must be among the failures of a broken backend, where its area has more than one way to catch it.
MUST_FAIL = {
    # The pending-record test catches it too; this one proves the pool's bytes are ordered by the event alone.
    "IpcWaitReturnsAtOnce": ("test_ipc.py::test_ipc_consumer_reads_exactly_the_bytes_written_before_the_record",),
}
