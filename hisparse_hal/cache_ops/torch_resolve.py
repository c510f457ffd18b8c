"""``hisparse_resolve_residency`` vectorised in torch for any device: the resolve of :mod:`.torch_impl`.

Invariant: every tensor has a shape fixed by the arguments' shapes, and no value is read back to the host
(no ``.item()``, ``nonzero``, ``unique`` or boolean-mask indexing) except on the CPU device, where
:mod:`.device_checks` reads the union bound to raise a typed error; so on a GPU it can be captured in a
CUDA/HIP graph. Outputs, state and untouched entries are bit-equal to ``oracle.py``; the phases below carry the
oracle's phase names.

Resolve works in **windows** of ``C`` batch rows (:func:`window_rows`, from the shapes), so its extra memory is
a few window-sized temporaries whatever ``N x K`` is; the number of windows, ``ceil(N / C)``, comes from the
shapes, so the Python loops over them are capturable. A run (consecutive rows of one request) may cross window
edges; at most one run is open at an edge, and a fixed-size **carry** of ``max_union_rows + 1`` entries holds
that run's distinct ``(leader, host row)`` keys so far, sorted, with each key's first flat position (pass 2 also
its slot and miss rank). Each window sorts its own keys after the carry's (a stable sort, so a carried key heads
its group): a group's head is the key's first reference in its run. A carry that fills up belongs to an
overflowing run, which never writes.

- **Pass 1** (phases 0-2): the union size of every run and, for each run that crosses an edge, which of its
  state's slots hold a row of its whole union (``[windows, H]`` bool, computed in the window with the run's last
  row, where the carry plus that window hold the whole union).
- **Check** (phase 2's bound, D2) before any write.
- **Pass 2** (phases 3-7): the window's sort again (time traded for not keeping ``[N, K]`` results), slots classified
  for the window's runs only (``[C + 1, H]``: row 0 the run carried in, row ``1 + i`` the run led by the window's
  row ``i``), misses ranked after the carried run's earlier misses, indices and the swap plan published. A run's
  DGI and LRU are written in the window holding its last row, from its groups (carry plus window), so no window
  reads a state row an earlier window of the same run wrote (decision D1 keeps runs' state rows apart).

Writes that must skip some entries re-store an entry that is written anyway (:func:`_write_where`), so no copy
of a state table is made.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from hisparse_hal.errors import UnionOverflowError

from . import device_checks
from .arguments import ResolveInputs

__all__ = ["classify_rows", "resolve", "window_rows"]

# Sort keys of host-backed positions are ``leader_row << _KEY_SHIFT | host_row``. Host rows are int32 and
# batch rows are far below 2**30, so every real key stays below _NO_KEY.
_KEY_SHIFT = 32
_HOST_MASK = (1 << _KEY_SHIFT) - 1
_NO_KEY = 1 << 62
_I64 = torch.int64

#: Entries of a resolve window's largest temporaries (``[C + 1, H]`` slot arrays; the window's ``C x K``
#: positions plus the carry are no more): 2**18 entries are 2 MiB per int64 array.
WINDOW_ENTRIES = 1 << 18
#: Batch rows per resolve window, when set (tests force small windows here); None: from WINDOW_ENTRIES.
WINDOW_ROWS: int | None = None


def window_rows(inputs: ResolveInputs) -> int:
    """``C``, the batch rows of one resolve window: ``(C + 1) x H <= WINDOW_ENTRIES`` (``H >= K``), at least 1."""
    if WINDOW_ROWS is not None:
        return max(1, WINDOW_ROWS)
    return max(1, min(inputs.num_rows, WINDOW_ENTRIES // inputs.hot_size - 1))


def _lookup(table: torch.Tensor, row: torch.Tensor, col: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``table[row, col]`` as int64 where both are in range, with the in-range mask; never indexes out of range."""
    rows, cols = table.shape
    if rows == 0 or cols == 0:
        inside = torch.zeros(torch.broadcast_shapes(row.shape, col.shape), dtype=torch.bool, device=row.device)
        return torch.zeros(inside.shape, dtype=_I64, device=row.device), inside
    row_in, col_in = row.clamp(0, rows - 1), col.clamp(0, cols - 1)
    inside = (row_in == row) & (col_in == col)
    return table[row_in, col_in].to(_I64), inside


def _write_where(target: torch.Tensor, index: tuple[torch.Tensor, ...], values: torch.Tensor,
                 write: torch.Tensor) -> None:
    """``target[index] = values`` where ``write`` (``index`` tensors and ``write`` share a shape; ``values`` may
    add trailing dimensions). Entries that do not write re-store the last writing entry (index and value), or,
    when none writes, ``target``'s first element (row) with its own value: every store to one element carries
    the value it ends with, in any order, and no copy of ``target`` is needed. Indexes of entries that write
    must be in range; where several write one element the last wins on the CPU, as in a loop.
    """
    if write.numel() == 0:
        return
    flat = write.reshape(-1)
    last = (flat.numel() - 1 - torch.argmax(flat.flip(0).to(torch.int8))).view(1)  # 1-D: a 0-dim index syncs
    anything = flat.any()
    picked = [torch.where(anything, i.reshape(-1)[last], 0) for i in index]
    tail = values.shape[write.dim():]
    fallback = torch.where(anything, values.reshape(-1, *tail)[last], target[tuple(picked)].to(values.dtype))
    mask = write.reshape(write.shape + (1,) * len(tail))
    target.index_put_(
        tuple(torch.where(write, i, p) for i, p in zip(index, picked, strict=True)),
        torch.where(mask, values, fallback).to(target.dtype),
    )


@dataclasses.dataclass
class _Rows:
    """Phase 0 per batch row (int64 ``[N]``): request (-1 past ``num_valid_rows``), run leader, state row
    (-1 for padding runs and for a later run on a claimed state row), whether the row leads its run, and the
    last row of its run."""

    request: torch.Tensor
    leader: torch.Tensor
    state: torch.Tensor
    is_leader: torch.Tensor
    last: torch.Tensor

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
    ends = torch.ones(num_rows, dtype=torch.bool, device=device)
    ends[:-1] = starts[1:]
    last = torch.cummin(torch.where(ends, rows, num_rows).flip(0), dim=0).values.flip(0)
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
    return _Rows(request, leader, torch.where(owned, state, -1), is_leader, last)


def translate(inputs: ResolveInputs, rows: _Rows, start: int = 0,
              stop: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Phase 1 (``hisparse_kernels.cu:217-261``) for batch rows ``[start, stop)``: host row ``g`` and resident row
    of each position (int64 ``[stop - start, K]``, -1 when none). Source table by request row, resident table by
    **state** row (block 0 = host)."""
    stop = inputs.num_rows if stop is None else stop
    topk = inputs.global_indices[start:stop].to(_I64)
    resident = torch.full_like(topk, -1)
    if inputs.source_block_table is None:
        host = topk
    else:
        sbs = inputs.source_block_size
        # Floor division maps every negative token to a negative page, which _lookup reports as outside.
        page = torch.div(topk, sbs, rounding_mode="floor")
        block, inside = _lookup(inputs.source_block_table, rows.request[start:stop, None], page)
        host = torch.where(inside & (block > 0), block * sbs + topk % sbs, -1)
        if inputs.resident_block_table is not None:
            rbs = inputs.resident_block_size
            page = torch.div(topk, rbs, rounding_mode="floor")
            block, inside = _lookup(inputs.resident_block_table, rows.state[start:stop, None], page)
            resident = torch.where(inside & (block > 0), block * rbs + topk % rbs, -1)
    return torch.where(host >= inputs.host_rows, -1, host), resident


@dataclasses.dataclass
class _Window:
    """Batch rows ``[start, stop)`` of one window: phase 1's ``host``/``resident`` (int64 ``[W, K]``), the
    host-backed positions of working runs (``backed``), their sort keys and global flat positions (``[W x K]``),
    each row's local run (0: the run carried in from earlier windows, ``1 + i``: the run led by row
    ``start + i``), ``carried`` (a run is open at ``start``), ``open_leader`` and ``opens`` (the run of row
    ``stop - 1`` continues past ``stop``)."""

    start: int
    stop: int
    host: torch.Tensor
    resident: torch.Tensor
    backed: torch.Tensor
    keys: torch.Tensor
    flat: torch.Tensor
    local: torch.Tensor
    carried: torch.Tensor
    open_leader: torch.Tensor
    opens: torch.Tensor

    @property
    def height(self) -> int:
        return self.stop - self.start


def _local_runs(leader: torch.Tensor, start: int) -> torch.Tensor:
    """A run's index among a window's runs: 0 for a run led before ``start``, else ``1 + leader - start``."""
    return torch.where(leader < start, 0, leader - start + 1)


def _window(inputs: ResolveInputs, rows: _Rows, working: torch.Tensor, start: int, stop: int) -> _Window:
    """Phase 1 and the sort keys of rows ``[start, stop)``; ``working`` (``[N]`` bool) says which rows' runs may
    have host-backed positions (active, and in pass 2 not overflowing)."""
    top_k, device = inputs.top_k, inputs.device
    host, resident = translate(inputs, rows, start, stop)
    leader = rows.leader[start:stop]
    backed = working[start:stop, None] & (resident < 0) & (host >= 0)
    keys = torch.where(backed, (leader[:, None] << _KEY_SHIFT) | host, _NO_KEY).reshape(-1)
    flat = torch.arange(start * top_k, stop * top_k, dtype=_I64, device=device)
    local = _local_runs(leader, start)
    return _Window(start, stop, host, resident, backed, keys, flat, local, rows.leader[start] < start,
                   rows.leader[stop - 1], rows.last[stop - 1] >= stop)


@dataclasses.dataclass
class _Carry:
    """The run open at a window's start (``_Window.carried``): its distinct keys in earlier windows (sorted,
    ``_NO_KEY`` past them; ``[max_union_rows + 1]``), each key's first flat position, and in pass 2 each key's
    slot and miss rank (-1: a hit), and ``misses``, the run's misses so far."""

    keys: torch.Tensor
    position: torch.Tensor
    slot: torch.Tensor
    rank: torch.Tensor
    misses: torch.Tensor

    @classmethod
    def empty(cls, inputs: ResolveInputs) -> _Carry:
        size, device = inputs.max_union_rows + 1, inputs.device
        nothing = torch.full((size,), -1, dtype=_I64, device=device)
        return cls(torch.full((size,), _NO_KEY, dtype=_I64, device=device), nothing, nothing, nothing,
                   torch.zeros((), dtype=_I64, device=device))

    @property
    def size(self) -> int:
        return self.keys.numel()


@dataclasses.dataclass
class _Merged:
    """The carry's keys followed by the window's (unsorted index ``e``: ``e < carry.size`` a carried key, else
    window position ``e - carry.size``), sorted stably: equal keys form a group, headed by the key's first
    reference in its run (a carried key, else the window's first position). ``group[e]``: sorted index of ``e``'s
    group start; ``head[e]``: unsorted index of that head; ``is_head``: per sorted index, a real group's start."""

    sorted_keys: torch.Tensor
    order: torch.Tensor
    group: torch.Tensor
    head: torch.Tensor
    is_head: torch.Tensor
    carried: int

    def window_heads(self) -> torch.Tensor:
        """Per window position, the unsorted index of its group's head."""
        return self.head[self.carried:]

    def first(self, window: _Window) -> torch.Tensor:
        """Per window position (flat): host-backed and its run's first reference of its host row."""
        own = torch.arange(self.carried, self.head.numel(), dtype=_I64, device=self.head.device)
        return window.backed.reshape(-1) & (self.window_heads() == own)

    def leaders(self) -> torch.Tensor:
        """Per sorted index, the run leader of the key (meaningful where ``is_head``)."""
        return torch.where(self.is_head, self.sorted_keys >> _KEY_SHIFT, 0)


def union(carry: _Carry, window: _Window) -> _Merged:
    """Phase 2, the union (its bound: ``hisparse_kernels.cu:563-571``): group the carried and the window's keys by
    ``(leader, g)``."""
    keys = torch.cat([carry.keys, window.keys])
    count = keys.numel()
    sorted_keys, order = torch.sort(keys, stable=True)
    index = torch.arange(count, dtype=_I64, device=keys.device)
    starts = torch.ones(count, dtype=torch.bool, device=keys.device)
    starts[1:] = sorted_keys[1:] != sorted_keys[:-1]
    start_of = torch.cummax(torch.where(starts, index, 0), dim=0).values
    group = torch.empty_like(start_of)
    group[order] = start_of
    return _Merged(sorted_keys, order, group, order[group], starts & (sorted_keys != _NO_KEY), carry.keys.numel())


def _next_carry(merged: _Merged, window: _Window, position: torch.Tensor, slot: torch.Tensor,
                rank: torch.Tensor, misses: torch.Tensor) -> _Carry:
    """The carry into the next window: the groups of the run open at ``window.stop`` in key order, with their
    heads' position, slot and rank (unsorted-indexed); a run with more groups than fit is overflowing (dropped)."""
    size = merged.carried
    take = merged.is_head & (merged.leaders() == window.open_leader) & window.opens
    rank_in = torch.cumsum(take, 0) - 1
    into = torch.where(take & (rank_in < size), rank_in, size)
    heads = merged.order

    def pack(values: torch.Tensor, fill: int) -> torch.Tensor:
        return torch.full((size + 1,), fill, dtype=_I64, device=values.device).scatter_(0, into, values)[:size]

    return _Carry(pack(merged.sorted_keys, _NO_KEY), pack(position[heads], -1), pack(slot[heads], -1),
                  pack(rank[heads], -1), torch.where(window.opens, misses, 0))


def _store_run_values(total: torch.Tensor, window: _Window, per_run: torch.Tensor, carried_leader: torch.Tensor
                      ) -> None:
    """``total[leader] = per_run[local run]`` for the window's runs (``total`` is ``[N]`` by leader row)."""
    keep = total.index_select(0, carried_leader.view(1))
    total.index_copy_(0, carried_leader.view(1), torch.where(window.carried, per_run[:1], keep))
    total[window.start:window.stop] = per_run[1:window.height + 1]


def _held_keys(inputs: ResolveInputs, rows: _Rows, leader: torch.Tensor, asked_rows: torch.Tensor
               ) -> torch.Tensor:
    """Per run led by ``leader`` (``[R]``) and per slot in slot order (``[R, H]``), the key of the host row
    ``DGI[s, slot]`` holds, -1 where not asked or empty: phase 3 scans every slot whatever the LRU holds
    (``hisparse_kernels.cu:574-609``)."""
    state = rows.state[leader].clamp(min=0)
    held = inputs.device_global_indices[state].to(_I64)
    asked = asked_rows[:, None] & (held >= 0)
    return torch.where(asked, (leader[:, None] << _KEY_SHIFT) | held, -1)


def _find(merged: _Merged, query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(found, found_at)``: whether each query key is among the merged keys, and its group's sorted index."""
    found_at = torch.searchsorted(merged.sorted_keys, query).clamp(max=merged.sorted_keys.numel() - 1)
    return (query >= 0) & (merged.sorted_keys[found_at] == query), found_at


def count_unions(inputs: ResolveInputs, rows: _Rows) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass 1, phases 1-2 window by window: each run's union size (``[N]`` at leader rows) and, per window, the
    slots holding a union row of the run carried into it (``[windows + 1, H]`` bool at the index of the run's
    leader's window, the last row a spill), set in the window with the run's last row."""
    num_rows, height = inputs.num_rows, window_rows(inputs)
    windows = -(-num_rows // height)
    sizes = torch.zeros(num_rows, dtype=_I64, device=inputs.device)
    crossing_hits = torch.zeros(windows + 1, inputs.hot_size, dtype=torch.bool, device=inputs.device)
    carry = _Carry.empty(inputs)
    for start in range(0, num_rows, height):
        window = _window(inputs, rows, rows.active, start, min(start + height, num_rows))
        merged = union(carry, window)
        local = torch.where(merged.is_head, _local_runs(merged.leaders(), start), window.height + 1)
        groups = torch.zeros(window.height + 2, dtype=_I64, device=inputs.device).index_add_(
            0, local, torch.ones_like(local))
        carried_leader = rows.leader[start]
        _store_run_values(sizes, window, groups, carried_leader)
        query = _held_keys(inputs, rows, carried_leader.view(1), window.carried.view(1))
        found, _ = _find(merged, query)
        into = torch.where(window.carried, torch.div(carried_leader, height, rounding_mode="floor"), windows)
        crossing_hits.index_copy_(0, into.view(1), found)
        positions = torch.cat([carry.position, window.flat])
        carry = _next_carry(merged, window, positions, positions, positions, carry.misses)
    return sizes, crossing_hits


def _union_size(inputs: ResolveInputs, rows: _Rows, leader: int) -> int:
    """The exact union size of the run led by batch row ``leader`` (CPU error path only: reads values)."""
    host, resident = translate(inputs, rows, leader, int(rows.last[leader]) + 1)
    return int(torch.unique(host[(resident < 0) & (host >= 0)]).numel())


def _overflow_error(inputs: ResolveInputs, rows: _Rows) -> Callable[[int], UnionOverflowError]:
    """The typed error for the run led by batch row ``index`` (read on the CPU device only). Its union size is
    counted again exactly: pass 1 stops counting a run's keys once its carry is full."""

    def error(index: int) -> UnionOverflowError:
        return UnionOverflowError(int(rows.state[index]), int(rows.request[index]),
                                  _union_size(inputs, rows, index), inputs.max_union_rows)
    return error


def check_union(inputs: ResolveInputs, rows: _Rows, sizes: torch.Tensor) -> torch.Tensor:
    """Phase 2 bound (``hisparse_kernels.cu:563-571``, decision D2): typed error on the CPU device, a device-side
    assertion on a GPU. Returns the per-row overflow mask the GPU path masks its writes with."""
    overflow = rows.is_leader & rows.active & (sizes > inputs.max_union_rows)
    device_checks.refuse(
        overflow, _overflow_error(inputs, rows),
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


@dataclasses.dataclass
class _Slots:
    """Phase 3 for a window's runs (row 0: the run carried in, row ``1 + i``: the run led by row ``start + i``;
    ``[C + 1]`` and ``[C + 1, H]``): leader and state rows, ``working`` (the run writes state), ``ends`` (its
    last row is in the window), the LRU, which LRU entries are hits, the evictables' count, ``victims`` (miss
    ``m``'s slot at column ``m``: evictables in LRU order, then the hits reversed; decision D5), and ``hit_at``:
    per sorted merged index, the slot serving the group (-1: none)."""

    leader: torch.Tensor
    state: torch.Tensor
    working: torch.Tensor
    ends: torch.Tensor
    lru: torch.Tensor
    hit: torch.Tensor
    evictable_count: torch.Tensor
    victims: torch.Tensor
    hit_at: torch.Tensor


def classify_slots(inputs: ResolveInputs, rows: _Rows, working: torch.Tensor, window: _Window, merged: _Merged,
                   crossing_hits: torch.Tensor) -> _Slots:
    """Phase 3 (``hisparse_kernels.cu:574-669``) for the window's runs. Every slot of ``DGI[s]`` is scanned in slot
    order whatever the LRU holds: a slot holding a row of the run's union serves it (a run inside the window finds
    its union in the merged keys; a run crossing an edge takes pass 1's ``crossing_hits``, its whole union), and a
    row held twice takes its later slot (decision D3). The LRU walk only sorts its entries (cu:630-632): an
    in-range entry whose slot serves is a hit, every other entry evictable."""
    hot_size, device, start = inputs.hot_size, inputs.device, window.start
    leader = torch.cat([rows.leader[start].view(1), torch.arange(start, window.stop, dtype=_I64, device=device)])
    runs = torch.cat([window.carried.view(1), rows.is_leader[start:window.stop]])
    runs = runs & working[leader]
    ends = rows.last[leader] < window.stop
    crossing = ~ends
    crossing[0] = True
    state = rows.state[leader].clamp(min=0)
    query = _held_keys(inputs, rows, leader, runs)
    found, found_at = _find(merged, query)
    stored = crossing_hits[torch.div(leader, window_rows(inputs), rounding_mode="floor")]
    serving = torch.where(crossing[:, None], stored & (query >= 0), found)
    lru = inputs.lru_slots[state].to(_I64)
    hit = (lru >= 0) & (lru < hot_size) & serving.gather(1, lru.clamp(0, hot_size - 1))
    entries = merged.sorted_keys.numel()
    hit_at = torch.full((entries + 1,), -1, dtype=_I64, device=device)
    slots = torch.arange(hot_size, dtype=_I64, device=device).expand_as(query)
    hit_at.scatter_reduce_(0, torch.where(found, found_at, entries).reshape(-1), slots.reshape(-1), reduce="amax")
    hit_rank = torch.cumsum(hit, 1) - 1
    evict_rank = torch.cumsum(~hit, 1) - 1
    victims = torch.empty_like(lru).scatter_(1, torch.where(hit, hot_size - 1 - hit_rank, evict_rank), lru)
    return _Slots(leader, state, runs, ends, lru, hit, hot_size - hit.sum(1), victims, hit_at[:entries])


@dataclasses.dataclass
class _Assigned:
    """Phase 4 for a window: per window position (flat) its first-reference flag, its group's slot and miss rank
    (-1: a hit), and whether the miss tripped the tripwire; per merged entry (unsorted) the group heads' slot and
    rank; per window run its misses so far (``[C + 1]``)."""

    first: torch.Tensor
    slot: torch.Tensor
    rank: torch.Tensor
    tripped: torch.Tensor
    entry_slot: torch.Tensor
    entry_rank: torch.Tensor
    run_misses: torch.Tensor


def assign_misses(inputs: ResolveInputs, window: _Window, merged: _Merged, slots: _Slots, carry: _Carry
                  ) -> _Assigned:
    """Phase 4 (``hisparse_kernels.cu:677-786``): a group without a hit slot is a miss; misses of a run take its
    evictables in first-reference order, after the misses the carried run had in earlier windows; a carried
    group keeps the slot it got then. Victims past the evictables are hit slots (decision D5); an out-of-range
    victim trips the tripwire."""
    top_k, hot_size = inputs.top_k, inputs.hot_size
    first = merged.first(window)
    local = window.local[:, None].expand(-1, top_k).reshape(-1)
    is_hit = slots.hit_at[merged.group[merged.carried:]] >= 0
    missed = first & ~is_hit
    missed_before = torch.cumsum(missed, 0) - missed.to(_I64)
    run_start = (torch.clamp(slots.leader, min=window.start) - window.start) * top_k
    base = torch.zeros_like(slots.leader)
    base[0] = carry.misses
    rank = missed_before - missed_before[run_start[local]] + base[local]
    miss_slot = slots.victims[local, rank.clamp(0, hot_size - 1)]  # rank < max_union_rows <= H where it counts
    hit_slot = slots.hit_at[merged.group[merged.carried:]]
    entry_slot = torch.cat([carry.slot, torch.where(is_hit, hit_slot, miss_slot)])
    entry_rank = torch.cat([carry.rank, torch.where(missed, rank, -1)])
    heads = merged.window_heads()
    slot, group_rank = entry_slot[heads], entry_rank[heads]
    tripped = (group_rank >= 0) & ((slot < 0) | (slot >= hot_size))
    run_misses = base.index_add_(0, local, missed.to(_I64))
    return _Assigned(first, slot, group_rank, tripped, entry_slot, entry_rank, run_misses)


def publish_indices(inputs: ResolveInputs, rows: _Rows, active: torch.Tensor, window: _Window,
                    assigned: _Assigned, tally: torch.Tensor) -> None:
    """Phase 5 (``hisparse_kernels.cu:268-300, 787-811``) for the window's rows: hot and attention indices,
    ``valid_counts``; phase 6 (``hisparse_kernels.cu:813-821``): hits and misses added to ``tally``."""
    start, stop, top_k = window.start, window.stop, inputs.top_k
    backed = window.backed.reshape(-1)
    served = backed & ~assigned.tripped
    loaded = assigned.first & (assigned.rank >= 0) & ~assigned.tripped
    physical = _physical_rows(inputs, rows.request[start:stop, None], assigned.slot.view(-1, top_k))
    resident = window.resident
    index = torch.where(resident >= 0, resident, torch.where(served.view(-1, top_k), physical, -1))
    index = torch.where(active[start:stop, None], index, -1)
    inputs.hot_indices[start:stop].copy_(index)
    if inputs.attention_indices is not None:
        inputs.attention_indices[start:stop].copy_(_attention_rows(index, inputs.block_size,
                                                                   inputs.attention_block_stride))
    if inputs.valid_counts is not None:
        counted = ((resident >= 0) | (window.host >= 0)).sum(1)
        inputs.valid_counts[start:stop].copy_(torch.where(active[start:stop], counted, 0))
    misses = loaded.sum()
    tally.add_(torch.stack([served.sum() - misses, misses]))


def publish_swaps(inputs: ResolveInputs, rows: _Rows, window: _Window, assigned: _Assigned) -> None:
    """The swap plan (``hisparse_kernels.cu:677-786``): the run's ``m``-th miss lands at flat entry
    ``leader x K + m``, ``swap_device`` -1 where it tripped."""
    assert inputs.swap_host_physical_rows is not None and inputs.swap_device_physical_rows is not None
    top_k, start, stop = inputs.top_k, window.start, window.stop
    missed = assigned.first & (assigned.rank >= 0)
    leader = rows.leader[start:stop, None].expand(-1, top_k).reshape(-1)
    into = leader * top_k + assigned.rank.clamp(min=0)
    at = (torch.div(into, top_k, rounding_mode="floor"), torch.remainder(into, top_k))
    physical = _physical_rows(inputs, rows.request[leader], assigned.slot)
    _write_where(inputs.swap_host_physical_rows, at, window.host.reshape(-1), missed)
    _write_where(inputs.swap_device_physical_rows, at, torch.where(assigned.tripped, -1, physical), missed)


def write_state(inputs: ResolveInputs, merged: _Merged, slots: _Slots, assigned: _Assigned,
                start: int) -> None:
    """Phase 4's DGI writes (within ``hisparse_kernels.cu:677-786``) of runs whose last row is in the window:
    ``DGI[s, slot] = g`` for each valid miss of the run, from its groups (carried and new). Where a corrupted LRU
    names one victim twice the later miss wins, as in the oracle's loop."""
    hot_size = inputs.hot_size
    local = torch.where(merged.is_head, _local_runs(merged.leaders(), start), 0)
    slot, rank = assigned.entry_slot[merged.order], assigned.entry_rank[merged.order]
    write = merged.is_head & (slots.working & slots.ends)[local] & (rank >= 0) & (slot >= 0) & (slot < hot_size)
    cell = local * (hot_size + 1) + torch.where(write, slot, hot_size)
    latest = torch.full((slots.leader.numel() * (hot_size + 1),), -1, dtype=_I64, device=inputs.device)
    latest.scatter_reduce_(0, cell, torch.where(write, rank, -1), reduce="amax")
    write = write & (latest[cell] == rank)
    _write_where(inputs.device_global_indices, (slots.state[local], slot.clamp(0, hot_size - 1)),
                 merged.sorted_keys & _HOST_MASK, write)


def reorder_lru(inputs: ResolveInputs, slots: _Slots, assigned: _Assigned) -> None:
    """Phase 7 (``hisparse_kernels.cu:823-835``) of runs whose last row is in the window, over the victims ``V``
    (``E`` evictables, ``M`` misses): ``V[M:E] + V[:M] + hits`` when ``M <= E``, else ``V[M - E:M] + hits``."""
    hot_size = inputs.hot_size
    kept = slots.evictable_count[:, None]
    filled = assigned.run_misses[:, None]
    i = torch.arange(hot_size, dtype=_I64, device=inputs.device)
    source = torch.where(i < kept - filled, i + filled,
                         torch.where(i < kept, i - kept + filled, hot_size - 1 - (i - kept)))
    new_lru = slots.victims.gather(1, source.clamp(0, hot_size - 1))
    _write_where(inputs.lru_slots, (slots.state,), new_lru, slots.working & slots.ends)


def publish_swap_counts(inputs: ResolveInputs, rows: _Rows, active: torch.Tensor, misses: torch.Tensor) -> None:
    """``swap_counts[first + j] = clamp(M - j x K, 0, K)`` (``hisparse_kernels.cu:778-786``)."""
    assert inputs.swap_counts is not None
    num_rows, top_k = inputs.num_rows, inputs.top_k
    row = torch.arange(num_rows, dtype=_I64, device=inputs.device)
    share = (misses[rows.leader] - (row - rows.leader) * top_k).clamp(0, top_k)
    inputs.swap_counts.reshape(-1)[:num_rows].copy_(torch.where(active, share, 0))


def resolve(inputs: ResolveInputs) -> None:
    """``hisparse_resolve_residency`` on checked inputs, vectorised with fixed shapes in windows of batch rows
    (see the module doc).

    Args:
        inputs: the checked arguments.

    Raises:
        UnionOverflowError: on the CPU device, before anything is written.
    """
    if inputs.empty:
        return
    num_rows, height, device = inputs.num_rows, window_rows(inputs), inputs.device
    rows = classify_rows(inputs)
    sizes, crossing_hits = count_unions(inputs, rows)
    overflow = check_union(inputs, rows, sizes)
    active = rows.active & ~overflow[rows.leader]  # a GPU masks an overflowing run (its assertion fired)
    working = active & (sizes[rows.leader] > 0)
    misses = torch.zeros(num_rows, dtype=_I64, device=device)
    tally = torch.zeros(2, dtype=_I64, device=device)
    carry = _Carry.empty(inputs)
    for start in range(0, num_rows, height):
        window = _window(inputs, rows, active, start, min(start + height, num_rows))
        merged = union(carry, window)
        slots = classify_slots(inputs, rows, working, window, merged, crossing_hits)
        assigned = assign_misses(inputs, window, merged, slots, carry)
        publish_indices(inputs, rows, active, window, assigned, tally)
        if inputs.has_swaps:
            publish_swaps(inputs, rows, window, assigned)
        write_state(inputs, merged, slots, assigned, start)
        reorder_lru(inputs, slots, assigned)
        _store_run_values(misses, window, assigned.run_misses, rows.leader[start])
        open_misses = assigned.run_misses[_local_runs(window.open_leader.view(1), start)].view(())
        carry = _next_carry(merged, window, torch.cat([carry.position, window.flat]), assigned.entry_slot,
                            assigned.entry_rank, open_misses)
    if inputs.has_swaps:
        publish_swap_counts(inputs, rows, active, misses)
    if inputs.stats is not None:
        inputs.stats.view(_I64).add_(tally)
