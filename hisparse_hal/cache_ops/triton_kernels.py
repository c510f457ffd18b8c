"""The Triton kernels of the four cache ops: one source for NVIDIA and AMD.

Imported only by :mod:`hisparse_hal.cache_ops.triton_impl`, on first use, because importing it imports
triton (and ``TRITON_INTERPRET`` is read when the kernels are defined). Every ordered compaction is a
block-level ``tl.cumsum``, so no result depends on the warp or wavefront width (32 on NVIDIA, 64 on
AMD; the SGLang #23970 bug was a warp-32 scan window). Addresses are computed in int64. Resolve is two
launches (union sizes, then the rest) so a run can see whether an earlier run with its state row fitted.

Each launch reads as the phases of docs/design/cache-ops.md §2, one ``@triton.jit`` helper per phase (inlined by
the compiler, as the fused-attention tutorial's ``_attn_fwd_inner``): launch 1 ``_run_state`` (0), ``_clear_table``,
``_translate_union`` (1-2), ``_count_union``; launch 2 ``_scan_hit_slots`` and ``_classify_slots`` (3),
``_assign_misses`` with ``_write_swap_plan`` (4), ``_publish_indices`` (5-6, with valid and swap counts),
``_reorder_lru`` (7), ``_add_stats`` (6), or ``_publish_padding``.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

__all__ = [
    "INTERPRETED",
    "resolve_union_kernel",
    "resolve_residency_kernel",
    "gather_rows_kernel",
    "invalidate_written_slots_kernel",
]

#: Whether the kernels below were defined for triton's CPU interpreter (``TRITON_INTERPRET=1`` at import).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Hash-table cell states (per run, in global scratch).
_EMPTY = tl.constexpr(-1)  # key of an unused cell; host rows are >= 0
_NEVER = tl.constexpr(-3)  # compare value that never matches a key: lanes with nothing to insert
_NO_POSITION = tl.constexpr(2147483647)
_KIND_NONE = tl.constexpr(0)
_KIND_HIT = tl.constexpr(1)
_KIND_MISS = tl.constexpr(2)
_KIND_INVALID = tl.constexpr(3)  # the victim slot was out of range (LRU tripwire)


@triton.jit
def _hash_cell(key, table_size):
    # Knuth multiplicative hash; any hash works (the table is internal and behaves like a dict).
    return ((key.to(tl.int64) * 2654435761) % 4294967296) % table_size


@triton.jit
def _translate(
    t, q, s,
    src_ptr, src_rows, src_cols, src_stride0, src_block,
    res_ptr, res_rows, res_cols, res_stride0, res_block,
    host_rows,
    HAS_SRC: tl.constexpr, HAS_RES: tl.constexpr,
):
    """Top-k token positions ``t`` of request row ``q`` with state row ``s`` -> (host row g or -1, resident row
    or -1), int64. Source table by request row, resident table by state row, block 0 = host
    (``hisparse_kernels.cu:217-261``)."""
    t64 = t.to(tl.int64)
    q64 = q.to(tl.int64)
    s64 = s.to(tl.int64)
    valid_t = t64 >= 0
    if HAS_SRC:
        page = tl.where(valid_t, t64 // src_block, 0)
        # `!= 0`: the interpreter widens a block-and-scalar `&` to int64, which tl.load rejects as a mask
        ok = (valid_t & ((q64 >= 0) & (q64 < src_rows)) & (page < src_cols)) != 0
        block = tl.load(src_ptr + q64 * src_stride0 + page, mask=ok, other=0).to(tl.int64)
        ok = ok & (block > 0)  # host block 0 is the null block
        g = tl.where(ok, block * src_block + tl.where(valid_t, t64 % src_block, 0), -1)
    else:
        g = t64
    if HAS_RES:
        rpage = tl.where(valid_t, t64 // res_block, 0)
        okr = (valid_t & ((s64 >= 0) & (s64 < res_rows)) & (rpage < res_cols)) != 0
        rblock = tl.load(res_ptr + s64 * res_stride0 + rpage, mask=okr, other=0).to(tl.int64)
        okr = okr & (rblock > 0)
        res = tl.where(okr, rblock * res_block + tl.where(valid_t, t64 % res_block, 0), -1)
    else:
        res = tl.full(t.shape, -1, tl.int64)
    g = tl.where(g >= host_rows, -1, g)
    return g, res


@triton.jit
def _state_of(q, rsi_ptr, rsi_len, num_states, HAS_RSI: tl.constexpr):
    """State row of batch request row(s) ``q``, or -1 when out of range."""
    q64 = q.to(tl.int64)
    if HAS_RSI:
        inr = (q64 >= 0) & (q64 < rsi_len)
        s = tl.load(rsi_ptr + tl.where(inr, q64, 0), mask=inr, other=-1).to(tl.int64)
    else:
        s = q64
    return tl.where((s >= 0) & (s < num_states), s, -1)


@triton.jit
def _phys(q64, slot, hbt_ptr, hbt_rows, hbt_cols, hbt_stride0, block_size):
    """Physical hot row of ``slot`` of batch row ``q64``: hot_block_table[q, slot // B] * B + slot % B.

    A table cell outside the table reads as block -1 (a negative row, which gather_compact skips).
    """
    slot64 = slot.to(tl.int64)
    safe = tl.where(slot64 >= 0, slot64, 0)
    column = safe // block_size
    inside = ((column < hbt_cols) & ((q64 >= 0) & (q64 < hbt_rows))) != 0
    block = tl.load(hbt_ptr + tl.where(inside, q64 * hbt_stride0 + column, 0), mask=inside, other=-1).to(tl.int64)
    return block * block_size + safe % block_size


@triton.jit
def _write_index(hot_ptr, att_ptr, att_stride0, r64, cols, x, mask, block_size, att_block_stride, K,
                 HAS_ATT: tl.constexpr):
    tl.store(hot_ptr + r64 * K + cols, x.to(tl.int32), mask=mask)
    if HAS_ATT:
        att = tl.where(x < 0, -1, (x // block_size) * att_block_stride + x % block_size)
        tl.store(att_ptr + r64 * att_stride0 + cols, att.to(tl.int32), mask=mask)


@triton.jit
def _valid_rows(N, nvr_ptr, HAS_NVR: tl.constexpr):
    """``min(num_valid_rows[0], N)``, read on the device, or ``N`` without it (``hisparse_kernels.cu:378-389``)."""
    if HAS_NVR:
        valid = tl.minimum(tl.load(nvr_ptr).to(tl.int64), N)
    else:
        valid = N + 0
    return valid


@triton.jit
def _request_of(r, valid, rid_ptr, HAS_RID: tl.constexpr):
    """Request row of batch row(s) ``r``: ``request_ids[r]`` below ``valid``, else -1; ``r`` without ids."""
    r64 = r.to(tl.int64)
    if HAS_RID:
        inside = r64 < valid
        q = tl.load(rid_ptr + tl.where(inside, r64, 0), mask=inside, other=-1).to(tl.int64)
        q = tl.where(inside, q, -1)
    else:
        q = r64
    return q


@triton.jit
def _run_start(r0, valid, rid_ptr, HAS_RID: tl.constexpr):
    """(request row q, whether row r0 starts a run): a run is a maximal block of rows with one request;
    without request ids every row is its own run. Two loads, no scan: rows that do not lead exit after this."""
    q = _request_of(r0, valid, rid_ptr, HAS_RID)
    prev = _request_of(tl.maximum(r0 - 1, 0), valid, rid_ptr, HAS_RID)
    is_leader = (r0 == 0) | (prev != q)
    return q, is_leader


@triton.jit
def _run_end(r0, q, N, valid, rid_ptr, HAS_RID: tl.constexpr):
    """One past the last row of the run that row ``r0`` leads (called by leaders only)."""
    r1 = r0 + 1
    if HAS_RID:
        nxt = _request_of(tl.minimum(r1, N - 1), valid, rid_ptr, HAS_RID)
        while (r1 < N) & (nxt == q):
            r1 += 1
            nxt = _request_of(tl.minimum(r1, N - 1), valid, rid_ptr, HAS_RID)
    return r1


@triton.jit
def _claimed_before(r0, s, valid, rid_ptr, rsi_ptr, rsi_len, num_states,
                    HAS_RID: tl.constexpr, HAS_RSI: tl.constexpr, BLOCK_R: tl.constexpr):
    """Whether a run led by a row before ``r0`` has state row ``s`` (decision D1: this run is then padding)."""
    dup = 0
    for start in range(0, r0, BLOCK_R):
        rr = start + tl.arange(0, BLOCK_R).to(tl.int64)
        mr = rr < r0
        qq = _request_of(rr, valid, rid_ptr, HAS_RID)
        pq = _request_of(tl.maximum(rr - 1, 0), valid, rid_ptr, HAS_RID)
        lead = mr & ((rr == 0) | (qq != pq))
        same = lead & (_state_of(qq, rsi_ptr, rsi_len, num_states, HAS_RSI) == s)
        dup += tl.sum(same.to(tl.int32), axis=0)
    return dup > 0


@triton.jit
def _run_state(r0, q, valid, rid_ptr, rsi_ptr, rsi_len, num_states,
               HAS_RID: tl.constexpr, HAS_RSI: tl.constexpr, BLOCK_R: tl.constexpr):
    """Phase 0 for the run that row ``r0`` leads: its state row, or -1 for a padding run (state out of range, or
    claimed by an earlier run, decision D1)."""
    s = _state_of(q, rsi_ptr, rsi_len, num_states, HAS_RSI)
    if s >= 0:
        claimed = _claimed_before(r0, s, valid, rid_ptr, rsi_ptr, rsi_len, num_states, HAS_RID, HAS_RSI, BLOCK_R)
        s = tl.where(claimed, -1, s)
    return s


@triton.jit
def _run_table(r0, r1, K):
    """The scratch of the run ``[r0, r1)``: (hash table offset, its size, offset of the positions' cells).

    2 cells per position (load factor <= 1/2), at offsets derived from the run's first row, so runs never share.
    """
    table = r0 * K * 2
    table_size = (r1 - r0) * K * 2
    cell_base = r0 * K
    return table, table_size, cell_base


@triton.jit
def _clear_table(keys_ptr, first_ptr, kind_ptr, slot_ptr, table, table_size, BLOCK_K: tl.constexpr):
    """Every cell of the run's hash table: no key, no first position, no kind, no slot (-1, so launch 2's atomic
    max leaves the serving slot)."""
    cols_k = tl.arange(0, BLOCK_K).to(tl.int64)
    for i in range(0, table_size, BLOCK_K):
        ci = i + cols_k
        mi = ci < table_size
        tl.store(keys_ptr + table + ci, tl.full([BLOCK_K], _EMPTY, tl.int32), mask=mi)
        tl.store(first_ptr + table + ci, tl.full([BLOCK_K], _NO_POSITION, tl.int32), mask=mi)
        tl.store(kind_ptr + table + ci, tl.full([BLOCK_K], _KIND_NONE, tl.int32), mask=mi)
        tl.store(slot_ptr + table + ci, tl.full([BLOCK_K], -1, tl.int32), mask=mi)


@triton.jit
def _insert_first_reference(keys_ptr, first_ptr, table, table_size, key, p, active, BLOCK: tl.constexpr):
    """Insert host rows ``key`` (lanes ``active``) into the run's hash table, keeping each key's smallest position
    ``p``; returns each lane's cell (-1 for inactive lanes). Linear probing with compare-and-swap."""
    h = _hash_cell(key, table_size)
    cell = tl.full([BLOCK], -1, tl.int64)
    while tl.max(active.to(tl.int32), axis=0) > 0:
        old = tl.atomic_cas(keys_ptr + table + h, tl.where(active, _EMPTY, _NEVER), key)
        done = active & ((old == _EMPTY) | (old == key))
        tl.atomic_min(first_ptr + table + h, p, mask=done)
        cell = tl.where(done, h, cell)
        active = active & ~done
        h = tl.where(active, (h + 1) % table_size, h)
    return cell


@triton.jit
def _find(keys_ptr, table, table_size, key, BLOCK: tl.constexpr):
    """The cell holding each host row ``key`` in the run's hash table, or -1 (also for ``key < 0``)."""
    h = _hash_cell(tl.where(key >= 0, key, 0), table_size)
    found = tl.full([BLOCK], -1, tl.int64)
    active = key >= 0
    while tl.max(active.to(tl.int32), axis=0) > 0:
        kk = tl.load(keys_ptr + table + h, mask=active, other=_EMPTY)
        found = tl.where(active & (kk == key), h, found)
        active = active & (kk != key) & (kk != _EMPTY)
        h = tl.where(active, (h + 1) % table_size, h)
    return found


@triton.jit
def _translate_union(
    r0, r1, q, s, K, gi_ptr, gi_stride0,
    src_ptr, src_rows, src_cols, src_stride0, src_block,
    res_ptr, res_rows, res_cols, res_stride0, res_block,
    host_rows, keys_ptr, first_ptr, cells_ptr, table, table_size, cell_base,
    HAS_SRC: tl.constexpr, HAS_RES: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Phases 1-2: translate every position of the run and insert its host row (host-backed, not resident
    positions) with its first position in (row, column) order; each position's cell goes to ``cells``."""
    cols_k = tl.arange(0, BLOCK_K).to(tl.int64)
    for r in range(r0, r1):
        for c0 in range(0, K, BLOCK_K):
            cols = c0 + cols_k
            mc = cols < K
            t = tl.load(gi_ptr + r * gi_stride0 + cols, mask=mc, other=-1)
            g, res = _translate(t, q, s, src_ptr, src_rows, src_cols, src_stride0, src_block,
                                res_ptr, res_rows, res_cols, res_stride0, res_block,
                                host_rows, HAS_SRC, HAS_RES)
            p = ((r - r0) * K + cols).to(tl.int32)
            active = mc & (res < 0) & (g >= 0)
            key = tl.where(active, g, 0).to(tl.int32)
            cell = _insert_first_reference(keys_ptr, first_ptr, table, table_size, key, p, active, BLOCK_K)
            tl.store(cells_ptr + cell_base + p.to(tl.int64), cell.to(tl.int32), mask=mc)


@triton.jit
def _count_union(keys_ptr, table, table_size, BLOCK_K: tl.constexpr):
    """The number of used cells of the run's hash table: the size of its union."""
    cols_k = tl.arange(0, BLOCK_K).to(tl.int64)
    union = 0
    for i in range(0, table_size, BLOCK_K):
        ci = i + cols_k
        kk = tl.load(keys_ptr + table + ci, mask=ci < table_size, other=_EMPTY)
        union += tl.sum((kk != _EMPTY).to(tl.int32), axis=0)
    return union


@triton.jit
def resolve_union_kernel(
    host_rows, N, K, num_states,
    gi_ptr, gi_stride0,
    rsi_ptr, rsi_len,
    rid_ptr, nvr_ptr,
    src_ptr, src_rows, src_cols, src_stride0, src_block,
    res_ptr, res_rows, res_cols, res_stride0, res_block,
    keys_ptr, first_ptr, kind_ptr, slot_ptr, cells_ptr, union_ptr,
    HAS_RSI: tl.constexpr, HAS_RID: tl.constexpr, HAS_NVR: tl.constexpr, HAS_SRC: tl.constexpr,
    HAS_RES: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
):
    """Resolve, launch 1 of 2 (one program per batch row; run leaders work): translate the run's top-k and
    build its union, host row -> first position, in a per-run hash table; write the union's size at the
    leader's row (``-1`` for a padding run, ``0`` for rows that do not lead). Writes scratch only, so the
    union bound can be asserted between the two launches, before any output or state is written.
    """
    r0 = tl.program_id(0).to(tl.int64)
    valid = _valid_rows(N, nvr_ptr, HAS_NVR)
    q, is_leader = _run_start(r0, valid, rid_ptr, HAS_RID)
    union = 0
    if is_leader:
        union = -1
        s = _run_state(r0, q, valid, rid_ptr, rsi_ptr, rsi_len, num_states, HAS_RID, HAS_RSI, BLOCK_R)
        if s >= 0:
            r1 = _run_end(r0, q, N, valid, rid_ptr, HAS_RID)
            table, table_size, cell_base = _run_table(r0, r1, K)
            _clear_table(keys_ptr, first_ptr, kind_ptr, slot_ptr, table, table_size, BLOCK_K)
            tl.debug_barrier()
            _translate_union(r0, r1, q, s, K, gi_ptr, gi_stride0,
                             src_ptr, src_rows, src_cols, src_stride0, src_block,
                             res_ptr, res_rows, res_cols, res_stride0, res_block,
                             host_rows, keys_ptr, first_ptr, cells_ptr, table, table_size, cell_base,
                             HAS_SRC, HAS_RES, BLOCK_K)
            tl.debug_barrier()
            union = _count_union(keys_ptr, table, table_size, BLOCK_K)
    tl.store(union_ptr + r0, union)


@triton.jit
def _scan_hit_slots(dgi_ptr, keys_ptr, kind_ptr, slot_ptr, s_row, table, table_size, H, cols_h,
                    BLOCK_H: tl.constexpr):
    """Phase 3, hits: scan every slot of ``DGI[s]`` in slot order, whatever the LRU holds
    (``hisparse_kernels.cu:574-609``); a slot holding a union row serves its entry, a row held by two slots takes
    the later one (decision D3: an atomic max over the slot cells launch 1 cleared to -1)."""
    for i0 in range(0, H, BLOCK_H):
        slot = i0 + cols_h
        ms = slot < H
        key = tl.load(dgi_ptr + s_row + slot, mask=ms, other=-1)
        found = _find(keys_ptr, table, table_size, key, BLOCK_H)
        hit = found >= 0
        tl.store(kind_ptr + table + found, tl.full([BLOCK_H], _KIND_HIT, tl.int32), mask=hit)
        tl.atomic_max(slot_ptr + table + found, slot.to(tl.int32), mask=hit)


@triton.jit
def _classify_slots(lru_ptr, dgi_ptr, keys_ptr, order_ptr, s_row, order, table, table_size, H, cols_h,
                    BLOCK_H: tl.constexpr):
    """Phase 3, the LRU walk (oldest first; ``hisparse_kernels.cu:612-669``, the test at :630-632): it only sorts
    the entries, an in-range slot holding a union row is a hit, every other entry evictable. Writes the run's
    ``order`` scratch (the victims, decision D5): evictables from the front, hits from the back, both stable;
    returns the number of evictables."""
    hits = 0
    evictable = 0
    for i0 in range(0, H, BLOCK_H):
        pos = i0 + cols_h
        mp = pos < H
        slot = tl.load(lru_ptr + s_row + pos, mask=mp, other=-1).to(tl.int64)
        inr = mp & (slot >= 0) & (slot < H)
        key = tl.load(dgi_ptr + s_row + tl.where(inr, slot, 0), mask=inr, other=-1)
        hit = _find(keys_ptr, table, table_size, key, BLOCK_H) >= 0
        ev = mp & ~hit
        hit_i = hit.to(tl.int32)
        ev_i = ev.to(tl.int32)
        hit_rank = hits + tl.cumsum(hit_i, axis=0) - hit_i
        ev_rank = evictable + tl.cumsum(ev_i, axis=0) - ev_i
        tl.store(order_ptr + order + ev_rank.to(tl.int64), slot.to(tl.int32), mask=ev)
        tl.store(order_ptr + order + (H - 1 - hit_rank.to(tl.int64)), slot.to(tl.int32), mask=hit)
        hits += tl.sum(hit_i, axis=0)
        evictable += tl.sum(ev_i, axis=0)
    return evictable


@triton.jit
def _write_swap_plan(swap_host_ptr, swap_dev_ptr, segment, m, key, miss, good, slot, q,
                     hbt_ptr, hbt_rows, hbt_cols, hbt_stride0, block_size):
    """Misses ``m`` of the run in the flat ``[N * K]`` swap plan, from its first row's ``segment``: host row, and
    the victim's hot row (-1 past the tripwire). Addresses as ``(ptr + segment) + m``, one scalar add per tile."""
    tl.store(swap_host_ptr + segment + m, key, mask=miss)
    victim = _phys(q, tl.where(good, slot, 0), hbt_ptr, hbt_rows, hbt_cols, hbt_stride0, block_size)
    dev = tl.where(good, victim, -1)
    tl.store(swap_dev_ptr + segment + m, dev.to(tl.int32), mask=miss)


@triton.jit
def _assign_misses(
    r0, r1, q, K, H, s_row, order, table, cell_base,
    cells_ptr, keys_ptr, first_ptr, kind_ptr, slot_ptr, order_ptr, dgi_ptr,
    swap_host_ptr, swap_dev_ptr, hbt_ptr, hbt_rows, hbt_cols, hbt_stride0, block_size, cols_k,
    HAS_SWAP: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Phase 4: union entries without a hit, in first-reference order, are misses ``m`` and take victim ``m`` (the
    ``m``-th evictable; past them a hit slot, decision D5): swap plan at the run's first row's segment,
    ``DGI[s, slot] = g``; an out-of-range victim marks the entry invalid (the tripwire). Returns ``M``, invalid
    misses included."""
    misses = 0
    for r in range(r0, r1):
        for c0 in range(0, K, BLOCK_K):
            cols = c0 + cols_k
            mc = cols < K
            p = ((r - r0) * K + cols).to(tl.int32)
            cell = tl.load(cells_ptr + cell_base + p.to(tl.int64), mask=mc, other=-1).to(tl.int64)
            host = mc & (cell >= 0)
            safe = tl.where(host, cell, 0)
            first = tl.load(first_ptr + table + safe, mask=host, other=-1)
            kind = tl.load(kind_ptr + table + safe, mask=host, other=_KIND_NONE)
            miss = host & (first == p) & (kind == _KIND_NONE)
            miss_i = miss.to(tl.int32)
            m = (misses + tl.cumsum(miss_i, axis=0) - miss_i).to(tl.int64)
            slot = tl.load(order_ptr + order + m, mask=miss, other=-1).to(tl.int64)  # m < max_union_rows <= H
            good = miss & (slot >= 0) & (slot < H)
            key = tl.load(keys_ptr + table + safe, mask=miss, other=0)
            if HAS_SWAP:
                _write_swap_plan(swap_host_ptr, swap_dev_ptr, r0 * K, m, key, miss, good, slot, q,
                                 hbt_ptr, hbt_rows, hbt_cols, hbt_stride0, block_size)
            tl.store(dgi_ptr + s_row + tl.where(good, slot, 0), key, mask=good)
            tl.store(kind_ptr + table + safe, tl.where(good, _KIND_MISS, _KIND_INVALID), mask=miss)
            tl.store(slot_ptr + table + safe, slot.to(tl.int32), mask=good)
            misses += tl.sum(miss_i, axis=0)
    return misses


@triton.jit
def _publish_indices(
    r0, r1, q, s, K, gi_ptr, gi_stride0,
    src_ptr, src_rows, src_cols, src_stride0, src_block,
    res_ptr, res_rows, res_cols, res_stride0, res_block,
    host_rows, cells_ptr, first_ptr, kind_ptr, slot_ptr, table, cell_base,
    hbt_ptr, hbt_rows, hbt_cols, hbt_stride0, block_size,
    hot_ptr, att_ptr, att_stride0, att_block_stride, valid_ptr, valid_stride0, swap_counts_ptr, swap_misses,
    cols_k,
    HAS_SRC: tl.constexpr, HAS_RES: tl.constexpr, HAS_ATT: tl.constexpr, HAS_VALID: tl.constexpr,
    HAS_SWAP: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Phases 5-6 for every position of the run: the resident row, the hot row of its entry's slot, or -1; the
    attention index; ``valid_counts``; ``swap_counts[r0 + j] = clamp(M - j * K, 0, K)`` for the run's
    ``swap_misses`` (``M``); and the stats tally, returned as (hits, misses): a miss counts once at its first
    reference, every other reference to a served entry is a hit."""
    hits = 0
    misses = 0
    for r in range(r0, r1):
        valid_row = 0
        for c0 in range(0, K, BLOCK_K):
            cols = c0 + cols_k
            mc = cols < K
            t = tl.load(gi_ptr + r * gi_stride0 + cols, mask=mc, other=-1)
            g, res = _translate(t, q, s, src_ptr, src_rows, src_cols, src_stride0, src_block,
                                res_ptr, res_rows, res_cols, res_stride0, res_block,
                                host_rows, HAS_SRC, HAS_RES)
            p = ((r - r0) * K + cols).to(tl.int32)
            host = mc & (res < 0) & (g >= 0)
            cell = tl.load(cells_ptr + cell_base + p.to(tl.int64), mask=host, other=0).to(tl.int64)
            kind = tl.load(kind_ptr + table + cell, mask=host, other=_KIND_INVALID)
            slot = tl.load(slot_ptr + table + cell, mask=host, other=0)
            first = tl.load(first_ptr + table + cell, mask=host, other=-1)
            served = host & (kind != _KIND_INVALID)
            phys = _phys(q, tl.where(served, slot, 0), hbt_ptr, hbt_rows, hbt_cols, hbt_stride0, block_size)
            x = tl.where(res >= 0, res, tl.where(served, phys, -1))
            _write_index(hot_ptr, att_ptr, att_stride0, r, cols, x, mc, block_size, att_block_stride, K, HAS_ATT)
            is_miss = served & (kind == _KIND_MISS) & (first == p)
            misses += tl.sum(is_miss.to(tl.int32), axis=0)
            hits += tl.sum((served & ~is_miss).to(tl.int32), axis=0)
            valid_row += tl.sum((mc & ((res >= 0) | (g >= 0))).to(tl.int32), axis=0)
        if HAS_VALID:
            tl.store(valid_ptr + r * valid_stride0, valid_row)
        if HAS_SWAP:
            share = tl.minimum(tl.maximum(swap_misses - (r - r0) * K, 0), K)
            tl.store(swap_counts_ptr + r, share.to(tl.int32))
    return hits, misses


@triton.jit
def _add_stats(stats_ptr, hits, misses, HAS_STATS: tl.constexpr):
    """Phase 6: ``stats[0] += hits``, ``stats[1] += misses`` (int64 view of the uint64 counters, decision D6)."""
    if HAS_STATS:
        tl.atomic_add(stats_ptr, hits.to(tl.int64))
        tl.atomic_add(stats_ptr + 1, misses.to(tl.int64))


@triton.jit
def _reorder_lru(lru_ptr, order_ptr, s_row, order, H, evictable, misses, cols_h, BLOCK_H: tl.constexpr):
    """Phase 7 (``hisparse_kernels.cu:823-835``): ``LRU[s] = evictables[M:] + evictables[:M] + hits``: unused
    evictables, the slots just filled, then the hits in their old order (``order`` holds the evictables from the
    front and the hits reversed at the back); with more misses than evictables (D5), ``order[M - E:M] + hits``."""
    for i0 in range(0, H, BLOCK_H):
        i = i0 + cols_h
        mi = i < H
        stale = evictable - misses
        src = tl.where(i < stale, misses + i,
                       tl.where(i < evictable, i - stale, H - 1 - (i - evictable)))
        val = tl.load(order_ptr + order + src, mask=mi, other=0)
        tl.store(lru_ptr + s_row + i, val.to(tl.int16), mask=mi)


@triton.jit
def _publish_padding(hot_ptr, att_ptr, att_stride0, att_block_stride, valid_ptr, valid_stride0, swap_counts_ptr,
                     r0, r1, K, block_size, cols_k, HAS_ATT: tl.constexpr, HAS_VALID: tl.constexpr,
                     HAS_SWAP: tl.constexpr, BLOCK_K: tl.constexpr):
    """A padding run: -1 indices, 0 counts; swap rows and state untouched (``hisparse_kernels.cu:393-411``)."""
    for r in range(r0, r1):
        for c0 in range(0, K, BLOCK_K):
            cols = c0 + cols_k
            mc = cols < K
            none = tl.full([BLOCK_K], -1, tl.int64)
            _write_index(hot_ptr, att_ptr, att_stride0, r, cols, none, mc, block_size, att_block_stride, K, HAS_ATT)
        if HAS_VALID:
            tl.store(valid_ptr + r * valid_stride0, 0)
        if HAS_SWAP:
            tl.store(swap_counts_ptr + r, 0)


@triton.jit
def resolve_residency_kernel(
    # geometry
    host_rows, block_size, N, K, H, num_states, max_union_rows,
    # inputs and state
    hbt_ptr, hbt_rows, hbt_cols, hbt_stride0,
    gi_ptr, gi_stride0,
    hot_ptr,
    dgi_ptr, lru_ptr,
    rsi_ptr, rsi_len,
    rid_ptr, nvr_ptr,
    src_ptr, src_rows, src_cols, src_stride0, src_block,
    res_ptr, res_rows, res_cols, res_stride0, res_block,
    # optional outputs
    stats_ptr, att_ptr, att_stride0, att_block_stride,
    valid_ptr, valid_stride0,
    swap_host_ptr, swap_dev_ptr, swap_counts_ptr,
    # scratch: per run, at offsets derived from its first row
    keys_ptr, first_ptr, kind_ptr, slot_ptr, cells_ptr, order_ptr, union_ptr,
    HAS_RSI: tl.constexpr, HAS_RID: tl.constexpr, HAS_NVR: tl.constexpr, HAS_SRC: tl.constexpr,
    HAS_RES: tl.constexpr, HAS_STATS: tl.constexpr, HAS_ATT: tl.constexpr, HAS_VALID: tl.constexpr,
    HAS_SWAP: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """Resolve, launch 2 of 2 (one program per batch row; run leaders work): with the union from launch 1,
    find the slots serving its union (every slot), sort its LRU into hits and evictables, give misses the oldest
    evictable slots, publish indices and counts,
    rewrite the LRU. Padding runs (union -1) get padding outputs; a run over ``max_union_rows`` (the assertion
    between the launches fired) is written as padding too and touches no state."""
    r0 = tl.program_id(0).to(tl.int64)
    valid = _valid_rows(N, nvr_ptr, HAS_NVR)
    q, is_leader = _run_start(r0, valid, rid_ptr, HAS_RID)
    if is_leader:
        r1 = _run_end(r0, q, N, valid, rid_ptr, HAS_RID)
        s = _state_of(q, rsi_ptr, rsi_len, num_states, HAS_RSI)
        union = tl.load(union_ptr + r0)
        usable = (union >= 0) & (union <= max_union_rows)
        # Tile lanes made once here and passed to the phases, so the compiled code stays the single-body kernel's
        # (a tl.arange per helper lands inside the branches; with that and a reassociated swap-plan offset, sm_100
        # compiled top-k 32 with a 48-byte spill).
        cols_k = tl.arange(0, BLOCK_K).to(tl.int64)
        table, table_size, cell_base = _run_table(r0, r1, K)
        if usable:
            evictable = 0
            misses = 0
            s_row = s * H
            order = r0 * H
            cols_h = tl.arange(0, BLOCK_H).to(tl.int64)
            if union > 0:
                _scan_hit_slots(dgi_ptr, keys_ptr, kind_ptr, slot_ptr, s_row, table, table_size, H, cols_h, BLOCK_H)
                evictable = _classify_slots(lru_ptr, dgi_ptr, keys_ptr, order_ptr, s_row, order, table, table_size, H,
                                            cols_h, BLOCK_H)
                tl.debug_barrier()
                misses = _assign_misses(r0, r1, q, K, H, s_row, order, table, cell_base,
                                        cells_ptr, keys_ptr, first_ptr, kind_ptr, slot_ptr, order_ptr, dgi_ptr,
                                        swap_host_ptr, swap_dev_ptr, hbt_ptr, hbt_rows, hbt_cols, hbt_stride0,
                                        block_size, cols_k, HAS_SWAP, BLOCK_K)
                tl.debug_barrier()
            hits_count, miss_count = _publish_indices(
                r0, r1, q, s, K, gi_ptr, gi_stride0,
                src_ptr, src_rows, src_cols, src_stride0, src_block,
                res_ptr, res_rows, res_cols, res_stride0, res_block,
                host_rows, cells_ptr, first_ptr, kind_ptr, slot_ptr, table, cell_base,
                hbt_ptr, hbt_rows, hbt_cols, hbt_stride0, block_size,
                hot_ptr, att_ptr, att_stride0, att_block_stride, valid_ptr, valid_stride0, swap_counts_ptr, misses,
                cols_k, HAS_SRC, HAS_RES, HAS_ATT, HAS_VALID, HAS_SWAP, BLOCK_K)
            if union > 0:
                _reorder_lru(lru_ptr, order_ptr, s_row, order, H, evictable, misses, cols_h, BLOCK_H)
                _add_stats(stats_ptr, hits_count, miss_count, HAS_STATS)
        else:
            _publish_padding(hot_ptr, att_ptr, att_stride0, att_block_stride, valid_ptr, valid_stride0, swap_counts_ptr,
                             r0, r1, K, block_size, cols_k, HAS_ATT, HAS_VALID, HAS_SWAP, BLOCK_K)


@triton.jit
def gather_rows_kernel(
    host_ptr, hot_ptr, gi_ptr, hi_ptr, mask_ptr, counts_ptr,
    C, tiles_per_row, tiles, host_rows, hot_rows, block_size, block_stride_w, row_stride_w, row_words,
    COMPACT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr,
):
    """Copy host rows into hot rows, ``BLOCK_C`` plan columns (rows to copy) per tile; grid-stride over tiles.

    Tile ``i`` is columns ``[c0, c0 + BLOCK_C)`` of plan row ``i // tiles_per_row``; program ``p`` does tiles
    ``p, p + P, ...`` of the ``tiles`` (``P`` programs), so the grid stays fixed whatever the batch.
    ``COMPACT``: the first ``clamp(counts[r], 0, C)`` columns (gather_compact); a tile past the count reads
    nothing more. Else the columns whose mask is nonzero (gather_plan). ``g >= host_rows`` zero-fills; negative
    sources and destinations outside the hot cache are skipped (``hisparse_kernels.cu:841-895``). Destination
    ``d`` is at ``d // block_size * block_stride + d % block_size * row_stride`` (words); addresses are int64.
    """
    words = tl.arange(0, BLOCK_W).to(tl.int64)
    lanes = tl.arange(0, BLOCK_C).to(tl.int64)
    for tile in range(tl.program_id(0), tiles, tl.num_programs(0)):
        r = (tile // tiles_per_row).to(tl.int64)
        c0 = (tile % tiles_per_row).to(tl.int64) * BLOCK_C
        if COMPACT:
            n = tl.minimum(tl.maximum(tl.load(counts_ptr + r), 0), C).to(tl.int64)
            work = c0 < n
        else:
            work = c0 < C
        if work:
            cols = c0 + lanes
            mc = cols < C
            d = tl.load(hi_ptr + r * C + cols, mask=mc, other=-1).to(tl.int64)
            if COMPACT:
                take = mc & (cols < n)
            else:
                flagged = tl.load(mask_ptr + r * C + cols, mask=mc, other=0)
                take = (mc & (flagged != 0)) != 0
            g = tl.load(gi_ptr + r * C + cols, mask=take, other=-1).to(tl.int64)
            take = take & (g >= 0) & (d >= 0) & (d < hot_rows)
            from_host = take & (g < host_rows)
            dsafe = tl.where(take, d, 0)
            row_start = (dsafe // block_size) * block_stride_w + (dsafe % block_size) * row_stride_w
            src_start = tl.where(from_host, g, 0) * row_words  # int64: host rows x row words passes 2^31
            for w0 in range(0, row_words, BLOCK_W):
                w = w0 + words
                mw = w < row_words
                vals = tl.load(host_ptr + src_start[:, None] + w[None, :], mask=from_host[:, None] & mw[None, :],
                               other=0)
                tl.store(hot_ptr + row_start[:, None] + w[None, :], vals, mask=take[:, None] & mw[None, :])


@triton.jit
def invalidate_written_slots_kernel(
    ptrs_ptr, known_ptr, num_known, rsi_ptr, rid_ptr, ws_ptr, rsi_len, num_states, H,
    BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """One program per (written token, table address): clear every entry of the token's state row in that
    table that holds its host row (``hisparse_kernels.cu:896-1012``). The int64 address becomes an int32
    pointer only when it is one of the ``num_known`` registered table addresses; an unknown address writes
    nothing (the assertion before the launch reports it)."""
    t = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1).to(tl.int64)
    address = tl.load(ptrs_ptr + group)
    hits = 0
    for k0 in range(0, num_known, BLOCK_T):
        ks = k0 + tl.arange(0, BLOCK_T).to(tl.int64)
        known = tl.load(known_ptr + ks, mask=ks < num_known, other=0)
        hits += tl.sum(((ks < num_known) & (known == address)).to(tl.int32), axis=0)
    q = tl.load(rid_ptr + t).to(tl.int64)
    if (hits > 0) & (q >= 0) & (q < rsi_len):
        s = tl.load(rsi_ptr + q).to(tl.int64)
        w = tl.load(ws_ptr + t).to(tl.int64)
        if (s >= 0) & (s < num_states) & (w >= 0) & (w <= 2147483647):
            table = address.to(tl.pointer_type(tl.int32))
            cols = tl.arange(0, BLOCK_H).to(tl.int64)
            for i0 in range(0, H, BLOCK_H):
                i = i0 + cols
                mi = i < H
                held = tl.load(table + s * H + i, mask=mi, other=-1).to(tl.int64)
                tl.store(table + s * H + i, tl.full([BLOCK_H], -1, tl.int32), mask=mi & (held == w))
