"""Vectorised torch implementation of the four vLLM 0.34.0 HiSparse cache ops, for any device.

Invariant: every tensor has a shape fixed by the arguments' shapes, and no value is read back to the host
(no ``.item()``, ``nonzero``, ``unique`` or boolean-mask indexing) except on the CPU device, where
:mod:`.device_checks` reads the union bound and the table addresses to raise typed errors; so on a GPU each op
can be captured in a CUDA/HIP graph. Outputs, state and untouched entries are bit-equal to ``oracle.py``;
the phases below carry the oracle's phase names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from hisparse_hal.errors import UnionOverflowError, UnknownTableError

from . import device_checks, tables
from .arguments import GatherInputs, InvalidateInputs, ResolveInputs
from .signatures import vllm_ops

__all__ = ["gather", "gather_compact", "gather_plan", "invalidate", "invalidate_written_slots", "plan_gather",
           "resolve", "resolve_residency", "word_rows"]

# Sort keys of host-backed positions are ``leader_row << _KEY_SHIFT | host_row``. Host rows are int32 and
# batch rows are far below 2**30, so every real key stays below _NO_KEY.
_KEY_SHIFT = 32
_NO_KEY = 1 << 62
_I64 = torch.int64
_INT32_MAX = (1 << 31) - 1


def _lookup(table: torch.Tensor, row: torch.Tensor, col: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``table[row, col]`` as int64 where both are in range, with the in-range mask; never indexes out of range."""
    rows, cols = table.shape
    if rows == 0 or cols == 0:
        inside = torch.zeros(torch.broadcast_shapes(row.shape, col.shape), dtype=torch.bool, device=row.device)
        return torch.zeros(inside.shape, dtype=_I64, device=row.device), inside
    row_in, col_in = row.clamp(0, rows - 1), col.clamp(0, cols - 1)
    inside = (row_in == row) & (col_in == col)
    return table[row_in, col_in].to(_I64), inside


def _first_references(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group equal keys (a stable sort keeps position order inside a group).

    Returns ``(sorted_keys, head, head_position)``: ``head[f]`` is the sorted index of the group of flat
    position ``f``, ``head_position[f]`` the flat position of the group's first member.
    """
    count = keys.numel()
    sorted_keys, order = torch.sort(keys, stable=True)
    index = torch.arange(count, dtype=_I64, device=keys.device)
    starts = torch.ones(count, dtype=torch.bool, device=keys.device)
    starts[1:] = sorted_keys[1:] != sorted_keys[:-1]
    group = torch.cummax(torch.where(starts, index, 0), dim=0).values
    head = torch.empty_like(group)
    head[order] = group
    head_position = torch.empty_like(group)
    head_position[order] = order[group]
    return sorted_keys, head, head_position


def _scatter_with_spill(target: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
    """``target.view(-1)[index] = values`` where ``index < target.numel()``; larger indexes are dropped.

    The writes go through a copy with one spill element, so the dropped writes need no mask on the host.
    """
    flat = target.reshape(-1)
    spill = torch.cat([flat, flat.new_zeros(1)])
    spill.index_put_((index.reshape(-1),), values.reshape(-1).to(target.dtype))
    target.copy_(spill[:-1].view(target.shape))


@dataclasses.dataclass
class _Rows:
    """Phase 0 per batch row (int64 ``[N]``): request (-1 past ``num_valid_rows``), run leader, state row
    (-1 for padding runs and for a later run on a claimed state row), whether the row leads its run."""

    request: torch.Tensor
    leader: torch.Tensor
    state: torch.Tensor
    is_leader: torch.Tensor

    @property
    def active(self) -> torch.Tensor:
        return self.state >= 0


def classify_rows(inputs: ResolveInputs) -> _Rows:
    """Phase 0 (``hisparse_kernels.cu:378-425``): requests, runs, state rows; decision D1 for shared states."""
    num_rows, device = inputs.num_rows, inputs.device
    rows = torch.arange(num_rows, dtype=_I64, device=device)
    if inputs.request_ids is None:
        request = rows
    else:
        request = inputs.request_ids.reshape(-1)[:num_rows].to(_I64)
        if inputs.num_valid_rows is not None:
            valid = inputs.num_valid_rows.reshape(-1)[:1].to(_I64)
            request = torch.where(rows < valid, request, -1)
    starts = torch.ones(num_rows, dtype=torch.bool, device=device)
    starts[1:] = request[1:] != request[:-1]
    leader = torch.cummax(torch.where(starts, rows, 0), dim=0).values
    if inputs.request_state_indices is None:
        state = request
    else:
        table = inputs.request_state_indices
        length = table.numel()
        if length == 0:
            state = torch.full_like(request, -1)
        else:
            inside = (request >= 0) & (request < length)
            state = torch.where(inside, table[request.clamp(0, length - 1)].to(_I64), -1)
    state = torch.where((state >= 0) & (state < inputs.num_states), state, -1)
    is_leader = leader == rows
    # Decision D1: a state row serves the first run of the call that names it; later runs are padding.
    first_claim = torch.full((inputs.num_states + 1,), num_rows, dtype=_I64, device=device)
    claims = is_leader & (state >= 0)
    first_claim.scatter_reduce_(0, torch.where(claims, state, inputs.num_states), rows, reduce="amin")
    owned = (state >= 0) & (first_claim[state.clamp(min=0)] == leader)
    return _Rows(request, leader, torch.where(owned, state, -1), is_leader)


def translate(inputs: ResolveInputs, rows: _Rows) -> tuple[torch.Tensor, torch.Tensor]:
    """Phase 1 (``hisparse_kernels.cu:217-261``): host row ``g`` and resident row of each position (int64
    ``[N, K]``, -1 when none). Source table by request row, resident table by **state** row (block 0 = host)."""
    topk = inputs.global_indices.to(_I64)
    resident = torch.full_like(topk, -1)
    if inputs.source_block_table is None:
        host = topk
    else:
        sbs = inputs.source_block_size
        # Floor division maps every negative token to a negative page, which _lookup reports as outside.
        page = torch.div(topk, sbs, rounding_mode="floor")
        block, inside = _lookup(inputs.source_block_table, rows.request[:, None], page)
        host = torch.where(inside & (block > 0), block * sbs + topk % sbs, -1)
        if inputs.resident_block_table is not None:
            rbs = inputs.resident_block_size
            page = torch.div(topk, rbs, rounding_mode="floor")
            block, inside = _lookup(inputs.resident_block_table, rows.state[:, None], page)
            resident = torch.where(inside & (block > 0), block * rbs + topk % rbs, -1)
    return torch.where(host >= inputs.host_rows, -1, host), resident


def _overflow_error(inputs: ResolveInputs, rows: _Rows, union: torch.Tensor) -> Callable[[int], UnionOverflowError]:
    """The typed error for the run led by batch row ``index`` (read on the CPU device only)."""

    def error(index: int) -> UnionOverflowError:
        return UnionOverflowError(int(rows.state[index]), int(rows.request[index]), int(union[index]),
                                  inputs.max_union_rows)
    return error


def check_union(inputs: ResolveInputs, rows: _Rows, union: torch.Tensor) -> torch.Tensor:
    """Phase 2 bound (``hisparse_kernels.cu:563-571``, decision D2): typed error on the CPU device, a device-side
    assertion on a GPU. Returns the per-row overflow mask the GPU path masks its writes with."""
    overflow = rows.is_leader & rows.active & (union > inputs.max_union_rows)
    device_checks.refuse(
        overflow, _overflow_error(inputs, rows, union),
        f"hisparse resolve_residency: a request's union exceeds max_union_rows = {inputs.max_union_rows}",
    )
    return overflow


def _attention_rows(rows: torch.Tensor, block_size: int, attention_block_stride: int) -> torch.Tensor:
    """Attention index of each physical row; -1 stays -1."""
    index = torch.div(rows, block_size, rounding_mode="floor") * attention_block_stride
    return torch.where(rows < 0, -1, index + torch.remainder(rows, block_size))


def _physical_rows(inputs: ResolveInputs, request: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """The hot row of ``slot`` through ``hot_block_table[request]`` (int64; a cell outside is block -1)."""
    block_size = inputs.block_size
    table = inputs.hot_block_table
    column = torch.div(slot, block_size, rounding_mode="floor")
    block, inside = _lookup(table, request, column)
    return torch.where(inside, block, -1) * block_size + torch.remainder(slot, block_size)


def resolve(inputs: ResolveInputs) -> None:
    """``hisparse_resolve_residency`` on checked inputs, vectorised with fixed shapes (see the module doc).

    Args:
        inputs: the checked arguments.

    Raises:
        UnionOverflowError: on the CPU device, before anything is written.
    """
    if inputs.empty:
        return
    num_rows, top_k, hot_size, num_states = inputs.num_rows, inputs.top_k, inputs.hot_size, inputs.num_states
    device = inputs.device
    flat_count = num_rows * top_k
    positions = torch.arange(hot_size, dtype=_I64, device=device)
    flat = torch.arange(flat_count, dtype=_I64, device=device)
    row_of = torch.div(flat, top_k, rounding_mode="floor")

    # Phase 0 and 1: runs, state rows, translation.
    rows = classify_rows(inputs)
    host, resident = translate(inputs, rows)
    backed = rows.active[:, None] & (resident < 0) & (host >= 0)

    # Phase 2: the union of each run; equal (run, host row) keys form one group, its head the first reference.
    leader = rows.leader
    keys = torch.where(backed, (leader[:, None] << _KEY_SHIFT) | host, _NO_KEY).reshape(-1)
    sorted_keys, head, head_position = _first_references(keys)
    first = backed.reshape(-1) & (head_position == flat)
    union = torch.zeros(num_rows, dtype=_I64, device=device).index_add_(0, leader, first.view(num_rows, top_k).sum(1))
    overflow = check_union(inputs, rows, union)
    active = rows.active & ~overflow[leader]  # a GPU masks an overflowing run (its assertion fired)
    backed = backed & active[:, None]
    first = first & backed.reshape(-1)
    has_union = union[leader] > 0
    state_row = rows.state.clamp(min=0)

    # Phase 3: classify each working leader's slots in LRU order. A slot is a hit iff it holds a union row.
    # Slot arrays have one row per batch row (fixed shapes); only working leaders' rows are used.
    working_rows = rows.is_leader & active & has_union
    classified = torch.arange(num_rows, dtype=_I64, device=device)
    slot_row = torch.zeros(num_rows, dtype=_I64, device=device)
    slot_row[classified] = torch.arange(classified.numel(), dtype=_I64, device=device)
    working = working_rows[classified][:, None]
    classified_state = state_row[classified]
    lru = inputs.lru_slots[classified_state].to(_I64)  # [L, H]; only working leaders' rows are used
    slot_ok = (lru >= 0) & (lru < hot_size)
    held = inputs.device_global_indices[classified_state].to(_I64).gather(1, lru.clamp(0, hot_size - 1))
    asked = working & slot_ok & (held >= 0)
    query = torch.where(asked, (leader[classified][:, None] << _KEY_SHIFT) | held, -1)
    found_at = torch.searchsorted(sorted_keys, query).clamp(max=flat_count - 1)
    hit = (query >= 0) & (sorted_keys[found_at] == query)
    hit_count = hit.sum(1)
    evictable = ~hit
    evictable_count = evictable.sum(1)
    evict_rank = torch.cumsum(evictable, 1) - 1
    hit_rank = torch.cumsum(hit, 1) - 1
    # Decision D3: a union row held twice resolves to its last slot in LRU order.
    hit_position = torch.full((flat_count + 1,), -1, dtype=_I64, device=device)
    hit_position.scatter_reduce_(
        0, torch.where(hit, found_at, flat_count).reshape(-1),
        positions.expand(classified.numel(), hot_size).reshape(-1), reduce="amax",
    )
    victims = torch.full((classified.numel(), hot_size + 1), -1, dtype=_I64, device=device)
    victims.scatter_(1, torch.where(evictable, evict_rank, hot_size), lru)

    # Phase 4: misses take the oldest evictable slots in first-reference order (tripwire: out-of-range victim).
    group_hit_position = hit_position[head]
    run_of = leader[row_of]
    slot_of = slot_row[run_of]
    is_hit = group_hit_position >= 0
    missed = first & ~is_hit
    missed_before = torch.cumsum(missed, 0) - missed.to(_I64)
    miss_rank = missed_before - missed_before[run_of * top_k]
    miss_total = torch.zeros(num_rows, dtype=_I64, device=device).index_add_(
        0, leader, missed.view(num_rows, top_k).sum(1)
    )
    in_victims = miss_rank < evictable_count[slot_of]
    miss_slot = torch.where(in_victims, victims[slot_of, miss_rank.clamp(0, hot_size - 1)], -1)
    hit_slot = lru[slot_of, group_hit_position.clamp(min=0)]
    slot = torch.where(is_hit, hit_slot, miss_slot[head_position])
    tripped = ~is_hit & ((slot < 0) | (slot >= hot_size))
    request_of = rows.request[row_of]
    physical = _physical_rows(inputs, request_of, slot)

    # Phase 5: publish indices and valid counts; phase 6: stats.
    served = backed.reshape(-1) & ~tripped
    loaded = missed & ~tripped
    resident_flat = resident.reshape(-1)
    index = torch.where(resident_flat >= 0, resident_flat, torch.where(served, physical, -1))
    index = torch.where(active[row_of], index, -1).view(num_rows, top_k)
    inputs.hot_indices.copy_(index)
    if inputs.attention_indices is not None:
        inputs.attention_indices.copy_(_attention_rows(index, inputs.block_size, inputs.attention_block_stride))
    if inputs.valid_counts is not None:
        counted = ((resident >= 0) | (host >= 0)).sum(1)
        inputs.valid_counts.copy_(torch.where(active, counted, 0))
    if inputs.stats is not None:
        misses = loaded.sum()
        hits = served.sum() - misses
        inputs.stats.view(_I64).add_(torch.stack([hits, misses]))

    # Swap plan: the m-th miss of a run lands at flat entry leader * K + m.
    if inputs.has_swaps:
        assert inputs.swap_host_physical_rows is not None and inputs.swap_device_physical_rows is not None
        assert inputs.swap_counts is not None
        into_plan = torch.where(missed, run_of * top_k + miss_rank, flat_count)
        _scatter_with_spill(inputs.swap_host_physical_rows, into_plan, host.reshape(-1))
        _scatter_with_spill(inputs.swap_device_physical_rows, into_plan, torch.where(tripped, -1, physical))
        share = (miss_total[leader] - (torch.arange(num_rows, device=device) - leader) * top_k).clamp(0, top_k)
        inputs.swap_counts.reshape(-1)[:num_rows].copy_(torch.where(active, share, 0))

    # State: DGI takes the loaded rows; phase 7: LRU = unused evictables, filled slots, hits (each in old order).
    into_state = torch.where(loaded, rows.state[row_of] * hot_size + slot, num_states * hot_size)
    _scatter_with_spill(inputs.device_global_indices, into_state, host.reshape(-1))
    fills = torch.minimum(miss_total[classified], evictable_count)[:, None]
    target = torch.where(
        hit,
        hot_size - hit_count[:, None] + hit_rank,
        torch.where(evict_rank >= fills, evict_rank - fills, hot_size - hit_count[:, None] - fills + evict_rank),
    )
    new_lru = torch.empty_like(lru).scatter_(1, target, lru)
    into_rows = torch.where(working[:, 0], rows.state[classified], num_states)
    spill_rows = torch.cat([inputs.lru_slots, inputs.lru_slots.new_zeros(1, hot_size)])
    spill_rows.index_copy_(0, into_rows, new_lru.to(inputs.lru_slots.dtype))
    inputs.lru_slots.copy_(spill_rows[:-1])


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
