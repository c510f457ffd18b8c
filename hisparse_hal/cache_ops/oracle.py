"""Reference implementation of the four cache ops: plain per-request Python over ints, slow and obviously right.

Invariant: it follows docs/design/cache-ops.md line by line and writes exactly the outputs the doc says are
written (everything else keeps its prior, e.g. poisoned, value). Other implementations must equal it bit for bit.
It reads tensors back with ``.tolist()``, so it syncs; use it in tests and benchmarks only.
"""

from __future__ import annotations

import torch

from . import arguments

__all__ = [
    "FLAG_LRU_TRIPWIRE",
    "FLAG_SHARED_STATE_ROW",
    "FLAG_UNION_OVERFLOW",
    "gather_compact",
    "gather_plan",
    "invalidate_written_slots",
    "resolve_residency",
]

#: ``error_flags`` bits (our extension; vLLM's kernel traps or races instead).
FLAG_UNION_OVERFLOW = 1
FLAG_LRU_TRIPWIRE = 2
FLAG_SHARED_STATE_ROW = 4

_U64 = 1 << 64
_HIT, _MISS, _INVALID = "hit", "miss", "invalid"


class _Out:
    """An output tensor read into nested lists (keeping untouched values), written back by :meth:`store`."""

    def __init__(self, tensor: torch.Tensor | None, flat: bool = False) -> None:
        self.tensor = tensor
        self.flat = flat
        self.values: list = [] if tensor is None else (tensor.reshape(-1) if flat else tensor).tolist()

    def __setitem__(self, index: tuple[int, ...], value: int) -> None:
        if self.tensor is None:
            return
        if len(index) == 1:
            self.values[index[0]] = value
        else:
            self.values[index[0]][index[1]] = value

    def store(self) -> None:
        if self.tensor is None:
            return
        values = torch.tensor(_wrapped(self.values), dtype=torch.int64).to(self.tensor.dtype)
        if self.flat:
            self.tensor.copy_(values.view(self.tensor.shape))
        else:
            self.tensor.copy_(values)


def _wrapped(values: list) -> list:
    """Values as int64 two's complement (decision 10: an int32 output keeps the low 32 bits, the int64 cast
    to int32 that torch's ``copy_`` and Triton's ``.to(tl.int32)`` do). Exact int64 stays exact."""
    if values and isinstance(values[0], list):
        return [_wrapped(row) for row in values]
    return [((v + (1 << 63)) % _U64) - (1 << 63) for v in values]


def _runs(request_ids: list[int] | None, num_rows: int) -> list[tuple[int, int, int]]:
    """``(r0, r1, q)`` for each maximal block of equal request ids (every row alone without ids)."""
    if request_ids is None:
        return [(r, r + 1, r) for r in range(num_rows)]
    runs: list[tuple[int, int, int]] = []
    r0 = 0
    for r in range(1, num_rows + 1):
        if r == num_rows or request_ids[r] != request_ids[r0]:
            runs.append((r0, r, request_ids[r0]))
            r0 = r
    return runs


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
    """Plan one decode step (``hisparse_resolve_residency``): translate, hit, evict in LRU order, update state.

    Arguments, order and in-place outputs are vLLM 0.33.0's; ``error_flags`` (int32 ``[1]``) is OR-ed with
    ``FLAG_UNION_OVERFLOW``, ``FLAG_LRU_TRIPWIRE`` and ``FLAG_SHARED_STATE_ROW``. Moves no KV bytes.

    Raises:
        InvalidArgumentError: an argument fails :func:`arguments.check_resolve_residency` (nothing written).
    """
    arguments.check_resolve_residency(
        host_cache, hot_cache, hot_block_table, global_indices, hot_indices, device_global_indices,
        lru_slots, request_state_indices, region_stride, max_union_rows, miss_mask, stats,
        attention_indices, attention_block_stride, request_ids, source_block_table, source_block_size,
        resolved_global_indices, valid_counts, swap_host_physical_rows, swap_device_physical_rows,
        swap_counts, resident_block_table, resident_block_size, resident_null_block, error_flags=error_flags,
    )
    num_rows, top_k = global_indices.shape
    if num_rows == 0 or top_k == 0:
        return
    host_rows = host_cache.shape[0]
    block = hot_cache.shape[1]
    hot_size = region_stride
    topk = global_indices.tolist()
    hot_table = hot_block_table.tolist()
    dgi = device_global_indices.tolist()
    lru = lru_slots.tolist()
    states = request_state_indices.tolist() if request_state_indices is not None else None
    ids = request_ids.reshape(-1)[:num_rows].tolist() if request_ids is not None else None
    src = source_block_table.tolist() if source_block_table is not None else None
    res = resident_block_table.tolist() if resident_block_table is not None else None
    hot_out, attention_out = _Out(hot_indices), _Out(attention_indices)
    resolved_out, mask_out = _Out(resolved_global_indices), _Out(miss_mask)
    valid_out = _Out(valid_counts)
    swap_host, swap_device = _Out(swap_host_physical_rows, flat=True), _Out(swap_device_physical_rows, flat=True)
    swap_count = _Out(swap_counts, flat=True)
    hits = misses = 0
    flags = 0

    def translate(t: int, q: int) -> tuple[int, int]:
        if src is None:
            g = t
            resident = -1
        else:
            page = t // source_block_size if t >= 0 else -1
            g = -1
            if 0 <= q < len(src) and 0 <= page < len(src[q]) and src[q][page] > 0:  # host block 0 is null
                g = src[q][page] * source_block_size + t % source_block_size
            resident = -1
            if res is not None:
                page = t // resident_block_size if t >= 0 else -1
                if 0 <= q < len(res) and 0 <= page < len(res[q]):  # indexed by batch row q, as kernel K
                    b = res[q][page]
                    if b >= 0 and b != resident_null_block:
                        resident = b * resident_block_size + t % resident_block_size
        return (-1 if g >= host_rows else g), resident

    def phys(q: int, slot: int) -> int:
        return hot_table[q][slot // block] * block + slot % block

    def out(r: int, c: int, x: int) -> None:
        hot_out[r, c] = x
        attention_out[r, c] = -1 if x < 0 else (x // block) * attention_block_stride + x % block

    def pad(r0: int, r1: int) -> None:
        for r in range(r0, r1):
            for c in range(top_k):
                out(r, c, -1)
                resolved_out[r, c] = -1
            valid_out[r,] = 0
            swap_count[r,] = 0

    claimed: set[int] = set()
    for r0, r1, q in _runs(ids, num_rows):
        if states is None:
            s = q
        else:
            s = states[q] if 0 <= q < len(states) else -1
        if not 0 <= s < len(dgi):
            pad(r0, r1)
            continue
        # Phase 1: translate; the union maps each host row to its first position in the run.
        union: dict[int, int] = {}
        translated: list[list[tuple[int, int]]] = []
        for r in range(r0, r1):
            row = [translate(t, q) for t in topk[r]]
            translated.append(row)
            for c, (g, resident) in enumerate(row):
                if resident < 0 and g >= 0 and g not in union:
                    union[g] = (r - r0) * top_k + c
        if len(union) > max_union_rows:  # ours: flag and treat as padding (kernel K traps)
            flags |= FLAG_UNION_OVERFLOW
            pad(r0, r1)
            continue
        if s in claimed:  # ours: a state row serves one run per call; a later run is padding
            flags |= FLAG_SHARED_STATE_ROW
            pad(r0, r1)
            continue
        claimed.add(s)
        for r in range(r0, r1):
            row = translated[r - r0]
            for c, (g, resident) in enumerate(row):
                resolved_out[r, c] = g
                mask_out[r, c] = 0
                if resident >= 0:
                    out(r, c, resident)
                elif g < 0:
                    out(r, c, -1)
            valid_out[r,] = sum(1 for g, resident in row if resident >= 0 or g >= 0)
        if not union:
            for r in range(r0, r1):
                swap_count[r,] = 0
            continue
        # Phase 2: classify slots in LRU order (oldest first). A doubly held row keeps its last slot.
        hit_slots: list[int] = []
        evictable: list[int] = []
        entry: dict[int, tuple[str, int]] = {}
        for slot in lru[s]:
            key = dgi[s][slot] if 0 <= slot < hot_size else -1
            if key >= 0 and key in union:
                entry[key] = (_HIT, slot)
                hit_slots.append(slot)
            else:
                evictable.append(slot)
        # Phase 3: misses take the oldest evictable slots, in first-reference order.
        m = 0
        for g in sorted(union, key=union.__getitem__):
            if g in entry:
                continue
            slot = evictable[m]
            j = r0 * top_k + m
            swap_host[j,] = g
            if 0 <= slot < hot_size:
                entry[g] = (_MISS, slot)
                swap_device[j,] = phys(q, slot)
                dgi[s][slot] = g
            else:  # a corrupted LRU entry: the reference is dropped, the copy skipped
                entry[g] = (_INVALID, slot)
                swap_device[j,] = -1
                flags |= FLAG_LRU_TRIPWIRE
            m += 1
        # Phase 4: publish indices and count.
        for r in range(r0, r1):
            for c, (g, resident) in enumerate(translated[r - r0]):
                if resident >= 0 or g < 0:
                    continue
                kind, slot = entry[g]
                if kind == _INVALID:
                    out(r, c, -1)
                    continue
                out(r, c, phys(q, slot))
                if kind == _MISS and union[g] == (r - r0) * top_k + c:
                    mask_out[r, c] = 1
                    misses += 1
                else:
                    hits += 1
        for r in range(r0, r1):
            swap_count[r,] = min(max(m - (r - r0) * top_k, 0), top_k)
        # Phase 5: unused evictables, then the slots just filled, then the hits.
        lru[s] = evictable[m:] + evictable[:m] + hit_slots

    for output in (hot_out, attention_out, resolved_out, mask_out, valid_out, swap_host, swap_device, swap_count):
        output.store()
    device_global_indices.copy_(torch.tensor(dgi, dtype=torch.int32))
    lru_slots.copy_(torch.tensor(lru, dtype=torch.int16))
    if stats is not None:  # ours: through an int64 view, wrapping mod 2**64
        totals = [(v % _U64) for v in stats.view(torch.int64).tolist()]
        updated = [(totals[0] + hits) % _U64, (totals[1] + misses) % _U64]
        stats.view(torch.int64).copy_(torch.tensor([v - _U64 if v >= 1 << 63 else v for v in updated]))
    if error_flags is not None and flags:
        error_flags[0] = int(error_flags[0]) | flags


def _copy_row(host: torch.Tensor, hot: torch.Tensor, block: int, g: int, d: int) -> None:
    target = hot[d // block, d % block] if hot.dim() == 3 else hot[d]
    if g < host.shape[0]:
        target.copy_(host[g])
    else:  # no source row: zeros, never stale bytes
        target.zero_()


def gather_compact(
    host_cache: torch.Tensor,
    hot_cache: torch.Tensor,
    miss_global_indices: torch.Tensor,
    miss_hot_indices: torch.Tensor,
    miss_counts: torch.Tensor,
) -> None:
    """Copy the first ``clamp(miss_counts[r], 0, K)`` planned rows of each row ``r`` (``hisparse_gather_compact``).

    Host row ``g >= host_rows`` zero-fills; negative ``g``, negative ``d`` or ``d`` past the hot cache are
    skipped. Entries are applied in (row, column) order, so a repeated destination ends with the later entry.

    Raises:
        InvalidArgumentError: an argument fails :func:`arguments.check_gather_compact` (nothing copied).
    """
    arguments.check_gather_compact(host_cache, hot_cache, miss_global_indices, miss_hot_indices, miss_counts)
    num_rows, top_k = miss_global_indices.shape
    host = host_cache.view(torch.uint8)
    hot = hot_cache.view(torch.uint8)
    block = hot_cache.shape[1]
    hot_rows = hot_cache.shape[0] * block
    sources, targets = miss_global_indices.tolist(), miss_hot_indices.tolist()
    counts = miss_counts.reshape(-1)[:num_rows].tolist()
    for r in range(num_rows):
        for c in range(min(max(counts[r], 0), top_k)):
            g, d = sources[r][c], targets[r][c]
            if g >= 0 and 0 <= d < hot_rows:
                _copy_row(host, hot, block, g, d)


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
    """Copy host row ``global_indices[r, c]`` to hot row ``hot_indices[r, c]`` where ``miss_mask`` is nonzero.

    ``request_state_indices[r] < 0`` marks padding row ``r``: nothing copied, attention -1. A 2-D hot cache is a
    staging buffer of block size 1. ``attention_indices`` is written for every entry (``hisparse_gather_plan``).

    Raises:
        InvalidArgumentError: an argument fails :func:`arguments.check_gather_plan` (nothing copied).
    """
    arguments.check_gather_plan(
        host_cache, hot_cache, global_indices, hot_indices, miss_mask, request_state_indices,
        attention_indices, attention_block_stride,
    )
    num_rows, columns = global_indices.shape
    host = host_cache.view(torch.uint8)
    hot = hot_cache.view(torch.uint8)
    block = hot_cache.shape[1] if hot_cache.dim() == 3 else 1
    hot_rows = hot_cache.shape[0] * block
    sources, targets, mask = global_indices.tolist(), hot_indices.tolist(), miss_mask.tolist()
    states = request_state_indices.reshape(-1).tolist() if request_state_indices is not None else None
    for r in range(num_rows):
        padding = states is not None and states[r] < 0
        for c in range(columns):
            d = targets[r][c]
            if attention_indices is not None:
                value = -1 if padding or d < 0 else (d // block) * attention_block_stride + d % block
                attention_indices[r, c] = ((value + (1 << 31)) % (1 << 32)) - (1 << 31)  # decision 10: low 32 bits
            g = sources[r][c]
            if padding or mask[r][c] == 0 or g < 0 or not 0 <= d < hot_rows:
                continue
            _copy_row(host, hot, block, g, d)


def invalidate_written_slots(
    device_global_indices: torch.Tensor,
    request_state_indices: torch.Tensor,
    req_id_per_token: torch.Tensor,
    written_slots: torch.Tensor,
) -> None:
    """Set to -1 every entry of token ``t``'s state row equal to ``written_slots[t]`` (all occurrences).

    A token whose request row or state row is out of range, or whose slot is negative, changes nothing.

    Raises:
        InvalidArgumentError: an argument fails :func:`arguments.check_invalidate_written_slots` (nothing written).
    """
    arguments.check_invalidate_written_slots(
        device_global_indices, request_state_indices, req_id_per_token, written_slots
    )
    dgi = device_global_indices.tolist()
    states = request_state_indices.tolist()
    for q, w in zip(req_id_per_token.tolist(), written_slots.tolist(), strict=True):
        if not 0 <= q < len(states) or w < 0:
            continue
        s = states[q]
        if not 0 <= s < len(dgi):
            continue
        dgi[s] = [-1 if x == w else x for x in dgi[s]]
    if dgi:
        device_global_indices.copy_(torch.tensor(dgi, dtype=torch.int32))
