"""Vectorized torch implementation of the four HiSparse cache ops, for any device.

Invariant: every tensor has a shape fixed by the arguments' shapes, and no value is read back to the host
(no ``.item()``, ``nonzero``, ``unique`` or boolean-mask indexing), so each op can be captured in a CUDA/HIP
graph. Outputs, state and untouched entries are bit-equal to ``oracle.py``.
"""

from __future__ import annotations

import torch

from . import arguments

__all__ = ["gather_compact", "gather_plan", "invalidate_written_slots", "plan_gather_plan", "resolve_residency",
           "word_rows"]

# Sort keys of host-backed positions are ``leader_row << _KEY_SHIFT | host_row``. Host rows are int32 and
# batch rows are far below 2**30, so every real key stays below _NO_KEY.
_KEY_SHIFT = 32
_NO_KEY = 1 << 62
_I64 = torch.int64

# error_flags bits (see docs/design/cache-ops.md).
_FLAG_UNION_OVERFLOW = 1
_FLAG_LRU_TRIPWIRE = 2
_FLAG_SHARED_STATE_ROW = 4


def _lookup(table: torch.Tensor, row: torch.Tensor, col: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``table[row, col]`` as int64 where both are in range, with the in-range mask; never indexes out of range."""
    rows, cols = table.shape
    if rows == 0 or cols == 0:
        inside = torch.zeros(torch.broadcast_shapes(row.shape, col.shape), dtype=torch.bool, device=row.device)
        return torch.zeros(inside.shape, dtype=_I64, device=row.device), inside
    row_in, col_in = row.clamp(0, rows - 1), col.clamp(0, cols - 1)
    inside = (row_in == row) & (col_in == col)
    return table[row_in, col_in].to(_I64), inside


def _runs(request_ids: torch.Tensor | None, num_rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per batch row: its run's first row and its request row ``q`` (both int64 ``[N]``)."""
    rows = torch.arange(num_rows, dtype=_I64, device=device)
    if request_ids is None:
        return rows, rows
    request = request_ids.reshape(-1)[:num_rows].to(_I64)
    starts = torch.ones(num_rows, dtype=torch.bool, device=device)
    starts[1:] = request[1:] != request[:-1]
    leader = torch.cummax(torch.where(starts, rows, 0), dim=0).values
    return leader, request


def _state_rows(
    request_row: torch.Tensor, request_state_indices: torch.Tensor | None, num_states: int
) -> torch.Tensor:
    """State row of each batch row, or -1 where the request row or its state row is out of range."""
    if request_state_indices is None:
        state = request_row
    else:
        table = request_state_indices.reshape(-1)
        length = table.numel()
        if length == 0:
            return torch.full_like(request_row, -1)
        inside = (request_row >= 0) & (request_row < length)
        state = torch.where(inside, table[request_row.clamp(0, length - 1)].to(_I64), -1)
    return torch.where((state >= 0) & (state < num_states), state, -1)


def _translate(
    topk: torch.Tensor,
    request_row: torch.Tensor,
    host_rows: int,
    source_block_table: torch.Tensor | None,
    source_block_size: int,
    resident_block_table: torch.Tensor | None,
    resident_block_size: int,
    resident_null_block: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Host row ``g`` and resident row of each top-k position (int64 ``[N, K]``; -1 when none).

    Without a source table ``g`` is the top-k value itself, negative values included.
    """
    q = request_row[:, None]
    resident = torch.full_like(topk, -1)
    if source_block_table is None:
        host = topk
    else:
        # Floor division maps every negative token to a negative page, which _lookup reports as outside.
        page = torch.div(topk, source_block_size, rounding_mode="floor")
        block, inside = _lookup(source_block_table, q, page)
        host = torch.where(inside & (block > 0), block * source_block_size + topk % source_block_size, -1)
        if resident_block_table is not None:
            page = torch.div(topk, resident_block_size, rounding_mode="floor")
            block, inside = _lookup(resident_block_table, q, page)
            mapped = inside & (block >= 0) & (block != resident_null_block)
            resident = torch.where(mapped, block * resident_block_size + topk % resident_block_size, -1)
    return torch.where(host >= host_rows, -1, host), resident


def _physical_rows(
    hot_block_table: torch.Tensor, request_row: torch.Tensor, slot: torch.Tensor, block_size: int
) -> torch.Tensor:
    """``PHYS(q, slot)``: the hot row of ``slot`` in request row ``q``'s hot blocks (int64)."""
    block, _ = _lookup(hot_block_table, request_row, torch.div(slot, block_size, rounding_mode="floor"))
    return block * block_size + torch.remainder(slot, block_size)


def _attention_rows(rows: torch.Tensor, block_size: int, attention_block_stride: int) -> torch.Tensor:
    """Attention index of each physical row; -1 stays -1."""
    index = torch.div(rows, block_size, rounding_mode="floor") * attention_block_stride
    return torch.where(rows < 0, -1, index + torch.remainder(rows, block_size))


def _scatter_with_spill(target: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
    """``target.view(-1)[index] = values`` where ``index < target.numel()``; larger indexes are dropped.

    The writes go through a copy with one spill element, so the dropped writes need no mask on the host.
    """
    flat = target.reshape(-1)
    spill = torch.cat([flat, flat.new_zeros(1)])
    spill.index_put_((index.reshape(-1),), values.reshape(-1).to(target.dtype))
    target.copy_(spill[:-1].view(target.shape))


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


def resolve_residency(
    host_cache: torch.Tensor,
    hot_cache: torch.Tensor,
    hot_block_table: torch.Tensor,
    global_indices: torch.Tensor,
    hot_indices: torch.Tensor,
    device_global_indices: torch.Tensor,
    lru_slots: torch.Tensor,
    request_state_indices: torch.Tensor | None,
    region_stride: int,
    max_union_rows: int,
    miss_mask: torch.Tensor | None = None,
    stats: torch.Tensor | None = None,
    attention_indices: torch.Tensor | None = None,
    attention_block_stride: int = 0,
    request_ids: torch.Tensor | None = None,
    source_block_table: torch.Tensor | None = None,
    source_block_size: int = 0,
    resolved_global_indices: torch.Tensor | None = None,
    valid_counts: torch.Tensor | None = None,
    swap_host_physical_rows: torch.Tensor | None = None,
    swap_device_physical_rows: torch.Tensor | None = None,
    swap_counts: torch.Tensor | None = None,
    resident_block_table: torch.Tensor | None = None,
    resident_block_size: int = 0,
    resident_null_block: int = 0,
    *,
    error_flags: torch.Tensor | None = None,
) -> None:
    """Plan one decode step: translate top-k, find hot-buffer hits, give misses LRU victims, update state.

    Arguments, order and in-place outputs are those of vLLM 0.33.0's ``hisparse_resolve_residency``
    (see docs/design/cache-ops.md); ``error_flags`` (int32 ``[1]``) is OR-ed with 1 on a union overflow,
    2 on an out-of-range LRU victim, 4 on a state row shared by two runs. Moves no KV bytes.

    Raises:
        InvalidArgumentError: a dtype, shape, device, stride or size check failed (nothing is written).
    """
    arguments.check_resolve_residency(
        host_cache, hot_cache, hot_block_table, global_indices, hot_indices, device_global_indices,
        lru_slots, request_state_indices, region_stride, max_union_rows, miss_mask, stats,
        attention_indices, attention_block_stride, request_ids, source_block_table, source_block_size,
        resolved_global_indices, valid_counts, swap_host_physical_rows, swap_device_physical_rows,
        swap_counts, resident_block_table, resident_block_size, resident_null_block, error_flags=error_flags,
    )
    # Full passes (kernels reading or writing a whole [N, K] / [N, H] / [S, H] tensor), counted with a
    # TorchDispatchMode on a bench step (N = 6, K = 64, S = 3, H = 192, all outputs given): 120 over [N, K]
    # (6 of them [N*K + 1] spill copies), 46 over [N, H] (slot classification runs per batch row, not per state
    # row), 6 over [S, H] (the DGI / LRU spill writes). Not reduced yet: classifying per state row would turn
    # the 46 [N, H] passes into [S, H] ones (a factor Q for MTP batches), the next step for issue 15 item 2.
    num_rows, top_k = global_indices.shape
    if num_rows == 0 or top_k == 0:
        return
    device = global_indices.device
    num_states, hot_size = device_global_indices.shape
    block_size = hot_cache.shape[1]
    flat_count = num_rows * top_k
    rows = torch.arange(num_rows, dtype=_I64, device=device)
    positions = torch.arange(hot_size, dtype=_I64, device=device)

    # Runs and state rows.
    leader, request_row = _runs(request_ids, num_rows, device)
    state = _state_rows(request_row, request_state_indices, num_states)
    live = state >= 0
    state_row = state.clamp(min=0)  # a valid index everywhere; rows with state -1 are masked by `live`

    # Phase 1: translate every position.
    host, resident = _translate(
        global_indices.to(_I64), request_row, host_cache.shape[0], source_block_table, source_block_size,
        resident_block_table, resident_block_size, resident_null_block,
    )
    backed = live[:, None] & (resident < 0) & (host >= 0)

    # The union of each run: equal (run, host row) keys form one group; its head is the first reference.
    keys = torch.where(backed, (leader[:, None] << _KEY_SHIFT) | host, _NO_KEY).reshape(-1)
    sorted_keys, head, head_position = _first_references(keys)
    flat = torch.arange(flat_count, dtype=_I64, device=device)
    first = backed.reshape(-1) & (head_position == flat)
    union = torch.zeros(num_rows, dtype=_I64, device=device).index_add_(0, leader, first.view(num_rows, top_k).sum(1))
    overflow = live & (union[leader] > max_union_rows)

    # A state row serves one run per call: a later run on the same state row is treated like padding.
    is_leader = leader == rows
    claims = is_leader & live & ~overflow
    first_claim = torch.full((num_states + 1,), num_rows, dtype=_I64, device=device)
    first_claim.scatter_reduce_(0, torch.where(claims, state, num_states), rows, reduce="amin")
    shared = live & ~overflow & (first_claim[state_row] != leader)
    active = live & ~overflow & ~shared
    backed = backed & active[:, None]
    first = first & backed.reshape(-1)

    # Phase 2: classify each leader's slots in LRU order. A slot is a hit iff it holds a row of the union.
    lru = lru_slots[state_row].to(_I64)  # [N, H]; only active leaders' rows are used
    slot_ok = (lru >= 0) & (lru < hot_size)
    held = device_global_indices[state_row].to(_I64).gather(1, lru.clamp(0, hot_size - 1))
    asked = (is_leader & active)[:, None] & slot_ok & (held >= 0)
    query = torch.where(asked, (leader[:, None] << _KEY_SHIFT) | held, -1)
    found_at = torch.searchsorted(sorted_keys, query).clamp(max=flat_count - 1)
    hit = (query >= 0) & (sorted_keys[found_at] == query)
    hit_count = hit.sum(1)
    evictable = ~hit
    evict_rank = torch.cumsum(evictable, 1) - 1
    hit_rank = torch.cumsum(hit, 1) - 1
    # A union row held twice (only a corrupted DGI does that) resolves to its last slot in LRU order.
    hit_position = torch.full((flat_count + 1,), -1, dtype=_I64, device=device)
    hit_position.scatter_reduce_(
        0, torch.where(hit, found_at, flat_count).reshape(-1), positions.expand(num_rows, hot_size).reshape(-1),
        reduce="amax",
    )
    victims = torch.zeros(num_rows, hot_size + 1, dtype=_I64, device=device)
    victims.scatter_(1, torch.where(evictable, evict_rank, hot_size), lru)

    # Phase 3: misses take the oldest evictable slots in first-reference order.
    group_hit_position = hit_position[head]
    row_of = torch.div(flat, top_k, rounding_mode="floor")
    run_of = leader[row_of]
    is_hit = group_hit_position >= 0
    missed = first & ~is_hit
    missed_before = torch.cumsum(missed, 0) - missed.to(_I64)
    miss_rank = missed_before - missed_before[run_of * top_k]
    miss_total = torch.zeros(num_rows, dtype=_I64, device=device).index_add_(
        0, leader, missed.view(num_rows, top_k).sum(1)
    )
    miss_slot = victims[run_of, miss_rank.clamp(0, hot_size - 1)]
    hit_slot = lru[run_of, group_hit_position.clamp(min=0)]
    slot = torch.where(is_hit, hit_slot, miss_slot[head_position])
    tripped = ~is_hit & ((slot < 0) | (slot >= hot_size))  # corrupted LRU entry handed to a miss
    physical = _physical_rows(hot_block_table, request_row[row_of], slot, block_size)

    # Phase 4: publish indices and count.
    served = backed.reshape(-1) & ~tripped
    loaded = missed & ~tripped
    resident_flat = resident.reshape(-1)
    index = torch.where(resident_flat >= 0, resident_flat, torch.where(served, physical, -1))
    index = torch.where(active[row_of], index, -1).view(num_rows, top_k)
    hot_indices.copy_(index)
    if attention_indices is not None:
        attention_indices.copy_(_attention_rows(index, block_size, attention_block_stride))
    if resolved_global_indices is not None:
        resolved_global_indices.copy_(torch.where(active[:, None], host, -1))
    if valid_counts is not None:
        counted = ((resident >= 0) | (host >= 0)).sum(1)
        valid_counts.copy_(torch.where(active, counted, 0))
    if miss_mask is not None:
        miss_mask.copy_(torch.where(active[:, None], loaded.view(num_rows, top_k).to(miss_mask.dtype), miss_mask))
    if stats is not None:
        misses = loaded.sum()
        hits = served.sum() - misses
        totals = stats.view(_I64)
        totals.add_(torch.stack([hits, misses]))

    # Swap plan: the m-th miss of a run lands at flat entry leader * K + m.
    into_plan = torch.where(missed, run_of * top_k + miss_rank, flat_count)
    if swap_host_physical_rows is not None and swap_device_physical_rows is not None and swap_counts is not None:
        _scatter_with_spill(swap_host_physical_rows, into_plan, host.reshape(-1))
        _scatter_with_spill(swap_device_physical_rows, into_plan, torch.where(tripped, -1, physical))
        share = (miss_total[leader] - (rows - leader) * top_k).clamp(0, top_k)
        swap_counts.reshape(-1)[:num_rows].copy_(torch.where(active, share, 0))

    # State: DGI takes the loaded rows; LRU = unused evictables, filled slots, hits (each in old order).
    into_state = torch.where(loaded, state[row_of] * hot_size + slot, num_states * hot_size)
    _scatter_with_spill(device_global_indices, into_state, host.reshape(-1))
    fills = torch.minimum(miss_total, evictable.sum(1))[:, None]
    target = torch.where(
        hit,
        hot_size - hit_count[:, None] + hit_rank,
        torch.where(evict_rank >= fills, evict_rank - fills, hot_size - hit_count[:, None] - fills + evict_rank),
    )
    new_lru = torch.empty_like(lru).scatter_(1, target, lru)
    into_rows = torch.where(is_leader & active, state, num_states)
    spill_rows = torch.cat([lru_slots, lru_slots.new_zeros(1, hot_size)])
    spill_rows.index_copy_(0, into_rows, new_lru.to(lru_slots.dtype))
    lru_slots.copy_(spill_rows[:-1])

    if error_flags is not None:
        flags = (
            overflow.any().to(torch.int32) * _FLAG_UNION_OVERFLOW
            + (missed & tripped).any().to(torch.int32) * _FLAG_LRU_TRIPWIRE
            + shared.any().to(torch.int32) * _FLAG_SHARED_STATE_ROW
        )
        error_flags.bitwise_or_(flags)


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


#: Bytes of row data one round of a gather holds at once (host rows read, current rows, merged rows: three
#: buffers of this size). Bounds a gather's extra memory whatever R x K is; 4 MiB rounds keep it near the
#: cache and cost about 3 x 4 MiB at any batch size.
COPY_ROUND_BYTES = 4 << 20


def _copy_rows(
    host_cache: torch.Tensor, hot_cache: torch.Tensor, source: torch.Tensor, destination: torch.Tensor,
    write: torch.Tensor,
) -> None:
    """For every entry with ``write``: hot row ``destination`` := host row ``source`` (zeros if past the end).

    Fixed shape: every entry writes its destination row. An entry that must not write re-stores the row its
    destination group ends with: the last writing entry's source row, or the row's current bytes. So all
    entries of one destination store identical bytes and the scatter's order cannot matter; a destination
    written twice ends with the later entry, as the oracle's sequential loop does. Rows move in rounds of
    ``COPY_ROUND_BYTES`` (a number of rounds fixed by the shapes), so extra memory does not grow with R x K
    beyond the int64 index arrays.
    """
    source, destination, write = source.reshape(-1), destination.reshape(-1), write.reshape(-1)
    host_rows = host_cache.shape[0]
    hot = word_rows(hot_cache)
    if hot.dim() == 2:  # a 2-D staging buffer: block size 1
        hot = hot.unsqueeze(1)
    blocks, block_size, words = hot.shape
    hot_rows = blocks * block_size
    if hot_rows == 0:
        return
    target = torch.where(write, destination, 0)
    _, group, _ = _first_references(target)
    entries = torch.arange(target.numel(), dtype=_I64, device=target.device)
    last_writer = torch.full_like(entries, -1).scatter_reduce_(
        0, group, torch.where(write, entries, -1), reduce="amax"
    )[group]
    written = last_writer >= 0
    writer_source = source[last_writer.clamp(min=0)]
    from_host = written & (writer_source < host_rows)
    writer_source = writer_source.clamp(0, max(host_rows - 1, 0))
    host = word_rows(host_cache)
    flat = hot.view(hot_rows, words) if hot.stride(0) == block_size * words else None
    round_rows = max(1, COPY_ROUND_BYTES // (words * hot.element_size()))
    for start in range(0, target.numel(), round_rows):
        piece = slice(start, start + round_rows)
        rows = target[piece]
        if flat is not None:
            current = flat.index_select(0, rows)
        else:  # blocks strided apart (a slab view): address each row by (block, offset)
            current = hot[torch.div(rows, block_size, rounding_mode="floor"), torch.remainder(rows, block_size)]
        if host_rows > 0:
            loaded = host.index_select(0, writer_source[piece])
            merged = torch.where(from_host[piece, None], loaded, torch.where(written[piece, None], 0, current))
        else:
            merged = torch.where(written[piece, None], 0, current)
        if flat is not None:
            flat.index_copy_(0, rows, merged)
        else:
            hot.index_put_((torch.div(rows, block_size, rounding_mode="floor"), torch.remainder(rows, block_size)),
                           merged)


def gather_compact(
    host_cache: torch.Tensor,
    hot_cache: torch.Tensor,
    miss_global_indices: torch.Tensor,
    miss_hot_indices: torch.Tensor,
    miss_counts: torch.Tensor,
) -> None:
    """Copy the first ``clamp(miss_counts[r], 0, K)`` planned rows of every row ``r`` from host to hot.

    A host row past the end zero-fills its destination; a negative host row or a destination outside the hot
    cache is skipped. Arguments as vLLM 0.33.0's ``hisparse_gather_compact``.

    Raises:
        InvalidArgumentError: a dtype, shape, device or stride check failed (nothing is copied).
    """
    arguments.check_gather_compact(host_cache, hot_cache, miss_global_indices, miss_hot_indices, miss_counts)
    num_rows, top_k = miss_global_indices.shape
    if num_rows == 0 or top_k == 0:
        return
    device = miss_global_indices.device
    hot_rows = hot_cache.shape[0] * hot_cache.shape[1]
    count = miss_counts.reshape(-1)[:num_rows].to(_I64).clamp(0, top_k)
    columns = torch.arange(top_k, dtype=_I64, device=device)
    source = miss_global_indices.to(_I64)
    destination = miss_hot_indices.to(_I64)
    write = (columns < count[:, None]) & (source >= 0) & (destination >= 0) & (destination < hot_rows)
    _copy_rows(host_cache, hot_cache, source, destination, write)


def gather_plan(
    host_cache: torch.Tensor,
    hot_cache: torch.Tensor,
    global_indices: torch.Tensor,
    hot_indices: torch.Tensor,
    miss_mask: torch.Tensor,
    request_state_indices: torch.Tensor | None = None,
    attention_indices: torch.Tensor | None = None,
    attention_block_stride: int = 0,
) -> None:
    """Copy host row ``global_indices[r, c]`` to hot row ``hot_indices[r, c]`` wherever ``miss_mask`` is set.

    ``request_state_indices[r] < 0`` marks padding row ``r`` (nothing copied, attention -1). A 2-D hot cache is
    a staging buffer with block size 1. Arguments as vLLM 0.33.0's ``hisparse_gather_plan``.

    Raises:
        InvalidArgumentError: a dtype, shape, device or stride check failed (nothing is copied).
    """
    planned = plan_gather_plan(
        host_cache, hot_cache, global_indices, hot_indices, miss_mask, request_state_indices,
        attention_indices, attention_block_stride,
    )
    if planned is not None:
        _copy_rows(host_cache, hot_cache, *planned)


def plan_gather_plan(
    host_cache: torch.Tensor,
    hot_cache: torch.Tensor,
    global_indices: torch.Tensor,
    hot_indices: torch.Tensor,
    miss_mask: torch.Tensor,
    request_state_indices: torch.Tensor | None,
    attention_indices: torch.Tensor | None,
    attention_block_stride: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``gather_plan`` up to its copy: checks the arguments, writes ``attention_indices`` and returns the
    int64 ``(source, destination, write)`` of every plan entry (None for an empty plan). Shared by the torch and
    host implementations, which differ only in how they copy the rows ``write`` selects.

    Raises:
        InvalidArgumentError: as :func:`gather_plan` (nothing is written).
    """
    arguments.check_gather_plan(
        host_cache, hot_cache, global_indices, hot_indices, miss_mask, request_state_indices,
        attention_indices, attention_block_stride,
    )
    num_rows, columns = global_indices.shape
    if num_rows == 0 or columns == 0:
        return None
    block_size = 1 if hot_cache.dim() == 2 else hot_cache.shape[1]
    hot_rows = hot_cache.shape[0] * block_size
    destination = hot_indices.to(_I64)
    if request_state_indices is None:
        padding = torch.zeros(num_rows, 1, dtype=torch.bool, device=destination.device)
    else:
        padding = (request_state_indices.reshape(-1)[:num_rows] < 0)[:, None]
    if attention_indices is not None:
        rows = torch.where(padding, -1, destination)
        attention_indices.copy_(_attention_rows(rows, block_size, attention_block_stride))
    source = global_indices.to(_I64)
    write = ~padding & (miss_mask != 0) & (source >= 0) & (destination >= 0) & (destination < hot_rows)
    return source, destination, write


def invalidate_written_slots(
    device_global_indices: torch.Tensor,
    request_state_indices: torch.Tensor,
    req_id_per_token: torch.Tensor,
    written_slots: torch.Tensor,
) -> None:
    """Set to -1 every DGI entry of token ``t``'s state row that holds host row ``written_slots[t]``.

    Tokens with an out-of-range request or state row, or a negative slot, change nothing. Arguments as
    vLLM 0.33.0's ``hisparse_invalidate_written_slots``.

    Raises:
        InvalidArgumentError: a dtype, shape, device or contiguity check failed (nothing is written).
    """
    arguments.check_invalidate_written_slots(
        device_global_indices, request_state_indices, req_id_per_token, written_slots
    )
    num_states, hot_size = device_global_indices.shape
    tokens = written_slots.numel()
    if tokens == 0 or num_states == 0 or hot_size == 0:
        return
    state = _state_rows(req_id_per_token.reshape(-1).to(_I64), request_state_indices, num_states)
    slot = written_slots.reshape(-1).to(_I64)
    # A DGI entry is int32, so a slot past int32 can match nothing.
    wanted = (state >= 0) & (slot >= 0) & (slot <= torch.iinfo(torch.int32).max)
    keys, _ = torch.sort(torch.where(wanted, (state << _KEY_SHIFT) | slot, _NO_KEY))
    held = device_global_indices.to(_I64)
    states = torch.arange(num_states, dtype=_I64, device=held.device)[:, None]
    query = torch.where(held >= 0, (states << _KEY_SHIFT) | held, -1)
    found = keys[torch.searchsorted(keys, query).clamp(max=tokens - 1)] == query
    device_global_indices.masked_fill_(found & (query >= 0), -1)
