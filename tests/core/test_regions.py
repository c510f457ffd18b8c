"""The vectorized check of swap descriptors against known regions."""

from __future__ import annotations

import pytest
import torch

from hisparse_hal.errors import InvalidArgumentError, InvalidDescriptorError
from hisparse_hal.regions import Region, RegionTable

BASE = 0x10000


def _table() -> RegionTable:
    table = RegionTable()
    table.add(Region(BASE, 4096, "device_cache", "cache"))
    table.add(Region(BASE + 8192, 4096, "pinned_host", "pool"))
    return table


def _i64(values):
    return torch.tensor(values, dtype=torch.int64)


def test_valid_batch_records_region_of_each_descriptor():
    batch = _table().check_swap_batch(_i64([BASE, BASE + 100]), _i64([BASE + 8192, BASE + 9000]), _i64([100, 96]))
    assert batch.count == 2
    assert batch.src_region.tolist() == [0, 0] and batch.dst_region.tolist() == [1, 1]
    assert batch.uniform_size() is None


def test_batch_holds_copies_so_caller_may_reuse_its_arrays():
    src, dst, sizes = _i64([BASE]), _i64([BASE + 8192]), _i64([64])
    batch = _table().check_swap_batch(src, dst, sizes)
    src[0] = 0
    assert int(batch.src[0]) == BASE


def test_empty_batch_is_valid():
    batch = _table().check_swap_batch(_i64([]), _i64([]), _i64([]))
    assert batch.count == 0


def test_descriptor_straddling_region_end_names_index_and_overrun():
    with pytest.raises(
        InvalidDescriptorError,
        match=r"swap descriptor 1: destination range .* runs past the end of region 'pool' .* by 1 bytes; "
        r"nothing was copied",
    ) as info:
        _table().check_swap_batch(_i64([BASE, BASE]), _i64([BASE + 8192, BASE + 8192 + 4000]), _i64([16, 97]))
    assert info.value.index == 1


def test_descriptor_outside_every_region_is_rejected():
    with pytest.raises(
        InvalidDescriptorError,
        match=r"swap descriptor 0: source range \[0x5000, 0x5010\) \(16 bytes\) is not inside any known region",
    ):
        _table().check_swap_batch(_i64([0x5000]), _i64([BASE + 8192]), _i64([16]))


def test_descriptor_spanning_two_adjacent_regions_is_rejected():
    table = RegionTable()
    table.add(Region(BASE, 4096, "pinned_host", "chunk 1/2"))
    table.add(Region(BASE + 4096, 4096, "pinned_host", "chunk 2/2"))
    with pytest.raises(InvalidDescriptorError, match="runs past the end of region 'chunk 1/2'"):
        table.check_swap_batch(_i64([BASE + 4000]), _i64([BASE + 6000]), _i64([200]))


def test_negative_size_is_rejected_with_index():
    with pytest.raises(InvalidDescriptorError, match="swap descriptor 2 has negative size -8") as info:
        _table().check_swap_batch(_i64([BASE] * 3), _i64([BASE + 8192] * 3), _i64([8, 8, -8]))
    assert info.value.index == 2


def test_huge_size_does_not_overflow_into_acceptance():
    with pytest.raises(InvalidDescriptorError, match="swap descriptor 0"):
        _table().check_swap_batch(_i64([BASE]), _i64([BASE + 8192]), _i64([2**63 - 1]))


@pytest.mark.parametrize(
    "src, dst, sizes, message",
    [
        ([BASE], [BASE], [1, 2], r"equal lengths, got src=1, dst=1, sizes=2"),
        (torch.tensor([BASE], dtype=torch.int32), [BASE], [1], r"'src' must have dtype torch.int64, got torch.int32"),
        ([[BASE]], [BASE], [1], r"'src' must be 1-D, got shape \(1, 1\)"),
        ([BASE], [BASE], "8", r"'sizes' must be a torch.Tensor, got str"),
    ],
)
def test_malformed_descriptor_arrays_are_rejected(src, dst, sizes, message):
    as_tensor = lambda v: v if not isinstance(v, list) else _i64(v)  # noqa: E731
    with pytest.raises(InvalidDescriptorError, match=message):
        _table().check_swap_batch(as_tensor(src), as_tensor(dst), as_tensor(sizes))


def test_overlapping_region_is_rejected_naming_both():
    table = _table()
    with pytest.raises(InvalidArgumentError, match=r"region 'new' .* overlaps known region 'cache'"):
        table.add(Region(BASE + 4000, 100, "explicit", "new"))


def test_chunks_split_at_cap_and_keep_order():
    table = _table()
    batch = table.check_swap_batch(_i64(list(range(BASE, BASE + 10))), _i64([BASE + 8192] * 10), _i64([1] * 10))
    chunks = list(batch.chunks(4))
    assert [c.count for c in chunks] == [4, 4, 2]
    assert torch.cat([c.src for c in chunks]).tolist() == batch.src.tolist()
    assert list(batch.chunks(None))[0] is batch


@pytest.mark.parametrize("start,size", [(BASE, 2**64), (2**63 - 10, 100), (2**64, 5)])
def test_region_ending_past_the_int64_address_space_is_rejected_and_not_kept(start, size):
    table = _table()
    expected = rf"region 'huge' \[{start:#x}, {start + size:#x}\) ends beyond the largest"
    with pytest.raises(InvalidArgumentError, match=expected):
        table.add(Region(start, size, "explicit", "huge"))
    assert [r.label for r in table] == ["cache", "pool"]
    # The table still checks descriptors (no stale lookup arrays).
    assert table.check_swap_batch(_i64([BASE]), _i64([BASE + 8192]), _i64([16])).count == 1
