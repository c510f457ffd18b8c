"""``hisparse_resolve_residency`` for tensors in host memory: the oracle's phases as whole-array numpy passes.

Invariant: every output, state tensor, stat and untouched (poisoned) element is bit-equal to ``oracle.py``
(docs/design/cache-ops.md §2 and decisions D1-D9). Values are free to read on the host, so unlike
``torch_resolve`` this path compresses to the host-backed positions (``nonzero``), groups each run's union with
one sort of those positions' ``leader x host_rows + g`` keys, ties in position order (so a group's first member
is its first reference), finds the groups of the slots' DGI values through a dense host-row table, classifies
only the working runs' slots, and orders only the misses. The union bound is checked before anything is
written (:class:`UnionOverflowError`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from hisparse_hal.errors import UnionOverflowError

from . import torch_resolve
from .arguments import ResolveInputs

__all__ = ["resolve"]

_I64 = np.int64


@dataclasses.dataclass
class _Rows:
    """Phase 0 per batch row (int64 ``[N]``): request, run leader, owned state row (-1: padding, D1)."""

    request: np.ndarray
    leader: np.ndarray
    state: np.ndarray
    is_leader: np.ndarray

    @property
    def active(self) -> np.ndarray:
        return self.state >= 0


@dataclasses.dataclass
class _Union:
    """Phase 2: the host-backed positions and their union entries ("groups"), one per distinct (run, g).

    ``positions``: flat positions of the host-backed references (ascending); ``group``: each one's group.
    Per group (sorted by key): ``leader`` (the run's leader row), ``host`` (g), ``first`` (flat position of the
    first reference). ``size``: union entries per batch row (non-zero at leaders only).
    """

    positions: np.ndarray
    group: np.ndarray
    leader: np.ndarray
    host: np.ndarray
    first: np.ndarray
    keys: np.ndarray
    size: np.ndarray


@dataclasses.dataclass
class _Slots:
    """Phase 3 for the working runs (``[L, H]``, row ``i`` = leader ``leaders[i]``): LRU, which LRU entries are
    hits, the victims (evictables in LRU order, then the hits from the most recently used end; decision D5),
    and per group its hit slot (-1 for a miss)."""

    leaders: np.ndarray
    row_of_leader: np.ndarray
    lru: np.ndarray
    hit: np.ndarray
    victims: np.ndarray
    group_slot: np.ndarray


def _lookup(table: np.ndarray, row: np.ndarray, col: np.ndarray) -> np.ndarray:
    """``table[row, col]`` as int64 where both are in range, else -1 (``row`` ``[N, 1]`` or like ``col``)."""
    rows, cols = table.shape
    if rows == 0 or cols == 0:
        return np.full(np.broadcast_shapes(row.shape, col.shape), -1, dtype=_I64)
    inside = (row >= 0) & (row < rows) & (col >= 0) & (col < cols)
    value = table[np.clip(row, 0, rows - 1), np.clip(col, 0, cols - 1)]
    return np.where(inside, value, -1).astype(_I64, copy=False)


def _divmod(values: np.ndarray, divisor: int) -> tuple[np.ndarray, np.ndarray]:
    """Floor quotient and non-negative remainder (Python's), by shift and mask for a power of two."""
    if divisor > 0 and divisor & (divisor - 1) == 0:
        shift = divisor.bit_length() - 1
        return values >> shift, values & (divisor - 1)
    return values // divisor, values % divisor


def classify_rows(inputs: ResolveInputs) -> _Rows:
    """Phase 0 (``hisparse_kernels.cu:378-425``): ``torch_resolve``'s ``[N]`` classification (decision D1)."""
    rows = torch_resolve.classify_rows(inputs)
    return _Rows(rows.request.numpy(), rows.leader.numpy(), rows.state.numpy(), rows.is_leader.numpy())


def translate(inputs: ResolveInputs, rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
    """Phase 1 (``hisparse_kernels.cu:217-261``): host row and resident row of each position (int64 ``[N, K]``,
    -1 when none). Source table by request row, resident table by **state** row (block 0 = host)."""
    topk = inputs.global_indices.numpy().astype(_I64)
    resident = np.full(topk.shape, -1, dtype=_I64)
    if inputs.source_block_table is None:
        host = topk
    else:
        sbs = inputs.source_block_size
        page, offset = _divmod(topk, sbs)  # floor: a negative token is a negative page, outside every table
        block = _lookup(inputs.source_block_table.numpy(), rows.request[:, None], page)
        host = np.where(block > 0, block * sbs + offset, -1)
        if inputs.resident_block_table is not None:
            rbs = inputs.resident_block_size
            page, offset = _divmod(topk, rbs)
            block = _lookup(inputs.resident_block_table.numpy(), rows.state[:, None], page)
            resident = np.where(block > 0, block * rbs + offset, -1)
    host[host >= inputs.host_rows] = -1
    return host, resident


def _sort_by_key_then_index(keys: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """``(keys[order], order)`` with ``order`` sorting by key, ties by index (a stable argsort). Keys are in
    ``[0, bound)``; when key and index fit one int64 word, one value sort of ``key << bits | index`` (about half
    an argsort's time), else a stable argsort."""
    bits = max(int(keys.size - 1).bit_length(), 1)
    if max(bound - 1, 1).bit_length() + bits > 62:
        order = np.argsort(keys, kind="stable")
        return keys[order], order
    packed = np.sort((keys << bits) | np.arange(keys.size, dtype=_I64))
    return packed >> bits, packed & ((1 << bits) - 1)


def union(inputs: ResolveInputs, rows: _Rows, host: np.ndarray, resident: np.ndarray) -> _Union:
    """Phase 2: each run's distinct host rows of its host-backed positions, keyed to their first reference."""
    backed = rows.active[:, None] & (resident < 0) & (host >= 0)
    batch_row, column = np.nonzero(backed)
    positions = batch_row * inputs.top_k + column
    g = host[batch_row, column]
    span = max(inputs.host_rows, 1)
    keys = rows.leader[batch_row] * span + g
    ordered, order = _sort_by_key_then_index(keys, inputs.num_rows * span)
    starts = np.ones(ordered.size, dtype=bool)
    starts[1:] = ordered[1:] != ordered[:-1]
    start_at = np.flatnonzero(starts)
    group = np.empty(ordered.size, dtype=_I64)
    group[order] = np.cumsum(starts) - 1
    unique = ordered[start_at]
    first = positions[order[start_at]]  # ties are in index (= position) order: the group's first reference
    leader = unique // span
    size = np.bincount(leader, minlength=inputs.num_rows)
    return _Union(positions, group, leader, unique - leader * span, first, unique, size)


def check_union(inputs: ResolveInputs, rows: _Rows, entries: _Union) -> None:
    """Phase 2 bound (``hisparse_kernels.cu:563-571``, decision D2), before any write.

    Raises:
        UnionOverflowError: naming the first overflowing run in row order.
    """
    over = np.flatnonzero(rows.is_leader & rows.active & (entries.size > inputs.max_union_rows))
    if over.size:
        r = int(over[0])
        raise UnionOverflowError(int(rows.state[r]), int(rows.request[r]), int(entries.size[r]),
                                 inputs.max_union_rows)


def classify_slots(inputs: ResolveInputs, rows: _Rows, entries: _Union) -> _Slots:
    """Phase 3 (``hisparse_kernels.cu:574-669``) for the runs with a union. Hits come from a scan of every slot
    of ``DGI[s]`` whatever the LRU holds (cu:574-609): a slot holding a union row serves it, a row held twice
    takes its later slot (decision D3). The LRU walk only sorts its entries (cu:630-632): an in-range entry whose
    slot serves is a hit, every other entry (out-of-range values included) evictable."""
    hot_size = inputs.hot_size
    leaders = np.flatnonzero(rows.is_leader & rows.active & (entries.size > 0))
    row_of_leader = np.zeros(inputs.num_rows, dtype=_I64)
    row_of_leader[leaders] = np.arange(leaders.size)
    states = rows.state[leaders]
    lru = inputs.lru_slots.numpy()[states]  # int16
    group_slot = np.full(entries.keys.size, -1, dtype=_I64)
    if hot_size == 0 or entries.keys.size == 0:
        return _Slots(leaders, row_of_leader, lru, np.zeros(lru.shape, dtype=bool), lru.astype(_I64), group_slot)
    held = inputs.device_global_indices.numpy()[states].astype(_I64)  # [L, H] in slot order
    found = _find_groups(inputs, entries, leaders, held)
    serving = (held >= 0) & (held < inputs.host_rows) & (found >= 0)
    at = np.nonzero(serving)  # row-major: slots ascending within a run
    hit_group = found[at]
    if np.bincount(hit_group, minlength=1).max(initial=0) > 1:  # a union row held by two slots
        np.maximum.at(group_slot, hit_group, at[1])  # D3: the later slot in slot order
    else:
        group_slot[hit_group] = at[1]
    top = min(hot_size, int(np.iinfo(lru.dtype).max) + 1)  # int16 values never reach a larger region
    slot_ok = (lru >= 0) & (lru < top)
    column = np.clip(lru, 0, top - 1).astype(_I64)
    hit = slot_ok & np.take_along_axis(serving, column, 1)
    return _Slots(leaders, row_of_leader, lru, hit, _victims(lru, hit), group_slot)


def _victims(lru: np.ndarray, hit: np.ndarray) -> np.ndarray:
    """Per run (``[L, H]``), miss ``m``'s victim at column ``m``: the evictables in LRU order, then the hits
    reversed, as vLLM's compacted array read from its end (``hisparse_kernels.cu:660-668, 733``)."""
    hot_size = lru.shape[1]
    hits_before = np.cumsum(hit, 1, dtype=_I64)
    at = np.where(hit, hot_size - hits_before, np.arange(hot_size, dtype=_I64) - hits_before)
    order = np.empty(lru.shape, dtype=_I64)
    np.put_along_axis(order, at, lru.astype(_I64), 1)
    return order


def _find_groups(inputs: ResolveInputs, entries: _Union, leaders: np.ndarray, held: np.ndarray) -> np.ndarray:
    """The group of ``(leaders[i], held[i, j])`` or -1 (``held`` outside ``[0, host_rows)`` gives garbage, to be
    masked). A dense host-row -> group table when no host row is in two runs' unions, else a binary search."""
    size = entries.keys.size
    numbers = np.arange(1, size + 1, dtype=np.int32)
    table = np.zeros(inputs.host_rows, dtype=np.int32)  # group + 1; zero pages cost nothing until touched
    table[entries.host] = numbers
    clipped = np.clip(held, 0, inputs.host_rows - 1)
    if np.array_equal(table[entries.host], numbers):
        found = table[clipped].astype(_I64) - 1
        same_run = entries.leader[found] == leaders[:, None]  # found = -1 reads the last group: masked below
        return np.where((found >= 0) & same_run, found, -1)
    query = leaders[:, None] * max(inputs.host_rows, 1) + clipped
    found = np.minimum(np.searchsorted(entries.keys, query), size - 1)
    return np.where(entries.keys[found] == query, found, -1)


@dataclasses.dataclass
class _Misses:
    """Phase 4: the miss groups in first-reference order, their rank in their run, victim slot, tripwire."""

    group: np.ndarray
    rank: np.ndarray
    slot: np.ndarray
    tripped: np.ndarray
    total: np.ndarray  # misses per batch row (at leaders), invalid ones included


def assign_misses(inputs: ResolveInputs, entries: _Union, slots: _Slots) -> _Misses:
    """Phase 4 (``hisparse_kernels.cu:677-786``): misses in first-reference order take victim ``m`` (decision D5
    past the evictables; ``m < max_union_rows <= H``); an out-of-range victim trips the corruption tripwire."""
    hot_size = inputs.hot_size
    missed = np.flatnonzero(slots.group_slot < 0)
    group = missed[np.argsort(entries.first[missed])]  # positions are unique: any sort is exact
    leader = entries.leader[group]
    total = np.bincount(leader, minlength=inputs.num_rows)
    before = np.cumsum(total) - total
    rank = np.arange(group.size, dtype=_I64) - before[leader]
    slot = slots.victims[slots.row_of_leader[leader], rank] if group.size else np.zeros(0, dtype=_I64)
    tripped = (slot < 0) | (slot >= hot_size)
    slots.group_slot[group] = np.where(tripped, -1, slot)
    return _Misses(group, rank, slot, tripped, total)


def _physical(inputs: ResolveInputs, request: np.ndarray, slot: np.ndarray) -> np.ndarray:
    """The hot row of ``slot`` through ``hot_block_table[request]`` (a cell outside is block -1)."""
    block_size = inputs.block_size
    block = _lookup(inputs.hot_block_table.numpy(), request, slot // block_size)
    return block * block_size + slot % block_size


def publish(inputs: ResolveInputs, rows: _Rows, host: np.ndarray, resident: np.ndarray, entries: _Union,
            slots: _Slots, misses: _Misses) -> None:
    """Phase 5 and 6 (``hisparse_kernels.cu:268-300, 787-821``): indices, valid counts, swap plan and counts,
    stats. Resident positions take their resident row, served host-backed ones their slot's hot row; a miss
    counts once (if its victim is valid), every other served reference is a hit."""
    num_rows, top_k = inputs.num_rows, inputs.top_k
    served_group = slots.group_slot >= 0
    physical = np.where(served_group, _physical(inputs, rows.request[entries.leader], slots.group_slot), -1)
    index = np.where(resident >= 0, resident, -1)
    index.reshape(-1)[entries.positions] = physical[entries.group]
    index[~rows.active] = -1
    _put(inputs.hot_indices, index)
    if inputs.attention_indices is not None:
        block, offset = _divmod(index, inputs.block_size)
        attention = np.where(index < 0, -1, block * inputs.attention_block_stride + offset)
        _put(inputs.attention_indices, attention)
    if inputs.valid_counts is not None:
        counted = ((resident >= 0) | (host >= 0)).sum(1)
        _put(inputs.valid_counts, np.where(rows.active, counted, 0))
    if inputs.stats is not None:
        loaded = int((~misses.tripped).sum())
        served = entries.positions.size
        if misses.tripped.any():  # references to invalid entries are not counted
            served = int(np.count_nonzero(served_group[entries.group]))
        inputs.stats.view(torch.int64).add_(torch.tensor([served - loaded, loaded], dtype=torch.int64))
    if inputs.has_swaps:
        assert inputs.swap_host_physical_rows is not None and inputs.swap_device_physical_rows is not None
        assert inputs.swap_counts is not None
        into = entries.leader[misses.group] * top_k + misses.rank
        _write_flat(inputs.swap_host_physical_rows, into, entries.host[misses.group])
        _write_flat(inputs.swap_device_physical_rows, into, physical[misses.group])
        batch = np.arange(num_rows, dtype=_I64)
        share = np.clip(misses.total[rows.leader] - (batch - rows.leader) * top_k, 0, top_k)
        _put(inputs.swap_counts.reshape(-1)[:num_rows], np.where(rows.active, share, 0))


def _put(target: torch.Tensor, values: np.ndarray) -> None:
    """``target[...] = values`` through a numpy view (any strides), keeping the low bits as a cast does (D8)."""
    np.copyto(target.numpy(), values, casting="unsafe")


def _write_flat(target: torch.Tensor, index: np.ndarray, values: np.ndarray) -> None:
    """``target.view(-1)[index] = values`` (distinct in-range indexes), for any layout of ``target``."""
    if index.size == 0:
        return
    if target.is_contiguous():
        target.numpy().reshape(-1)[index] = values
        return
    flat = target.numpy().reshape(-1)  # a copy for a strided layout
    flat[index] = values
    _put(target, flat.reshape(target.shape))


def store_state(inputs: ResolveInputs, rows: _Rows, entries: _Union, slots: _Slots, misses: _Misses) -> None:
    """DGI takes the loaded rows (a slot taken twice, through a corrupted LRU, keeps the later miss: D9); phase 7
    (``hisparse_kernels.cu:823-835``) over the victims ``V`` (``E`` evictables): ``V[M:E] + V[:M] + hits`` when
    ``M <= E`` (``evictables[M:] + evictables[:M] + hits``), else ``V[M - E:M] + hits``, as the kernel indexes."""
    hot_size = inputs.hot_size
    loaded = np.flatnonzero(~misses.tripped)
    if loaded.size:
        cell = rows.state[entries.leader[misses.group[loaded]]] * hot_size + misses.slot[loaded]
        reverse = np.unique(cell[::-1], return_index=True)[1]
        keep = loaded[loaded.size - 1 - reverse]
        cells = cell[loaded.size - 1 - reverse]
        _write_flat(inputs.device_global_indices, cells, entries.host[misses.group[keep]])
    if slots.leaders.size == 0 or hot_size == 0:
        return
    kept = hot_size - slots.hit.sum(1, keepdims=True)  # E, the evictables
    filled = misses.total[slots.leaders][:, None]  # M
    i = np.arange(hot_size, dtype=_I64)
    source = np.where(i < kept - filled, i + filled, np.where(i < kept, i - kept + filled, hot_size - 1 - (i - kept)))
    new_lru = np.take_along_axis(slots.victims, source, 1).astype(slots.lru.dtype)
    inputs.lru_slots.numpy()[rows.state[slots.leaders]] = new_lru  # distinct state rows (D1)


def resolve(inputs: ResolveInputs) -> None:
    """``hisparse_resolve_residency`` on checked host-memory inputs, phase by phase (see the module doc).

    Raises:
        UnionOverflowError: before anything is written.
    """
    if inputs.empty:
        return
    rows = classify_rows(inputs)
    host, resident = translate(inputs, rows)
    entries = union(inputs, rows, host, resident)
    check_union(inputs, rows, entries)
    slots = classify_slots(inputs, rows, entries)
    misses = assign_misses(inputs, entries, slots)
    publish(inputs, rows, host, resident, entries, slots, misses)
    store_state(inputs, rows, entries, slots, misses)
