"""Gathers: rows named by id land in staging byte for byte (the reference semantics: row id =
block * block_size + offset, -1 reads row 0, bytes preserved across dtypes), from contiguous, padded,
strided and per-layer sources; bad ids are a typed error, never a crash or a read outside the source:
raised by the gather (host-checked backends, nothing written) or by ``raise_gather_faults`` (device-checked
GPU backends, which read clamped rows and report without a read-back). Under vLLM's contract a bad input is
refused where vLLM's default gather refuses it (backend.py:61-70: by any exception, writing nothing); the id checks
are hisparse-hal's."""

from __future__ import annotations

import math
import re

import pytest
import torch

from hisparse_hal.conformance.arenas import park_cache_regions, random_bytes, synchronize
from hisparse_hal.conformance.contracts import VLLM_034_CONTRACT, contract_of_backend, refused
from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.gather import reference_gather_rows
from hisparse_hal.kv_cache import KV_FORMAT_SPECS, KVCacheConfig, LayerSpec

#: This tier (read by conformance/tiers.py, without importing this module): its area, its place in the
#: run and its title in the reports.
AREA = "gathers"
ORDER = 40
TITLE = "Gathers"

FP8 = torch.float8_e4m3fn
DS_MLA_ROW = 656


def _random(shape: tuple[int, ...], dtype: torch.dtype, seed: int, device: torch.device) -> torch.Tensor:
    """A tensor of random bytes (NaN and inf patterns included) reinterpreted as ``dtype``."""
    size = torch.empty((), dtype=dtype).element_size()
    raw = random_bytes(math.prod(shape) * size, seed)
    return raw.view(dtype).view(shape).to(device)


def _ids(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.int64).to(dtype).to(device)


def _row_bytes(t: torch.Tensor) -> torch.Tensor:
    """``[n, row_bytes]`` uint8 CPU copy of a ``[n, ...]`` tensor."""
    t = t.detach().to("cpu").contiguous()
    return t.view(torch.uint8).reshape(t.shape[0], -1) if t.dim() > 1 else t.view(torch.uint8).reshape(1, -1)


def _source_row_bytes(source: torch.Tensor, row_id: int) -> torch.Tensor:
    block_size = source.shape[1]
    row = source[row_id // block_size, row_id % block_size].to("cpu").contiguous()
    return row.view(torch.uint8).reshape(-1)


def _gather_and_check(backend, source: torch.Tensor, destination: torch.Tensor, ids: torch.Tensor) -> None:
    """Gather (through ``backend`` or its cache ops), then compare each row with the reference
    (ids >= 0) or with row 0 (ids == -1)."""
    backend.gather_resident_rows(source, destination, ids)
    synchronize(source.device)
    got = _row_bytes(destination.view(ids.numel(), -1))
    ids_cpu = ids.to("cpu", torch.int64)
    want_t = torch.empty(destination.shape, dtype=destination.dtype)
    reference_gather_rows(source.to("cpu"), want_t, ids_cpu)
    want = _row_bytes(want_t.view(ids.numel(), -1))
    resident = ids_cpu >= 0
    bad = ((got != want).any(1) & resident).nonzero()
    if bad.numel():
        i = int(bad[0])
        raise AssertionError(
            f"gathered row {i} (id {int(ids_cpu[i])}) differs from the reference in "
            f"{int((got[i] != want[i]).sum())} of {got.shape[1]} bytes; {bad.numel()} rows differ"
        )
    row0 = _source_row_bytes(source, 0)
    for i in (~resident).nonzero().flatten().tolist():
        assert torch.equal(got[i], row0), f"row {i} has id -1 and must hold the bytes of row 0 (block 0, offset 0)"


# ------------------------------------------------------------------------------------------ ids
@pytest.mark.smoke
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_gather_matches_the_reference_for_ids_of_dtype(backend, id_dtype):
    source = _random((64, 16, 72), torch.bfloat16, 1, backend.device)
    generator = torch.Generator().manual_seed(2)
    ids = _ids(torch.randint(0, 64 * 16, (500,), generator=generator), id_dtype, backend.device)
    destination = torch.zeros((500, 72), dtype=torch.bfloat16, device=backend.device)
    _gather_and_check(backend, source, destination, ids)


def test_gather_of_repeated_and_boundary_ids(backend):
    source = _random((8, 4, 40), torch.uint8, 3, backend.device)
    ids = _ids([0, 31, 31, 0, 3, 4, 27, 28, 31, 1], torch.int64, backend.device)
    destination = torch.zeros((10, 40), dtype=torch.uint8, device=backend.device)
    _gather_and_check(backend, source, destination, ids)


@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_gather_reads_row_zero_for_minus_one_ids(backend, id_dtype):
    source = _random((16, 8, 64), torch.bfloat16, 4, backend.device)
    ids = _ids([-1, 5, 127, -1, 64, 0, -1], id_dtype, backend.device)
    destination = torch.zeros((7, 64), dtype=torch.bfloat16, device=backend.device)
    _gather_and_check(backend, source, destination, ids)
    last, first = _source_row_bytes(source, 127), _source_row_bytes(source, 0)
    assert not torch.equal(last, first), "suite bug: row 0 and the last row must differ"


def test_gather_of_only_minus_one_ids_fills_row_zero_everywhere(backend):
    source = _random((4, 4, 32), torch.uint8, 5, backend.device)
    ids = _ids([-1] * 9, torch.int32, backend.device)
    destination = torch.zeros((9, 32), dtype=torch.uint8, device=backend.device)
    _gather_and_check(backend, source, destination, ids)


def test_gather_of_no_ids_changes_nothing(backend):
    source = _random((4, 4, 32), torch.uint8, 6, backend.device)
    destination = _random((0, 32), torch.uint8, 7, backend.device)
    backend.gather_resident_rows(source, destination, _ids([], torch.int64, backend.device))
    synchronize(backend.device)
    assert destination.numel() == 0


def test_gather_of_hisparse_shaped_656_byte_rows(backend):
    """16k ids of 656-byte rows: the shape HiSparse staging uses."""
    source = _random((256, 64, DS_MLA_ROW), torch.uint8, 8, backend.device)
    generator = torch.Generator().manual_seed(9)
    raw = torch.randint(-1, 256 * 64, (16384,), generator=generator)
    destination = torch.zeros((16384, DS_MLA_ROW), dtype=torch.uint8, device=backend.device)
    _gather_and_check(backend, source, destination, _ids(raw, torch.int32, backend.device))


@pytest.mark.hal_extension
def test_gather_through_cache_ops_matches_the_reference(backend):
    source = _random((32, 8, 656), torch.uint8, 23, backend.device)
    ids = _ids([255, -1, 0, 100, 100], torch.int32, backend.device)
    destination = torch.zeros((5, 656), dtype=torch.uint8, device=backend.device)
    ops = backend.create_cache_ops(runtime=None)
    _gather_and_check(ops, source, destination, ids)
    assert ops.backend is backend


# ------------------------------------------------------------------------------------------ layouts
def test_gather_from_a_padded_source(backend):
    base = _random((32, 11, 53), torch.bfloat16, 10, backend.device)
    source = base[:, :8, :48]  # padded rows and blocks: neither block nor row stride is dense
    assert not source.is_contiguous()
    ids = _ids([0, 255, 17, -1, 8, 100], torch.int64, backend.device)
    destination = torch.zeros((6, 48), dtype=torch.bfloat16, device=backend.device)
    _gather_and_check(backend, source, destination, ids)


def test_gather_from_a_block_strided_per_layer_source(backend):
    layers = 3
    base = _random((20, layers, 6, 80), torch.uint8, 11, backend.device)  # [blocks, layers, rows, width]
    ids = _ids([0, 119, 6, 5, 60, -1, 77], torch.int64, backend.device)
    for layer in range(layers):
        destination = torch.zeros((7, 80), dtype=torch.uint8, device=backend.device)
        _gather_and_check(backend, base[:, layer], destination, ids)


def test_gather_from_an_element_strided_source(backend):
    base = _random((10, 4, 24, 2), torch.bfloat16, 12, backend.device)
    source = base[..., 1]  # every other element of each row
    ids = _ids([39, 0, 13, -1], torch.int64, backend.device)
    destination = torch.zeros((4, 24), dtype=torch.bfloat16, device=backend.device)
    _gather_and_check(backend, source, destination, ids)


def test_gather_from_per_layer_kv_cache_views(backend, capabilities):
    fmt = next((f for f in ("bf16", "fp8_e4m3fn", "fp8_e4m3fnuz") if f in capabilities.kv_formats), None)
    if fmt is None:
        pytest.skip(f"capability kv_formats={sorted(capabilities.kv_formats)} has no bf16 or fp8 format")
    dtype = KV_FORMAT_SPECS[fmt].dtype
    size = torch.empty((), dtype=dtype).element_size()
    num_blocks, block_size, width = 12, 4, 96
    layer_bytes = num_blocks * block_size * width * size
    layers = tuple(LayerSpec(f"layer.{i}", i * (layer_bytes + 64 * width * size)) for i in range(3))
    allocation = _random(((layer_bytes + 64 * width * size) * 3,), torch.uint8, 13, backend.device)
    kv_caches = {layer.name: allocation for layer in layers}
    try:
        backend.prepare_kv_cache_views(KVCacheConfig(fmt, num_blocks, block_size, width, layers), kv_caches, {})
        ids = _ids([0, 47, 13, -1, 22], torch.int64, backend.device)
        for layer in layers:
            view = kv_caches[layer.name]
            if contract_of_backend(backend) is VLLM_034_CONTRACT:  # vLLM's binder makes the views (binding.py:103-124)
                view = allocation[layer.offset_bytes:layer.offset_bytes + layer_bytes].view(dtype).view(
                    num_blocks, block_size, width)
            expected = allocation[layer.offset_bytes : layer.offset_bytes + layer_bytes].to("cpu")
            assert torch.equal(_row_bytes(view.reshape(1, -1))[0], expected), (
                f"view of {layer.name} is not at its offset"
            )
            destination = torch.zeros((5, width), dtype=dtype, device=backend.device)
            _gather_and_check(backend, view, destination, ids)
    finally:
        park_cache_regions(backend)


# ------------------------------------------------------------------------------------------ dtypes
@pytest.mark.parametrize(
    "source_dtype,destination_dtype",
    [
        (torch.bfloat16, torch.uint8),
        (torch.uint8, torch.bfloat16),
        (FP8, torch.uint8),
        (torch.uint8, FP8),
        (torch.bfloat16, FP8),
        (FP8, torch.bfloat16),
    ],
    ids=["bf16->uint8", "uint8->bf16", "fp8->uint8", "uint8->fp8", "bf16->fp8", "fp8->bf16"],
)
def test_gather_preserves_bytes_when_dtypes_differ(backend, source_dtype, destination_dtype):
    row_bytes = 128
    s_size = torch.empty((), dtype=source_dtype).element_size()
    d_size = torch.empty((), dtype=destination_dtype).element_size()
    source = _random((16, 8, row_bytes // s_size), source_dtype, 14, backend.device)
    ids = _ids([3, 0, 127, -1, 64, 64, 9], torch.int64, backend.device)
    destination = torch.zeros((7, row_bytes // d_size), dtype=destination_dtype, device=backend.device)
    _gather_and_check(backend, source, destination, ids)


def test_gather_preserves_bytes_from_a_padded_source_into_another_dtype(backend):
    base = _random((16, 9, 70), torch.bfloat16, 15, backend.device)
    source = base[:, :8, :64]
    ids = _ids([127, 0, -1, 33], torch.int32, backend.device)
    destination = torch.zeros((4, 128), dtype=torch.uint8, device=backend.device)
    _gather_and_check(backend, source, destination, ids)


@pytest.mark.parametrize("destination_dtype", [torch.uint8, FP8, torch.bfloat16], ids=["uint8", "fp8", "bf16"])
def test_gather_of_656_byte_fp8_ds_mla_rows_preserves_bytes(backend, destination_dtype):
    """fp8_ds_mla rows: 512 B e4m3 NoPE + 16 B fp32 scales + 128 B bf16 RoPE, moved as opaque bytes."""
    source = _random((32, 16, DS_MLA_ROW), torch.uint8, 16, backend.device)
    size = torch.empty((), dtype=destination_dtype).element_size()
    ids = _ids([0, 511, 256, -1, 17, 17, 300], torch.int64, backend.device)
    destination = torch.zeros((7, DS_MLA_ROW // size), dtype=destination_dtype, device=backend.device)
    _gather_and_check(backend, source, destination, ids)


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.hal_extension
@pytest.mark.parametrize("bad", [128, 1 << 30, -2, -(1 << 31)], ids=["one_past_end", "huge", "minus_two", "int32_min"])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_gather_rejects_an_out_of_range_id_naming_it(backend, bad, id_dtype):
    source = _random((16, 8, 32), torch.uint8, 17, backend.device)
    ids = _ids([0, 5, -1, bad, 7], id_dtype, backend.device)
    destination = _random((5, 32), torch.uint8, 18, backend.device)
    before = destination.to("cpu")
    try:
        backend.gather_resident_rows(source, destination, ids)
    except InvalidArgumentError as error:  # checked on the host before copying: nothing written
        assert re.search(rf"row_ids\[3\] = {bad}\b", str(error)), str(error)
        synchronize(backend.device)
        assert torch.equal(destination.to("cpu"), before), "a rejected gather must not write the destination"
        backend.raise_gather_faults()  # an eagerly reported id is not reported twice
        return
    # Checked on the device (no read-back): reported by raise_gather_faults, exactly once.
    with pytest.raises(InvalidArgumentError, match=rf"row_ids\[3\] = {bad}\b"):
        backend.raise_gather_faults()
    backend.raise_gather_faults()


@pytest.mark.hal_extension  # vLLM's default gather casts any ids to long (backend.py:65)
def test_gather_rejects_ids_of_a_float_dtype(backend):
    source = _random((4, 4, 16), torch.uint8, 19, backend.device)
    destination = torch.zeros((2, 16), dtype=torch.uint8, device=backend.device)
    with pytest.raises(InvalidArgumentError, match=r"int32 or int64.*float32"):
        backend.gather_resident_rows(source, destination, torch.tensor([0.0, 1.0], device=backend.device))


def test_gather_rejects_a_destination_of_the_wrong_row_width(backend):
    source = _random((4, 4, 16), torch.uint8, 20, backend.device)
    destination = torch.zeros((2, 15), dtype=torch.uint8, device=backend.device)
    with refused(backend, InvalidArgumentError, match=r"does not hold 2 rows"):
        backend.gather_resident_rows(source, destination, _ids([0, 1], torch.int64, backend.device))
    assert not destination.to("cpu").any(), "a refused gather wrote the destination"


@pytest.mark.hal_extension  # vLLM's default gather copies into any destination (backend.py:70)
def test_gather_rejects_a_non_contiguous_destination(backend):
    source = _random((4, 4, 16), torch.uint8, 24, backend.device)
    destination = torch.zeros((16, 2), dtype=torch.uint8, device=backend.device).t()
    with pytest.raises(InvalidArgumentError, match=r"destination must be contiguous"):
        backend.gather_resident_rows(source, destination, _ids([0, 1], torch.int64, backend.device))


def test_gather_rejects_a_row_that_cannot_be_reinterpreted(backend):
    source = _random((4, 4, 15), torch.uint8, 21, backend.device)  # 15-byte rows
    destination = torch.zeros((2, 7), dtype=torch.bfloat16, device=backend.device)
    with refused(backend, InvalidArgumentError, match=r"15 bytes.*cannot be reinterpreted"):
        backend.gather_resident_rows(source, destination, _ids([0, 1], torch.int64, backend.device))
    assert not destination.to("cpu").any(), "a refused gather wrote the destination"


def test_gather_rejects_a_source_on_another_device(backend):
    source = torch.empty((4, 4, 16), dtype=torch.uint8, device="meta")
    destination = torch.zeros((2, 16), dtype=torch.uint8, device=backend.device)
    with refused(backend, InvalidArgumentError, match=r"source.*meta"):
        backend.gather_resident_rows(source, destination, _ids([0, 1], torch.int64, backend.device))
    assert not destination.to("cpu").any(), "a refused gather wrote the destination"


def test_gather_rejects_a_source_that_is_not_three_dimensional(backend):
    source = _random((16, 16), torch.uint8, 22, backend.device)
    destination = torch.zeros((2, 16), dtype=torch.uint8, device=backend.device)
    with refused(backend, InvalidArgumentError, match=r"num_blocks, block_size, row_width.*\(16, 16\)"):
        backend.gather_resident_rows(source, destination, _ids([0, 1], torch.int64, backend.device))
    assert not destination.to("cpu").any(), "a refused gather wrote the destination"
