"""What the GPU runtime bindings share (``vendors/gpu/runtime.py``): the ``CopyRuntime`` protocol, zero-byte
descriptors left out of a batch, and failing indices mapped back to the caller's numbering."""

from __future__ import annotations

import torch

from hisparse_hal.regions import Region, RegionTable, SwapBatch
from hisparse_hal.testing.sim_hip_runtime import SimulatedHipRuntime
from hisparse_hal.vendors.cuda.runtime import CudaDriver
from hisparse_hal.vendors.gpu.runtime import SIZE_MAX, CopyRuntime, descriptor_index, nonempty_descriptors
from hisparse_hal.vendors.rocm.runtime import HipRuntime


def test_both_vendor_bindings_satisfy_the_copy_runtime_protocol() -> None:
    assert isinstance(CudaDriver(0, object()), CopyRuntime)
    hip = SimulatedHipRuntime("7.14").runtime()
    assert isinstance(hip, HipRuntime) and isinstance(hip, CopyRuntime)
    assert not isinstance(object(), CopyRuntime)


def _batch(sizes: list[int]) -> SwapBatch:
    table = RegionTable()
    table.add(Region(0x10000, 1 << 16, "explicit", "src"))
    table.add(Region(0x40000, 1 << 16, "explicit", "dst"))
    offsets = 256 * torch.arange(len(sizes), dtype=torch.int64)
    return table.check_swap_batch(0x10000 + offsets, 0x40000 + offsets, torch.tensor(sizes, dtype=torch.int64))


def test_nonempty_descriptors_keeps_a_batch_without_zero_sizes_as_is() -> None:
    batch = _batch([16, 32, 64])
    dst, src, sizes, positions = nonempty_descriptors(batch)
    assert positions is None and dst is batch.dst and src is batch.src and sizes is batch.sizes


def test_nonempty_descriptors_drops_zero_byte_copies_and_maps_failures_back() -> None:
    batch = _batch([16, 0, 0, 64, 0, 8])
    dst, src, sizes, positions = nonempty_descriptors(batch)
    assert sizes.tolist() == [16, 64, 8] and positions is not None and positions.tolist() == [0, 3, 5]
    assert dst.tolist() == [batch.dst[i].item() for i in (0, 3, 5)]
    assert [descriptor_index(k, 3, positions) for k in range(3)] == [0, 3, 5]


def test_descriptor_index_is_none_when_the_runtime_named_no_copy() -> None:
    assert descriptor_index(SIZE_MAX, 3, None) is None
    assert descriptor_index(3, 3, None) is None
    assert descriptor_index(2, 3, None) == 2
