"""gather_resident_rows on the CPU reference device, compared with the reference semantics."""

from __future__ import annotations

import pytest
import torch

from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.gather import reference_gather_rows
from hisparse_hal.vendors.cpu.backend import CpuBackend


@pytest.fixture
def backend() -> CpuBackend:
    return CpuBackend()


def _source(blocks: int = 8, block_size: int = 4, width: int = 656, dtype=torch.uint8) -> torch.Tensor:
    raw = torch.randint(0, 256, (blocks, block_size, width * torch.empty((), dtype=dtype).element_size()),
                        dtype=torch.uint8, generator=torch.Generator().manual_seed(blocks))
    return raw.view(dtype)


@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_gather_matches_the_reference_for_656_byte_rows(backend, id_dtype):
    source = _source()
    ids = torch.tensor([5, 0, 31, 12, 7, 7], dtype=id_dtype)
    out, expected = torch.zeros(6, 656, dtype=torch.uint8), torch.zeros(6, 656, dtype=torch.uint8)
    backend.gather_resident_rows(source, out, ids)
    reference_gather_rows(source, expected, ids)
    assert torch.equal(out, expected)


def test_gather_reads_row_zero_for_non_resident_ids(backend):
    source = _source()
    out = torch.zeros(2, 656, dtype=torch.uint8)
    backend.gather_resident_rows(source, out, torch.tensor([-1, 3]))
    assert torch.equal(out[0], source[0, 0]) and torch.equal(out[1], source[0, 3])


def test_gather_from_a_strided_per_layer_source(backend):
    both_layers = _source(blocks=8, block_size=4, width=128, dtype=torch.bfloat16).view(8, 4, 2, 64)
    layer = both_layers[:, :, 1, :]  # padded rows: every other 64-element slice
    ids = torch.tensor([0, 9, 31, -1, 17])
    out, expected = torch.zeros(5, 64, dtype=torch.bfloat16), torch.zeros(5, 64, dtype=torch.bfloat16)
    backend.gather_resident_rows(layer, out, ids)
    reference_gather_rows(layer, expected, ids)
    assert torch.equal(out.view(torch.int16), expected.view(torch.int16))


@pytest.mark.parametrize(
    "source_dtype, destination_dtype, width",
    [(torch.bfloat16, torch.uint8, 64), (torch.uint8, torch.bfloat16, 128), (torch.uint8, torch.float8_e4m3fn, 656)],
)
def test_gather_preserves_bytes_when_dtypes_differ(backend, source_dtype, destination_dtype, width):
    source = _source(width=width, dtype=source_dtype)
    row_bytes = width * source.element_size()
    ids = torch.tensor([3, 30, 1])
    out = torch.zeros(3, row_bytes // torch.empty((), dtype=destination_dtype).element_size(), dtype=destination_dtype)
    backend.gather_resident_rows(source, out, ids)
    rows = source.reshape(32, width).view(torch.uint8)[ids]
    assert torch.equal(out.view(torch.uint8), rows)


def test_gather_rejects_out_of_range_ids_and_writes_nothing(backend):
    out = torch.zeros(2, 656, dtype=torch.uint8)
    with pytest.raises(InvalidArgumentError, match=r"row_ids\[1\] = 32 is out of range: ids must be -1 .* \[0, 32\)"):
        backend.gather_resident_rows(_source(), out, torch.tensor([0, 32]))
    with pytest.raises(InvalidArgumentError, match=r"row_ids\[0\] = -2 is out of range"):
        backend.gather_resident_rows(_source(), out, torch.tensor([-2, 0]))
    assert out.eq(0).all()


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda s, o: (s, o.to("meta"), torch.tensor([0, 1])),
            r"gather destination is on meta, but backend 'cpu' runs on cpu",
        ),
        (lambda s, o: (s.to("meta"), o, torch.tensor([0, 1])), r"gather source is on meta"),
        (lambda s, o: (s, o, torch.tensor([0.0, 1.0])), r"row_ids must be int32 or int64, got torch.float32"),
        (lambda s, o: (s, o, torch.tensor([[0, 1]])), r"row_ids must be a flat 1-D list, got shape \(1, 2\)"),
        (lambda s, o: (s, o, [0, 1]), r"gather 'row_ids' must be a torch.Tensor, got list"),
        (
            lambda s, o: (s[0], o, torch.tensor([0, 1])),
            r"source must be \[num_blocks, block_size, row_width\], got shape \(4, 656\)",
        ),
        (lambda s, o: (s, o[:, :600], torch.tensor([0, 1])), r"destination must be contiguous"),
        (lambda s, o: (s, o[:1], torch.tensor([0, 1])), r"does not hold 2 rows of 656"),
        (lambda s, o: (s, torch.zeros(2, 81, dtype=torch.int64), torch.tensor([0, 1])), r"does not hold 2 rows of 82"),
    ],
    ids=[
        "destination_device",
        "source_device",
        "id_dtype",
        "id_shape",
        "ids_not_tensor",
        "source_rank",
        "strided_destination",
        "short_destination",
        "narrow_rows",
    ],
)
def test_gather_rejects_bad_arguments(backend, make, message):
    out = torch.zeros(2, 656, dtype=torch.uint8)
    with pytest.raises(InvalidArgumentError, match=message):
        backend.gather_resident_rows(*make(_source(), out))
    assert out.eq(0).all()


def test_cache_ops_gather(backend):
    source = _source()
    out = torch.zeros(1, 656, dtype=torch.uint8)
    backend.create_cache_ops(runtime=None).gather_resident_rows(source, out, torch.tensor([9], dtype=torch.int32))
    assert torch.equal(out[0], source[2, 1])


def test_gather_into_the_source_is_refused_when_called_and_when_captured(backend):
    source = _source()
    destination = source.view(-1, 656)[4:6]
    before = source.clone()
    with pytest.raises(InvalidArgumentError, match="overlaps the source's byte span"):
        backend.gather_resident_rows(source, destination, torch.tensor([0, 1]))
    with backend.capture() as graph, pytest.raises(InvalidArgumentError, match="overlaps the source's byte span"):
        backend.gather_resident_rows(source, destination, torch.tensor([0, 1]))
    assert graph.operations == ()
    assert torch.equal(source, before)
