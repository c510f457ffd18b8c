"""Vectorised torch implementation of the four vLLM 0.34.0 HiSparse cache ops, for any device: resolve is
:mod:`.torch_resolve`; the gathers and invalidation are here.

Invariant: every tensor has a shape fixed by the arguments' shapes, and no value is read back to the host
(no ``.item()``, ``nonzero``, ``unique`` or boolean-mask indexing) except on the CPU device, where
:mod:`.device_checks` reads the union bound and the table addresses to raise typed errors; so on a GPU each op
can be captured in a CUDA/HIP graph. Outputs, state and untouched entries are bit-equal to ``oracle.py``.
"""

from __future__ import annotations

import torch

from hisparse_hal.errors import UnknownTableError

from . import device_checks, tables, torch_resolve
from .arguments import GatherInputs, InvalidateInputs, ResolveInputs
from .signatures import vllm_ops

__all__ = ["gather", "gather_compact", "gather_plan", "invalidate", "invalidate_written_slots", "plan_gather",
           "resolve", "resolve_residency", "word_rows"]

_I64 = torch.int64
_INT32_MAX = (1 << 31) - 1
# Invalidation's sort keys are ``state_row << _KEY_SHIFT | slot``: slots are int32 and state rows far below
# 2**30, so every real key stays below _NO_KEY.
_KEY_SHIFT = 32
_NO_KEY = 1 << 62


def resolve(inputs: ResolveInputs) -> None:
    """``hisparse_resolve_residency``: :func:`torch_resolve.resolve`, the oracle's phases vectorised with fixed
    shapes in windows of batch rows (no host read on a GPU)."""
    torch_resolve.resolve(inputs)


def word_rows(cache: torch.Tensor) -> torch.Tensor:
    """``cache``'s rows reinterpreted in the widest integer word its layout allows (8, 4, 2 or 1 bytes).

    Rows are a multiple of 16 bytes (checked by :mod:`.arguments`), so the word is limited only by the
    storage offset and the strides; torch's ``view(dtype)`` refuses any view that would misalign.

    Args:
        cache: a tensor whose last dimension is stride 1.

    Returns:
        A view of the same bytes with the same leading dimensions.
    """
    raw = cache if cache.dtype == torch.uint8 else cache.view(torch.uint8)
    for word in (torch.int64, torch.int32, torch.int16):
        try:
            return raw.view(word)
        except RuntimeError:
            continue
    return raw


def slab_rows(hot: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """A 2-D ``[span, words]`` view of the slab under a 3-D hot view whose block stride is a whole number of
    rows (a layer-interleaved HMA slab, or contiguous blocks), with the rows of a block stride: hot row ``d`` is
    slab row ``d // B * stride + d % B`` (the attention-index formula). Lets the gathers use ``index_select`` /
    ``index_copy_`` on whole rows instead of 2-D advanced indexing of a strided view. None when the layout does
    not allow it (the callers then index by ``(block, offset)``).

    Args:
        hot: ``[blocks, B, words]`` with ``stride(2) == 1`` and ``stride(1) == words``.

    Returns:
        ``(rows_view, block_stride_in_rows)`` or None.
    """
    blocks, block_size, words = hot.shape
    if blocks == 0 or hot.stride(2) != 1 or (block_size > 1 and hot.stride(1) != words) or hot.stride(0) % words:
        return None
    stride_rows = hot.stride(0) // words
    if stride_rows < block_size:
        return None
    span = (blocks - 1) * stride_rows + block_size
    return torch.as_strided(hot, (span, words), (words, 1)), stride_rows


def slab_row_ids(rows: torch.Tensor, block_size: int, stride_rows: int) -> torch.Tensor:
    """Slab row of each hot row (see :func:`slab_rows`)."""
    if stride_rows == block_size:
        return rows
    return torch.div(rows, block_size, rounding_mode="floor") * stride_rows + torch.remainder(rows, block_size)


#: Bytes of row data one round of a gather holds at once (host rows read, current rows, merged rows: three
#: buffers of this size). Bounds a gather's extra memory whatever R x K is; 4 MiB rounds keep it near the
#: cache and cost about 3 x 4 MiB at any batch size.
COPY_ROUND_BYTES = 4 << 20


#: Plan entries per round of a gather's first pass (which moves no rows): about 20 MiB of int64 temporaries.
PLAN_ROUND_ENTRIES = 1 << 20


def _plan_entries(inputs: GatherInputs, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(source, destination, write)`` (int64, int64, bool) of flat plan entries ``[start, stop)``."""
    source = inputs.global_indices.reshape(-1)[start:stop].to(_I64)
    destination = inputs.hot_indices.reshape(-1)[start:stop].to(_I64)
    if inputs.compact:
        flat = torch.arange(start, stop, dtype=_I64, device=inputs.device)
        row = torch.div(flat, inputs.columns, rounding_mode="floor")
        count = inputs.selector.reshape(-1)[:inputs.num_rows].to(_I64).clamp(0, inputs.columns)
        chosen = flat - row * inputs.columns < count[row]
    else:
        chosen = inputs.selector.reshape(-1)[start:stop] != 0
    write = chosen & (source >= 0) & (destination >= 0) & (destination < inputs.hot_rows)
    return source, destination, write


def _copy_rows(inputs: GatherInputs) -> None:
    """For every entry that writes: hot row ``destination`` := host row ``source`` (zeros past the host cache).

    Fixed shape: every entry stores its destination row (an entry that does not write targets row 0). What it
    stores is what that row ends with: the host row of the row's *last* writing entry (``last``, an int32
    ``scatter_reduce(amax)`` of entry numbers over hot rows), or the row's current bytes. So all stores to one row
    are identical and the scatter's order cannot matter; a row named twice ends with the later entry, as the
    oracle's loop does. Entries are planned and moved in rounds of ``COPY_ROUND_BYTES`` of rows (a number of
    rounds fixed by the shapes), so one call holds ``last`` (4 bytes per hot row) and one round's temporaries,
    whatever R x K is.
    """
    host_rows, hot_rows = inputs.host_rows, inputs.hot_rows
    hot = word_rows(inputs.hot_cache)
    blocks, block_size, words = hot.shape
    total = inputs.num_rows * inputs.columns
    if hot_rows == 0 or total == 0:
        return
    device = inputs.device
    round_rows = max(1, COPY_ROUND_BYTES // (words * hot.element_size()))
    last = torch.full((hot_rows + 1,), -1, dtype=torch.int32, device=device)  # + a spill row for non-writers
    for start in range(0, total, PLAN_ROUND_ENTRIES):  # index arrays only: larger rounds, fewer launches
        stop = min(start + PLAN_ROUND_ENTRIES, total)
        _, destination, write = _plan_entries(inputs, start, stop)
        entries = torch.arange(start, stop, dtype=torch.int32, device=device)
        last.scatter_reduce_(0, torch.where(write, destination, hot_rows), entries, reduce="amax")
    sources = inputs.global_indices.reshape(-1)
    host = word_rows(inputs.host_cache)
    slab = slab_rows(hot)
    for start in range(0, total, round_rows):
        stop = min(start + round_rows, total)
        _, destination, write = _plan_entries(inputs, start, stop)
        rows = torch.where(write, destination, 0)
        writer = last[rows].to(_I64)
        written = writer >= 0
        writer_source = sources[writer.clamp(min=0)].to(_I64)
        from_host = written & (writer_source < host_rows)
        if slab is not None:
            slab_ids = slab_row_ids(rows, block_size, slab[1])
            current = slab[0].index_select(0, slab_ids)
        else:  # a layout without whole-row block strides: address each row by (block, offset)
            current = hot[torch.div(rows, block_size, rounding_mode="floor"), torch.remainder(rows, block_size)]
        if host_rows > 0:
            loaded = host.index_select(0, writer_source.clamp(0, host_rows - 1))
            merged = torch.where(from_host[:, None], loaded, torch.where(written[:, None], 0, current))
        else:
            merged = torch.where(written[:, None], 0, current)
        if slab is not None:
            slab[0].index_copy_(0, slab_ids, merged)
        else:
            hot.index_put_((torch.div(rows, block_size, rounding_mode="floor"), torch.remainder(rows, block_size)),
                           merged)


def plan_gather(inputs: GatherInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The int64 ``(source, destination, write)`` of every plan entry (``[R, C]``): ``write`` where the entry is
    selected (mask nonzero, or within ``clamp(count, 0, C)``), its source is >= 0 and its destination inside
    the hot cache (``hisparse_kernels.cu:841-895``). Shared by the torch and host implementations."""
    source = inputs.global_indices.to(_I64)
    destination = inputs.hot_indices.to(_I64)
    if inputs.compact:
        count = inputs.selector.reshape(-1)[:inputs.num_rows].to(_I64).clamp(0, inputs.columns)
        columns = torch.arange(inputs.columns, dtype=_I64, device=inputs.device)
        chosen = columns[None, :] < count[:, None]
    else:
        chosen = inputs.selector != 0
    write = chosen & (source >= 0) & (destination >= 0) & (destination < inputs.hot_rows)
    return source, destination, write


def gather(inputs: GatherInputs) -> None:
    """``hisparse_gather_plan`` / ``hisparse_gather_compact`` on checked inputs: every entry rewrites its row
    with fixed shapes (see :func:`_copy_rows`)."""
    if inputs.empty:
        return
    _copy_rows(inputs)


def named_tables(inputs: InvalidateInputs) -> torch.Tensor:
    """``[groups, tables]`` bool: which registered candidate each address names, checked (every address must
    name one). A typed error on the CPU device, a device-side assertion on a GPU, before any write.

    Raises:
        UnknownTableError: on the CPU device.
    """
    pointers = inputs.device_global_indices_ptrs
    known = tables.address_tensor(inputs.addresses, inputs.device)
    names = (pointers[:, None] == known[None, :]) & bool(inputs.addresses)

    def error(index: int) -> UnknownTableError:
        return UnknownTableError(int(pointers[index]), index, f"is no registered [{inputs.num_state_rows}, "
                                 f"{inputs.region_stride}] int32 device_global_indices table on {inputs.device}")

    device_checks.refuse(~names.any(1), error, "hisparse invalidate_written_slots: unknown table address")
    return names


def invalidate(inputs: InvalidateInputs) -> None:
    """``hisparse_invalidate_written_slots`` on checked inputs (``hisparse_kernels.cu:896-1012``): per candidate
    table, a masked fill where it is named (one pass per registered table of the right shape, no host read).

    Raises:
        UnknownTableError: on the CPU device, before anything is written.
    """
    names = named_tables(inputs)
    if inputs.empty or not inputs.tables:
        return
    named = names.any(0)
    rsi = inputs.request_state_indices
    request = inputs.req_id_per_token.to(_I64)
    length = rsi.numel()
    inside = (request >= 0) & (request < length)
    if length == 0:
        return
    state = torch.where(inside, rsi[request.clamp(0, length - 1)].to(_I64), -1)
    slot = inputs.written_slots
    wanted = (state >= 0) & (state < inputs.num_state_rows) & (slot >= 0) & (slot <= _INT32_MAX)
    tokens = slot.numel()
    keys, _ = torch.sort(torch.where(wanted, (state << _KEY_SHIFT) | slot, _NO_KEY))
    states = torch.arange(inputs.num_state_rows, dtype=_I64, device=inputs.device)[:, None]
    for which, table in enumerate(inputs.tables):
        held = table.to(_I64)
        query = torch.where(held >= 0, (states << _KEY_SHIFT) | held, -1)
        found = keys[torch.searchsorted(keys, query).clamp(max=tokens - 1)] == query
        table.masked_fill_(found & (query >= 0) & named[which], -1)


_OPS = vllm_ops(resolve, gather, invalidate)
resolve_residency = _OPS.resolve_residency
gather_compact = _OPS.gather_compact
gather_plan = _OPS.gather_plan
invalidate_written_slots = _OPS.invalidate_written_slots
