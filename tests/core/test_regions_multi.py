"""Swap batches whose sides spread over many regions (an engine's layers): the bucketed check.

Each case compares the table's verdict with a per-descriptor Python reference, and checks that a valid
engine-shaped batch is proven without the per-descriptor ``searchsorted`` fallback.
"""

from __future__ import annotations

import random

import pytest
import torch

from hisparse_hal import regions as regions_module
from hisparse_hal.errors import InvalidDescriptorError
from hisparse_hal.regions import MAX_ADDRESS, Region, RegionTable

BLOCK = 656
LAYERS = 61
LAYER_BASE = 0x7000_0000_0000
HOST_BASE = 0x7F00_0000_0000


def _i64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _engine_table(layers: int = LAYERS, blocks: int = 100, gap: int = BLOCK, order=None) -> RegionTable:
    """``layers`` layer regions of ``blocks`` blocks, ``gap`` bytes apart, added in ``order``, plus a host pool."""
    table = RegionTable()
    for i in order if order is not None else range(layers):
        table.add(Region(LAYER_BASE + i * (blocks * BLOCK + gap), blocks * BLOCK, "device_cache", f"layer.{i}"))
    table.add(Region(HOST_BASE, 1 << 30, "pinned_host", "pool"))
    return table


def _layer_address(layer: int, block: int, blocks: int = 100, gap: int = BLOCK) -> int:
    return LAYER_BASE + layer * (blocks * BLOCK + gap) + block * BLOCK


def _spill(count: int, seed: int, blocks: int = 100, gap: int = BLOCK):
    """An engine spill: block ``i`` of every layer in turn, to consecutive host blocks."""
    rng = random.Random(seed)
    src = [_layer_address(rng.randrange(LAYERS), rng.randrange(blocks), blocks, gap) for _ in range(count)]
    dst = [HOST_BASE + i * BLOCK for i in range(count)]
    return src, dst, [BLOCK] * count


def _reference(regions: list[Region], src, dst, sizes):
    """``(first bad index or None, source region indices)`` by a per-descriptor loop over sorted regions."""
    ordered = sorted(regions, key=lambda r: r.start)
    found = []
    for i, (s, d, n) in enumerate(zip(src, dst, sizes, strict=True)):
        if n < 0:
            return i, None
        indices = [k for k, r in enumerate(ordered) for a in (s,) if r.start <= a and a + n <= r.end]
        if not indices or not any(r.start <= d and d + n <= r.end for r in ordered):
            return i, None
        found.append(indices[0])
    return None, found


def _forbid_fallback(monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("a valid multi-region batch took the per-descriptor fallback")

    monkeypatch.setattr(RegionTable, "_check_each", fail)


def test_engine_spill_over_61_layers_is_proven_by_the_bucket_table(monkeypatch):
    table = _engine_table()
    src, dst, sizes = _spill(8192 + 100, seed=1)  # past one check piece
    _forbid_fallback(monkeypatch)
    batch = table.check_swap_batch(_i64(src), _i64(dst), _i64(sizes))
    assert batch.src_region.tolist() == _reference(list(table), src, dst, sizes)[1]
    assert set(batch.dst_region.tolist()) == {LAYERS}
    assert batch.size_bounds() == (BLOCK, BLOCK)


def test_unsorted_registration_order_gives_the_same_region_indices(monkeypatch):
    order = list(range(LAYERS))
    random.Random(5).shuffle(order)
    table = _engine_table(order=order)
    src, dst, sizes = _spill(500, seed=2)
    _forbid_fallback(monkeypatch)
    batch = table.check_swap_batch(_i64(src), _i64(dst), _i64(sizes))
    labels = [table_region.label for table_region in (batch.regions[k] for k in batch.src_region.tolist())]
    expected = [f"layer.{(a - LAYER_BASE) // (100 * BLOCK + BLOCK)}" for a in src]
    assert labels == expected


def test_descriptor_straddling_two_adjacent_layers_is_rejected_naming_it():
    table = _engine_table(gap=0)  # layers touch: the straddling range covers known bytes on both sides
    src, dst, sizes = _spill(300, seed=3, gap=0)
    src[117] = _layer_address(20, 99, gap=0) + 8  # the last block of layer 20, 8 bytes into layer 21
    with pytest.raises(InvalidDescriptorError, match=r"swap descriptor 117: source range .* runs past the end of "
                       r"region 'layer.20' .* by 8 bytes; nothing was copied") as info:
        table.check_swap_batch(_i64(src), _i64(dst), _i64(sizes))
    assert info.value.index == 117


def test_descriptor_in_the_gap_between_layers_is_rejected_naming_it():
    table = _engine_table(gap=4096)
    src, dst, sizes = _spill(300, seed=4, gap=4096)
    src[42] = _layer_address(30, 99, gap=4096) + 8  # 8 bytes past layer 30, into the gap before layer 31
    with pytest.raises(InvalidDescriptorError, match=r"swap descriptor 42: source range .* runs past the end of "
                       r"region 'layer.30' .* by 8 bytes") as info:
        table.check_swap_batch(_i64(src), _i64(dst), _i64(sizes))
    assert info.value.index == 42
    src[42] = _layer_address(30, 100, gap=4096) + 2048  # wholly inside the gap
    with pytest.raises(InvalidDescriptorError, match=r"swap descriptor 42: source range .* is not inside any "
                       r"known region"):
        table.check_swap_batch(_i64(src), _i64(dst), _i64(sizes))


def test_first_bad_index_is_reported_when_several_layers_hold_bad_descriptors():
    table = _engine_table()
    src, dst, sizes = _spill(9000, seed=6)
    src[8500] = _layer_address(60, 100)  # past the last layer
    src[3000] = _layer_address(5, 99) + BLOCK // 2  # overruns layer 5
    sizes[6000] = -1
    with pytest.raises(InvalidDescriptorError, match=r"swap descriptor 3000: source range .*'layer.5'") as info:
        table.check_swap_batch(_i64(src), _i64(dst), _i64(sizes))
    assert info.value.index == 3000


def test_destination_side_spread_over_layers_is_checked_too():
    table = _engine_table()
    dst, src, sizes = _spill(400, seed=7)  # a fetch: host blocks back into every layer
    batch = table.check_swap_batch(_i64(src), _i64(dst), _i64(sizes))
    assert batch.dst_region.tolist() == _reference(list(table), dst, src, sizes)[1]
    dst[399] = _layer_address(7, 100) + 1
    with pytest.raises(InvalidDescriptorError, match=r"swap descriptor 399: destination range"):
        table.check_swap_batch(_i64(src), _i64(dst), _i64(sizes))


def test_region_change_rebuilds_the_bucket_table():
    table = _engine_table()
    src, dst, sizes = _spill(200, seed=8)
    table.check_swap_batch(_i64(src), _i64(dst), _i64(sizes))
    gone = next(r for r in table if r.label == "layer.9")
    table.remove(gone)
    src[150] = _layer_address(9, 3)
    first = next(i for i, a in enumerate(src) if gone.start <= a < gone.end)
    with pytest.raises(InvalidDescriptorError, match=rf"swap descriptor {first}: source range .* is not inside any"):
        table.check_swap_batch(_i64(src), _i64(dst), _i64(sizes))
    table.add(gone)
    assert table.check_swap_batch(_i64(src), _i64(dst), _i64(sizes)).count == 200


def test_layout_too_fine_for_a_bucket_table_falls_back_and_stays_exact():
    table = RegionTable()
    table.add(Region(0x1000, 1, "explicit", "tiny"))  # one byte beside a 4 GiB region: 2**32 buckets
    table.add(Region(0x1001, 1 << 32, "explicit", "large"))
    table.add(Region(HOST_BASE, 1 << 20, "pinned_host", "pool"))
    src, dst, sizes = [0x1000, 0x1001 + (1 << 31)], [HOST_BASE, HOST_BASE + 64], [1, 64]
    assert table.check_swap_batch(_i64(src), _i64(dst), _i64(sizes)).src_region.tolist() == [0, 1]
    with pytest.raises(InvalidDescriptorError, match="swap descriptor 0: source range"):
        table.check_swap_batch(_i64(src), _i64(dst), _i64([2, 64]))


def test_regions_at_the_top_of_the_address_space_do_not_overflow():
    top = MAX_ADDRESS - (1 << 40)
    table = RegionTable()
    for i in range(4):
        table.add(Region(top + i * (1 << 38), 1 << 37, "explicit", f"high.{i}"))
    table.add(Region(0x1000, 1 << 20, "pinned_host", "pool"))
    src = [top + i * (1 << 38) + 64 for i in range(4)]
    dst = [0x1000 + 64 * i for i in range(4)]
    assert table.check_swap_batch(_i64(src), _i64(dst), _i64([64] * 4)).src_region.tolist() == [1, 2, 3, 4]
    with pytest.raises(InvalidDescriptorError, match="swap descriptor 1: source range"):
        table.check_swap_batch(_i64(src), _i64(dst), _i64([64, MAX_ADDRESS, 64, 64]))


@pytest.mark.parametrize("seed", range(40))
def test_random_layouts_and_batches_agree_with_a_per_descriptor_reference(seed):
    rng = random.Random(seed)
    table, known = RegionTable(), []
    address = rng.randrange(0, 1 << 20)
    for i in range(rng.randrange(2, 70)):
        size = rng.choice([BLOCK * rng.randrange(1, 40), rng.randrange(1, 5000)])
        known.append(Region(address, size, "explicit", f"r{i}"))
        address += size + rng.choice([0, 0, rng.randrange(1, 3000)])
    rng.shuffle(known)
    for region in known:
        table.add(region)
    ordered = sorted(known, key=lambda r: r.start)
    count = rng.randrange(1, 300)
    src, dst, sizes = [], [], []
    for _ in range(count):
        size = rng.randrange(0, 300)
        a, b = rng.choice(ordered), rng.choice(ordered)
        src.append(a.start + rng.randrange(0, max(1, a.size - size + 1)))
        dst.append(b.start + rng.randrange(0, max(1, b.size - size + 1)))
        sizes.append(size)
    if rng.random() < 0.6:  # spoil some descriptors
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(count)
            choice = rng.randrange(3)
            if choice == 0:
                src[i] = rng.choice(ordered).end - rng.randrange(0, 50)
                sizes[i] = max(sizes[i], 51)
            elif choice == 1:
                dst[i] = ordered[-1].end + rng.randrange(0, 100)
            else:
                sizes[i] = -rng.randrange(1, 10)
    bad, expected = _reference(known, src, dst, sizes)
    if bad is None:
        batch = table.check_swap_batch(_i64(src), _i64(dst), _i64(sizes))
        assert batch.src_region.tolist() == expected
    else:
        with pytest.raises(InvalidDescriptorError, match=rf"swap descriptor {bad}\b") as info:
            table.check_swap_batch(_i64(src), _i64(dst), _i64(sizes))
        assert info.value.index == bad


def test_bucket_table_size_is_bounded():
    table = _engine_table()
    src, dst, sizes = _spill(100, seed=9)
    table.check_swap_batch(_i64(src), _i64(dst), _i64(sizes))
    lookups = [lookup for lookup in table._view.lookups.values() if lookup is not None]
    assert lookups and all(lookup.table.numel() <= regions_module.MAX_BUCKETS for lookup in lookups)
