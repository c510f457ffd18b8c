"""One-pass gathers match the reference semantics, preserve bytes, and reject bad ids."""

from __future__ import annotations

import pytest
import torch

from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.gather import gather_rows, reference_gather_rows


def _ids(values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_gather_matches_reference_for_int32_and_int64_ids(dtype):
    source = torch.randn(6, 4, 8)
    ids = _ids([0, 23, 5, 17, -1, 4], dtype)
    out, ref = torch.full((6, 8), float("nan")), torch.empty(6, 8)
    gather_rows(source, out, ids)
    reference_gather_rows(source, ref, ids)
    assert torch.equal(out, ref)
    assert torch.equal(out[4], source[0, 0])  # -1 reads row 0


def test_gather_from_padded_strided_source_matches_reference():
    padded = torch.randn(5, 3, 4, 8)
    source = padded[:, 1]  # every block skips two other layers' rows
    assert not source.is_contiguous()
    ids = _ids([19, 0, 7, 12])
    out, ref = torch.empty(4, 8), torch.empty(4, 8)
    gather_rows(source, out, ids)
    reference_gather_rows(source, ref, ids)
    assert torch.equal(out, ref)


@pytest.mark.parametrize(
    "src_dtype, dst_dtype, width",
    [(torch.bfloat16, torch.uint8, 16), (torch.uint8, torch.bfloat16, 32), (torch.float8_e4m3fn, torch.uint8, 16)],
)
def test_dtype_mismatch_preserves_bytes(src_dtype, dst_dtype, width):
    raw = torch.randint(0, 256, (3, 4, width), dtype=torch.uint8)
    source = raw.view(src_dtype)
    ids = _ids([11, 2, -1])
    out_width = source.shape[-1] * source.element_size() // torch.empty((), dtype=dst_dtype).element_size()
    out = torch.empty(3, out_width, dtype=dst_dtype)
    gather_rows(source, out, ids)
    assert torch.equal(out.view(torch.uint8).view(3, -1)[0], raw.view(12, -1)[11])
    ref = torch.empty_like(out)
    reference_gather_rows(source, ref, ids)
    assert torch.equal(out.view(torch.uint8), ref.view(torch.uint8))


def test_ds_mla_656_byte_rows_are_gathered_exactly():
    source = torch.randint(0, 256, (8, 16, 656), dtype=torch.uint8)
    ids = torch.randperm(128)[:40]
    out = torch.empty(40, 656, dtype=torch.uint8)
    gather_rows(source, out, ids)
    assert torch.equal(out, source.view(128, 656)[ids])


@pytest.mark.parametrize("bad", [24, -2])
def test_out_of_range_id_is_a_typed_error_naming_index_and_value(bad):
    source = torch.randn(3, 8, 4)
    out = torch.full((3, 4), 7.0)
    with pytest.raises(
        InvalidArgumentError,
        match=rf"row_ids\[1\] = {bad} is out of range: ids must be -1 \(not resident\) or in \[0, 24\)",
    ):
        gather_rows(source, out, _ids([0, bad, 1]))
    assert torch.all(out == 7.0)


def test_destination_of_wrong_width_is_rejected():
    with pytest.raises(InvalidArgumentError, match=r"does not hold 2 rows of 4"):
        gather_rows(torch.randn(2, 2, 4), torch.empty(2, 5), _ids([0, 1]))


def test_float_ids_are_rejected():
    with pytest.raises(InvalidArgumentError, match="row_ids must be int32 or int64, got torch.float32"):
        gather_rows(torch.randn(2, 2, 4), torch.empty(2, 4), torch.tensor([0.0, 1.0]))


def test_two_dimensional_source_is_rejected():
    with pytest.raises(
        InvalidArgumentError, match=r"source must be \[num_blocks, block_size, row_width\], got shape \(4, 4\)"
    ):
        gather_rows(torch.randn(4, 4), torch.empty(1, 4), _ids([0]))


def test_reinterpreting_non_contiguous_rows_is_rejected():
    source = torch.randn(2, 2, 8, dtype=torch.float32)[:, :, ::2]
    with pytest.raises(InvalidArgumentError, match="rows must be contiguous to reinterpret"):
        gather_rows(source, torch.empty(1, 16, dtype=torch.uint8), _ids([0]))


@pytest.mark.parametrize("rows", [slice(0, 2), slice(3, 5), slice(46, 48)])
def test_gather_into_a_destination_overlapping_the_source_is_a_typed_error_and_writes_nothing(rows):
    storage = torch.arange(48 * 8, dtype=torch.float32)
    source = storage.view(6, 8, 8)  # 48 rows of 8 floats
    destination = storage.view(48, 8)[rows]
    before = storage.clone()
    start = destination.data_ptr()
    expected = rf"gather destination \[{start:#x}, {start + 64:#x}\) overlaps the source"
    with pytest.raises(InvalidArgumentError, match=expected):
        gather_rows(source, destination, _ids([10, 20]))
    assert torch.equal(storage, before)


def test_gather_into_a_destination_that_requires_grad_is_a_typed_error():
    destination = torch.zeros(2, 8, requires_grad=True)
    with pytest.raises(InvalidArgumentError, match=r"gather destination \(2, 8\) \(torch.float32\) requires grad"):
        gather_rows(torch.randn(2, 4, 8), destination, _ids([1, 2]))
    assert not destination.detach().any()
