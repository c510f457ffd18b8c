"""Gathering resident KV rows into staging, in one pass and without a payload temporary.

Semantics match the reference ``gather_resident_rows``: row id = block * block_size + offset, ``-1``
reads row 0, and when dtypes differ the bytes are preserved (a ``view``), never converted. The payload
moves through a single ``index_select(..., out=destination)`` over a strided view of the source. Ids are
range-checked either on the host (:func:`check_row_ids`) or, with no read-back, on the device into a
fault record (:func:`new_fault_record`, :func:`raise_recorded_fault`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .errors import InvalidArgumentError

__all__ = [
    "check_gather_destination",
    "check_row_ids",
    "DeviceIdCheck",
    "gather_rows",
    "new_fault_record",
    "raise_recorded_fault",
    "reference_gather_rows",
    "source_row_view",
]

#: Slots of a fault record: set flag, index of the first bad id, its value, and the row count it broke.
_FLAG, _INDEX, _VALUE, _TOTAL = range(4)

#: A fused device-side id check: ``(row_ids, total_rows, block_size, block_step, offset_step)`` to int64
#: indices into :func:`source_row_view`'s rows, out-of-range ids clamped and recorded in its own fault record.
DeviceIdCheck = Callable[[torch.Tensor, int, int, int, int], torch.Tensor]


def source_row_view(source: torch.Tensor, destination_dtype: torch.dtype) -> tuple[torch.Tensor, int, int]:
    """View a ``[num_blocks, block_size, row_width]`` source as rows, with no copy.

    Returns ``(rows, block_step, offset_step)``: ``rows`` is a 2-D view (possibly with overlapping rows
    when the source is padded) reinterpreted as ``destination_dtype``; row id ``b * block_size + o`` of
    the source is ``rows[b * block_step + o * offset_step]``.

    Raises:
        InvalidArgumentError: the source is not 3-D, or its rows cannot be reinterpreted as
            ``destination_dtype`` (last dimension not contiguous, or byte width not divisible).
    """
    if source.dim() != 3:
        raise InvalidArgumentError(
            f"gather source must be [num_blocks, block_size, row_width], got shape {tuple(source.shape)}"
        )
    num_blocks, block_size, row_width = source.shape
    s_block, s_offset, s_elem = source.stride()
    if num_blocks == 0 or block_size == 0:
        raise InvalidArgumentError(f"gather source has no rows: shape {tuple(source.shape)}")
    # Rows start at multiples of g elements; one 2-D view with row stride g reaches all of them.
    g = math.gcd(s_block, s_offset) or 1
    length = ((num_blocks - 1) * s_block + (block_size - 1) * s_offset) // g + 1
    rows = source.as_strided((length, row_width), (g, s_elem), source.storage_offset())
    if destination_dtype != source.dtype:
        row_bytes = row_width * source.element_size()
        out_size = torch.empty((), dtype=destination_dtype).element_size()
        if row_width > 1 and s_elem != 1:
            raise InvalidArgumentError(
                f"gather source rows must be contiguous to reinterpret {source.dtype} as "
                f"{destination_dtype}, got element stride {s_elem}"
            )
        if row_bytes % out_size:
            raise InvalidArgumentError(
                f"gather row of {row_bytes} bytes ({row_width} x {source.dtype}) cannot be "
                f"reinterpreted as {destination_dtype} ({out_size}-byte elements)"
            )
        if (g * source.element_size()) % out_size or (source.storage_offset() * source.element_size()) % out_size:
            raise InvalidArgumentError(
                f"gather source rows are not {out_size}-byte aligned for {destination_dtype}"
            )
        # Reinterpret through a byte view of the same storage; strides are rescaled in bytes.
        byte_rows = torch.empty(0, dtype=torch.uint8, device=source.device).set_(
            source.untyped_storage(),
            source.storage_offset() * source.element_size(),
            (length, row_bytes),
            (g * source.element_size(), 1),
        )
        rows = byte_rows.view(destination_dtype)
    return rows, s_block // g, s_offset // g


def _check_gather_args(source: torch.Tensor, destination: torch.Tensor, row_ids: torch.Tensor) -> None:
    for name, value in (("source", source), ("destination", destination), ("row_ids", row_ids)):
        if not isinstance(value, torch.Tensor):
            raise InvalidArgumentError(f"gather '{name}' must be a torch.Tensor, got {type(value).__name__}")
    if row_ids.dtype not in (torch.int32, torch.int64):
        raise InvalidArgumentError(f"gather row_ids must be int32 or int64, got {row_ids.dtype}")
    if row_ids.dim() != 1:
        raise InvalidArgumentError(f"gather row_ids must be a flat 1-D list, got shape {tuple(row_ids.shape)}")
    if not (source.device == destination.device == row_ids.device):
        raise InvalidArgumentError(
            "gather source, destination and row_ids must be on one device, got "
            f"{source.device}, {destination.device}, {row_ids.device}"
        )


def _byte_span(tensor: torch.Tensor) -> tuple[int, int]:
    """``[first, last + 1)``: the bytes a (possibly strided) tensor's elements can touch."""
    start = tensor.data_ptr()
    if tensor.numel() == 0:
        return start, start
    extent = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True))
    return start, start + (extent + 1) * tensor.element_size()


def check_gather_destination(source: torch.Tensor, destination: torch.Tensor) -> None:
    """Check, without reading any data, that ``destination`` can be written by a gather from ``source``:
    it does not require grad and its bytes do not overlap the source's.

    Raises:
        InvalidArgumentError: naming the destination's and the source's byte ranges, or the grad flag.
    """
    if destination.requires_grad:
        raise InvalidArgumentError(
            f"gather destination {tuple(destination.shape)} ({destination.dtype}) requires grad; a gather "
            "writes staging outside autograd, pass a tensor with requires_grad=False (detach() it)"
        )
    d_lo, d_hi = _byte_span(destination)
    s_lo, s_hi = _byte_span(source)
    if source.device == destination.device and d_lo < s_hi and s_lo < d_hi:
        raise InvalidArgumentError(
            f"gather destination [{d_lo:#x}, {d_hi:#x}) overlaps the source's byte span [{s_lo:#x}, {s_hi:#x}); "
            "nothing was written. Gather into a separate staging buffer"
        )


def _range_message(index: int, value: int, total: int, block_size: int) -> str:
    return (
        f"gather row_ids[{index}] = {value} is out of range: ids must be -1 "
        f"(not resident) or in [0, {total}) for {total // block_size} blocks of {block_size} rows"
    )


def new_fault_record(device: torch.device) -> torch.Tensor:
    """A zeroed device-side fault record for :func:`gather_rows` (``int64[5]``, lives on ``device``)."""
    return torch.zeros(5, dtype=torch.int64, device=device)


def _clamp_and_record(row_ids: torch.Tensor, total: int, block_size: int, record: torch.Tensor) -> torch.Tensor:
    """In-range row indices for ``row_ids`` (out-of-range ids clamped to row 0 or the last row), and, in
    ``record``, the first bad id of the first gather that had one. Only device work: nothing is read back."""
    clamped = row_ids.clamp(-1, min(total - 1, torch.iinfo(row_ids.dtype).max))  # int32 ids, huge sources
    bad = clamped != row_ids
    first = bad.to(torch.uint8).argmax()  # the first True; 0 when there is none (then unused)
    news = torch.stack((first, row_ids.take(first).to(torch.int64)))
    take = bad.any() & (record[_FLAG] == 0)
    record[_INDEX:_VALUE + 1] = torch.where(take, news, record[_INDEX:_VALUE + 1])
    record[_TOTAL] = torch.where(take, total, record[_TOTAL])
    record[_TOTAL + 1] = torch.where(take, block_size, record[_TOTAL + 1])
    record[_FLAG:_FLAG + 1].add_(take)
    return clamped.clamp_min(0)


def raise_recorded_fault(record: torch.Tensor) -> None:
    """Read a fault record (one device-to-host read, which waits for the gathers before it on the current
    stream) and, when a gather recorded a bad id, clear the record and raise.

    Raises:
        InvalidArgumentError: naming the first out-of-range id recorded since the record was last cleared
            (its index within its gather, its value and the valid range).
    """
    flag, index, value, total, block_size = record.tolist()
    if flag:
        record.zero_()
        raise InvalidArgumentError(
            _range_message(index, value, total, block_size)
            + "; found by the device-side check after the gather ran: that gather's destination holds "
            "clamped rows (row 0 or the last row) for the bad ids, discard it"
        )


def check_row_ids(row_ids: torch.Tensor, num_blocks: int, block_size: int) -> None:
    """Check every id is ``-1`` or a row of a ``num_blocks x block_size`` source (one reduction,
    which a GPU reads back to the host).

    Raises:
        InvalidArgumentError: naming the first out-of-range id's index and value.
    """
    if row_ids.numel() == 0:
        return
    total = num_blocks * block_size
    low, high = (int(v) for v in torch.aminmax(row_ids))
    if low < -1 or high >= total:
        bad = int(((row_ids < -1) | (row_ids >= total)).nonzero()[0])
        raise InvalidArgumentError(_range_message(bad, int(row_ids[bad]), total, block_size))


def gather_rows(
    source: torch.Tensor,
    destination: torch.Tensor,
    row_ids: torch.Tensor,
    *,
    check_range: bool = True,
    fault_record: torch.Tensor | None = None,
    device_check: DeviceIdCheck | None = None,
) -> None:
    """Copy ``source`` rows named by ``row_ids`` into ``destination``, preserving bytes.

    Args:
        source: ``[num_blocks, block_size, row_width]``, possibly strided.
        destination: ``len(row_ids)`` rows whose byte width equals a source row's; contiguous.
        row_ids: 1-D int32/int64 on the same device; ``-1`` reads row 0.
        check_range: reject ids outside ``[-1, num_blocks * block_size)`` before copying. On a GPU this
            reads one reduction back to the host, so GPU callers pass a ``fault_record`` instead.
        fault_record: from :func:`new_fault_record`: check on the device instead, with no read-back. Out of
            range ids then read a clamped row and the first one is recorded for
            :func:`raise_recorded_fault`; ``check_range`` is ignored.
        device_check: a fused device-side check (the GPU layer's Triton one) that computes the row indices
            itself and records bad ids in its own fault record; ``fault_record`` and ``check_range`` are
            then ignored.

    Raises:
        InvalidArgumentError: wrong types, devices or shapes; an id out of range (naming its index and
            value); a destination whose row width does not match the source's in bytes, that overlaps the
            source, or that requires grad.
    """
    _check_gather_args(source, destination, row_ids)
    rows, block_step, offset_step = source_row_view(source, destination.dtype)
    num_blocks, block_size, _ = source.shape
    n = row_ids.numel()
    if not destination.is_contiguous():
        raise InvalidArgumentError(
            f"gather destination must be contiguous, got strides {destination.stride()}"
        )
    width = rows.shape[1]
    if destination.numel() != n * width:
        raise InvalidArgumentError(
            f"gather destination {tuple(destination.shape)} ({destination.dtype}) does not hold "
            f"{n} rows of {width} x {destination.dtype}; a row is {rows.shape[1] * destination.element_size()} bytes"
        )
    check_gather_destination(source, destination)
    if n == 0:
        return
    if device_check is not None:
        index = device_check(row_ids, num_blocks * block_size, block_size, block_step, offset_step)
        torch.index_select(rows, 0, index, out=destination.view(n, width))
        return
    if fault_record is not None:
        index = _clamp_and_record(row_ids, num_blocks * block_size, block_size, fault_record)
    else:
        if check_range:
            check_row_ids(row_ids, num_blocks, block_size)
        index = row_ids.clamp_min(0)
    if block_step != block_size or offset_step != 1:
        index = torch.div(index, block_size, rounding_mode="floor") * block_step + (index % block_size) * offset_step
    torch.index_select(rows, 0, index, out=destination.view(n, width))


def reference_gather_rows(source: torch.Tensor, destination: torch.Tensor, row_ids: torch.Tensor) -> None:
    """The reference interface's implementation (advanced indexing through a temporary).

    Kept as the oracle the tests and the benchmark compare against; not capture-safe.
    """
    rows = row_ids.to(torch.long).clamp_min(0)
    block_size = source.shape[1]
    if source.element_size() == 1:
        # Indexed as bytes: torch 2.9's CPU advanced indexing has no float8 kernel ("index_cpu" not implemented for
        # 'Float8_e4m3fn'; torch 2.13 has one), and a one-byte view is the same bytes whatever the strides.
        source = source.view(torch.uint8)
    payload = source[rows // block_size, rows % block_size]
    if payload.dtype != destination.dtype:
        payload = payload.contiguous().view(destination.dtype)
    destination.copy_(payload)
