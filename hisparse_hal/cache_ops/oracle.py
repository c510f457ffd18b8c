"""Reference implementation of the four vLLM 0.34.0 cache ops: plain Python over ints, slow and obviously right.

Invariant: it follows docs/design/cache-ops.md phase by phase (each phase is one function here, named as in the
doc) and writes exactly the outputs the doc says are written; everything else keeps its prior (e.g. poisoned)
value. Every check, including the union bound, happens before the first write. Other implementations must
equal it bit for bit. It reads tensors back with ``.tolist()``, so it syncs: tests and benchmarks only.
"""

from __future__ import annotations

import dataclasses

import torch

from hisparse_hal.errors import UnionOverflowError, UnknownTableError

from .arguments import GatherInputs, InvalidateInputs, ResolveInputs
from .signatures import vllm_ops

__all__ = ["gather_compact", "gather_plan", "invalidate_written_slots", "resolve_residency"]

_U64 = 1 << 64
_INT32_MAX = (1 << 31) - 1
_HIT, _MISS, _INVALID = "hit", "miss", "invalid"


def _wrapped(values: list) -> list:
    """Values as int64 two's complement (decision D8: an int32 output keeps the low 32 bits, as torch's
    ``copy_`` and Triton's ``.to(tl.int32)`` do)."""
    if values and isinstance(values[0], list):
        return [_wrapped(row) for row in values]
    return [((v + (1 << 63)) % _U64) - (1 << 63) for v in values]


class _Out:
    """An output tensor read into (nested) lists, keeping untouched values; written back by :meth:`store`."""

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
        self.tensor.copy_(values.view(self.tensor.shape) if self.flat else values)


@dataclasses.dataclass
class _Run:
    """A maximal block of consecutive rows ``[first, end)`` with one request (phase 0)."""

    first: int
    end: int
    request: int
    state: int  # -1: a padding run
    positions: list[list[tuple[int, int]]] = dataclasses.field(default_factory=list)  # (g, resident) per (row, c)
    union: dict[int, int] = dataclasses.field(default_factory=dict)  # host row -> first flat position in the run


class _Step:
    """One resolve call's values as Python lists, and its outputs (written back only at the end)."""

    def __init__(self, inputs: ResolveInputs) -> None:
        self.inputs = inputs
        self.topk = inputs.global_indices.tolist()
        self.hot_table = inputs.hot_block_table.tolist()
        self.dgi = inputs.device_global_indices.tolist()
        self.lru = inputs.lru_slots.tolist()
        self.rsi = inputs.request_state_indices.tolist() if inputs.request_state_indices is not None else None
        ids = inputs.request_ids
        self.ids = ids.reshape(-1)[:inputs.num_rows].tolist() if ids is not None else None
        self.src = inputs.source_block_table.tolist() if inputs.source_block_table is not None else None
        self.res = inputs.resident_block_table.tolist() if inputs.resident_block_table is not None else None
        nvr = inputs.num_valid_rows
        self.valid_rows = min(int(nvr.reshape(-1)[0]), inputs.num_rows) if nvr is not None else inputs.num_rows
        self.hot_out, self.attention_out = _Out(inputs.hot_indices), _Out(inputs.attention_indices)
        self.valid_out = _Out(inputs.valid_counts)
        self.swap_host = _Out(inputs.swap_host_physical_rows, flat=True)
        self.swap_device = _Out(inputs.swap_device_physical_rows, flat=True)
        self.swap_count = _Out(inputs.swap_counts, flat=True)
        self.hits = 0
        self.misses = 0


# ---------------------------------------------------------------------------------------------- resolve phases
def classify_rows(step: _Step) -> list[_Run]:
    """Phase 0: each row's request (-1 past ``num_valid_rows``), runs of equal requests, their state rows.

    A later run on a state row an earlier run of this call already uses is a padding run (decision D1).
    """
    inputs = step.inputs
    if step.ids is None:
        requests = list(range(inputs.num_rows))  # without request_ids each row is its own request
    else:  # hisparse_kernels.cu:378-389: rows at or past num_valid_rows belong to no request
        requests = [q if r < step.valid_rows else -1 for r, q in enumerate(step.ids)]
    runs: list[_Run] = []
    claimed: set[int] = set()
    first = 0
    for r in range(1, inputs.num_rows + 1):
        if r < inputs.num_rows and requests[r] == requests[first]:
            continue
        q = requests[first]
        if step.rsi is None:
            state = q
        else:
            state = step.rsi[q] if 0 <= q < len(step.rsi) else -1
        if not 0 <= state < inputs.num_states or state in claimed:
            state = -1
        else:
            claimed.add(state)
        runs.append(_Run(first, r, q, state))
        first = r
    return runs


def translate(step: _Step, run: _Run) -> None:
    """Phase 1: each position's host row ``g`` and resident row, and the run's union (first reference of each g).

    Source table by batch request row; resident table by **state** row, block 0 = host
    (``hisparse_kernels.cu:217-261``); ``g >= host_rows`` is -1.
    """
    inputs = step.inputs
    q, s = run.request, run.state
    sbs, rbs = inputs.source_block_size, inputs.resident_block_size
    for r in range(run.first, run.end):
        row = []
        for c, t in enumerate(step.topk[r]):
            g, resident = t, -1
            if step.src is not None:
                page = t // sbs if t >= 0 else -1
                g = -1
                if 0 <= q < len(step.src) and 0 <= page < len(step.src[q]) and step.src[q][page] > 0:
                    g = step.src[q][page] * sbs + t % sbs
                if step.res is not None:
                    page = t // rbs if t >= 0 else -1
                    if 0 <= s < len(step.res) and 0 <= page < len(step.res[s]) and step.res[s][page] > 0:
                        resident = step.res[s][page] * rbs + t % rbs
            g = -1 if g >= inputs.host_rows else g
            row.append((g, resident))
            if resident < 0 and g >= 0 and g not in run.union:
                run.union[g] = (r - run.first) * inputs.top_k + c
        run.positions.append(row)


def check_union(step: _Step, runs: list[_Run]) -> None:
    """Phase 2 bound: no run may select more than ``max_union_rows`` host rows (``hisparse_kernels.cu:563-571``
    traps; decision D2: we raise before any write).

    Raises:
        UnionOverflowError: naming the first such run in row order.
    """
    for run in runs:
        if run.state >= 0 and len(run.union) > step.inputs.max_union_rows:
            raise UnionOverflowError(run.state, run.request, len(run.union), step.inputs.max_union_rows)


def _physical(step: _Step, q: int, slot: int) -> int:
    """The hot row of ``slot`` through ``hot_block_table[q]`` (a cell outside the table is block -1)."""
    block = step.inputs.block_size
    row = step.hot_table[q] if 0 <= q < len(step.hot_table) else []
    column = slot // block
    base = row[column] if 0 <= column < len(row) else -1
    return base * block + slot % block


def _publish(step: _Step, r: int, c: int, x: int) -> None:
    inputs = step.inputs
    step.hot_out[r, c] = x
    block = inputs.block_size
    step.attention_out[r, c] = -1 if x < 0 else (x // block) * inputs.attention_block_stride + x % block


def publish_padding(step: _Step, run: _Run) -> None:
    """A run without a state row: -1 indices, 0 counts, nothing else (``hisparse_kernels.cu:393-411``)."""
    for r in range(run.first, run.end):
        for c in range(step.inputs.top_k):
            _publish(step, r, c, -1)
        step.valid_out[r,] = 0
        step.swap_count[r,] = 0


def classify_slots(step: _Step, run: _Run) -> tuple[list[int], list[int], dict[int, tuple[str, int]]]:
    """Phase 3: hit slots and evictable entries in LRU order (``hisparse_kernels.cu:574-669``).

    Hits are found by scanning every slot ``0 <= slot < H`` of ``DGI[s]`` in slot order, whatever the LRU holds
    (cu:574-609, the tag at cu:603): a slot holding a union row serves it, so a slot the LRU lost still serves
    hits. A union row held by two slots takes the later one in slot order (decision D3; a race in vLLM). The LRU
    walk then only sorts its entries (cu:612-669, the test at cu:630-632): an in-range entry whose slot holds a
    union row is a hit (a duplicate entry is a hit twice), every other entry (out-of-range values included)
    is evictable.
    """
    hot_size = step.inputs.hot_size
    dgi = step.dgi[run.state]
    entry: dict[int, tuple[str, int]] = {}
    held: set[int] = set()
    for slot in range(hot_size):
        key = dgi[slot]
        if key >= 0 and key in run.union:
            entry[key] = (_HIT, slot)
            held.add(slot)
    hits: list[int] = []
    evictables: list[int] = []
    for slot in step.lru[run.state]:
        (hits if slot in held else evictables).append(slot)
    return hits, evictables, entry


def victims(hits: list[int], evictables: list[int]) -> list[int]:
    """The victim of miss ``m`` is ``victims[m]``: the evictables in LRU order, then the hits from the most
    recently used end. vLLM compacts hits forward and evictables backward into one ``H``-entry array and reads
    miss ``m``'s victim at ``H - 1 - m`` (``hisparse_kernels.cu:660-668, 733``), so misses past the evictables
    (only a corrupted state leaves too few) take hit slots (decision D5); ``m < max_union_rows <= H``."""
    return evictables + hits[::-1]


def assign_misses(step: _Step, run: _Run, hits: list[int], evictables: list[int],
                  entry: dict[int, tuple[str, int]]) -> int:
    """Phase 4: misses in first-reference order take ``victims(hits, evictables)[m]``; the swap plan fills the
    run's flat segments from ``first * top_k`` (``hisparse_kernels.cu:677-786``). An out-of-range victim trips
    the corruption tripwire (cu:735-744): the entry is invalid, its swap row -1, the DGI unwritten. A victim
    named twice (a duplicated LRU entry) ends holding the later miss (cu:754 races within a warp; decision D9).

    Returns:
        ``M``, the misses including invalid ones.
    """
    inputs = step.inputs
    order = victims(hits, evictables)
    m = 0
    for g in sorted(run.union, key=run.union.__getitem__):
        if g in entry:
            continue
        slot = order[m]
        j = run.first * inputs.top_k + m
        step.swap_host[j,] = g
        if 0 <= slot < inputs.hot_size:
            entry[g] = (_MISS, slot)
            step.swap_device[j,] = _physical(step, run.request, slot)
            step.dgi[run.state][slot] = g
        else:
            entry[g] = (_INVALID, slot)
            step.swap_device[j,] = -1
        m += 1
    return m


def publish_indices(step: _Step, run: _Run, entry: dict[int, tuple[str, int]] | None) -> None:
    """Phase 5: every position's hot and attention index, ``valid_counts``, and the stats tally (phase 6):
    a miss counts once at its first reference; every other reference to a served entry is a hit; resident and
    invalid references are not counted (``hisparse_kernels.cu:268-300, 787-821``)."""
    top_k = step.inputs.top_k
    for r in range(run.first, run.end):
        row = run.positions[r - run.first]
        for c, (g, resident) in enumerate(row):
            if resident >= 0:
                _publish(step, r, c, resident)
            elif g < 0 or entry is None:
                _publish(step, r, c, -1)
            else:
                kind, slot = entry[g]
                if kind == _INVALID:
                    _publish(step, r, c, -1)
                    continue
                _publish(step, r, c, _physical(step, run.request, slot))
                if kind == _MISS and run.union[g] == (r - run.first) * top_k + c:
                    step.misses += 1
                else:
                    step.hits += 1
        step.valid_out[r,] = sum(1 for g, resident in row if resident >= 0 or g >= 0)


def publish_swap_counts(step: _Step, run: _Run, misses: int) -> None:
    """``swap_counts[first + j] = clamp(M - j * top_k, 0, top_k)`` (``hisparse_kernels.cu:778-786``)."""
    top_k = step.inputs.top_k
    for r in range(run.first, run.end):
        step.swap_count[r,] = min(max(misses - (r - run.first) * top_k, 0), top_k)


def reorder_lru(step: _Step, run: _Run, hits: list[int], evictables: list[int], misses: int) -> None:
    """Phase 7 (``hisparse_kernels.cu:823-835``): with ``V = victims(hits, evictables)`` and ``E`` evictables,
    ``V[M:E] + V[:M] + hits`` (that is ``evictables[M:] + evictables[:M] + hits``) when ``M <= E``, else
    ``V[M - E:M] + hits``: the kernel's index arithmetic when misses took hit slots (decision D5)."""
    order, kept = victims(hits, evictables), len(evictables)
    front = order[misses:kept] + order[:misses] if misses <= kept else order[misses - kept:misses]
    step.lru[run.state] = front + hits


def store(step: _Step) -> None:
    """Write every output, the state and the stats back (stats wrap modulo 2**64, decision D6)."""
    inputs = step.inputs
    for output in (step.hot_out, step.attention_out, step.valid_out, step.swap_host, step.swap_device,
                   step.swap_count):
        output.store()
    inputs.device_global_indices.copy_(torch.tensor(step.dgi, dtype=torch.int32))
    inputs.lru_slots.copy_(torch.tensor(step.lru, dtype=torch.int16))
    if inputs.stats is not None:
        raw = inputs.stats.view(torch.int64)
        totals = [v % _U64 for v in raw.tolist()]
        updated = [(totals[0] + step.hits) % _U64, (totals[1] + step.misses) % _U64]
        raw.copy_(torch.tensor([v - _U64 if v >= 1 << 63 else v for v in updated]))


def resolve(inputs: ResolveInputs) -> None:
    """``hisparse_resolve_residency`` on checked inputs, phase by phase (docs/design/cache-ops.md).

    Raises:
        UnionOverflowError: before anything is written.
    """
    if inputs.empty:
        return
    step = _Step(inputs)
    runs = classify_rows(step)
    for run in runs:
        if run.state >= 0:
            translate(step, run)
    check_union(step, runs)
    for run in runs:
        if run.state < 0:
            publish_padding(step, run)
            continue
        if not run.union:  # no host-backed position: indices only (hisparse_kernels.cu:513-521)
            publish_indices(step, run, None)
            publish_swap_counts(step, run, 0)
            continue
        hits, evictables, entry = classify_slots(step, run)
        misses = assign_misses(step, run, hits, evictables, entry)
        publish_indices(step, run, entry)
        publish_swap_counts(step, run, misses)
        reorder_lru(step, run, hits, evictables, misses)
    store(step)


# ------------------------------------------------------------------------------------------------- gathers
def gather(inputs: GatherInputs) -> None:
    """``hisparse_gather_plan`` / ``hisparse_gather_compact`` on checked inputs, entry by entry in (row, column)
    order: skip ``g < 0`` and destinations outside the hot cache, copy ``g < host_rows``, zero-fill otherwise
    (``hisparse_kernels.cu:841-895``). A destination named twice ends with the later entry (decision D7)."""
    if inputs.empty:
        return
    host = inputs.host_cache.view(torch.uint8)
    hot = inputs.hot_cache.view(torch.uint8)
    block = inputs.block_size
    sources, targets = inputs.global_indices.tolist(), inputs.hot_indices.tolist()
    if inputs.compact:
        counts = inputs.selector.reshape(-1)[:inputs.num_rows].tolist()
        chosen = [[c < min(max(counts[r], 0), inputs.columns) for c in range(inputs.columns)]
                  for r in range(inputs.num_rows)]
    else:
        chosen = [[m != 0 for m in row] for row in inputs.selector.tolist()]
    for r in range(inputs.num_rows):
        for c in range(inputs.columns):
            g, d = sources[r][c], targets[r][c]
            if not chosen[r][c] or g < 0 or not 0 <= d < inputs.hot_rows:
                continue
            target = hot[d // block, d % block]
            if g < inputs.host_rows:
                target.copy_(host[g])
            else:  # no source row: zeros, never stale bytes
                target.zero_()


# -------------------------------------------------------------------------------------------- invalidation
def resolve_tables(inputs: InvalidateInputs) -> list[torch.Tensor]:
    """The table each address names, in pointer order (duplicates kept: clearing twice is idempotent).

    Raises:
        UnknownTableError: an address is not a registered table of shape ``[num_state_rows, region_stride]``.
    """
    by_address = dict(zip(inputs.addresses, inputs.tables, strict=True))
    named = []
    for index, address in enumerate(inputs.device_global_indices_ptrs.tolist()):
        table = by_address.get(address)
        if table is None:
            raise UnknownTableError(address, index, f"is no registered [{inputs.num_state_rows}, "
                                    f"{inputs.region_stride}] int32 device_global_indices table on {inputs.device}")
        named.append(table)
    return named


def invalidate(inputs: InvalidateInputs) -> None:
    """``hisparse_invalidate_written_slots`` on checked inputs (``hisparse_kernels.cu:896-1012``): for every
    named table and every token with a request in range, a state row in ``[0, num_state_rows)`` and a slot in
    ``[0, INT32_MAX]``, every entry of ``table[state]`` equal to the slot becomes -1.

    Raises:
        UnknownTableError: before anything is written.
    """
    named = resolve_tables(inputs)
    if inputs.empty:
        return
    states = inputs.request_state_indices.tolist()
    wanted = []
    for q, w in zip(inputs.req_id_per_token.tolist(), inputs.written_slots.tolist(), strict=True):
        if not 0 <= q < len(states) or not 0 <= w <= _INT32_MAX:
            continue
        s = states[q]
        if 0 <= s < inputs.num_state_rows:
            wanted.append((s, w))
    for table in {t.data_ptr(): t for t in named}.values():
        values = table.tolist()
        for s, w in wanted:
            values[s] = [-1 if x == w else x for x in values[s]]
        table.copy_(torch.tensor(values, dtype=torch.int32))


_OPS = vllm_ops(resolve, gather, invalidate)
resolve_residency = _OPS.resolve_residency
gather_compact = _OPS.gather_compact
gather_plan = _OPS.gather_plan
invalidate_written_slots = _OPS.invalidate_written_slots
