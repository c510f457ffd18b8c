"""Multi-step decode sequences for differential tests of the vLLM 0.34.0 cache ops, and a runner recording outputs.

Invariant: a sequence is fully determined by its seed and shape (``build_sequence``), every step has the same
tensor shapes (so a captured graph can replay it), and ``run_sequence`` gives every implementation identical,
poisoned inputs, so two implementations agree iff their recorded ``StepRecord`` lists are equal.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

__all__ = [
    "POISON",
    "SHAPES",
    "CacheOpsLike",
    "DecodeSequence",
    "DecodeStep",
    "SequenceRun",
    "SequenceShape",
    "StateEdit",
    "StepRecord",
    "StepTensors",
    "OTHER_GROUPS",
    "build_sequence",
    "decode_sequences",
    "run_sequence",
]

#: Value every output is filled with before a call, so "not written" can be asserted.
POISON = -7777
_I32 = torch.int32


@dataclasses.dataclass(frozen=True)
class SequenceShape:
    """Sizes of one generated sequence. ``hot_size`` defaults to ``(queries + 1) * top_k`` as in vLLM."""

    top_k: int = 3
    block_size: int = 4
    queries: int = 2
    requests: int = 2
    batch_rows: int = 6
    steps: int = 3
    row_width: int = 16
    dtype: torch.dtype = torch.uint8
    hot_size: int | None = None
    block_gap: int = 1  # extra rows between hot blocks (a layer-interleaved slab: non-contiguous block stride)
    output_gap: int = 2  # extra columns/elements per row of attention_indices and valid_counts (row-strided)

    @property
    def slots(self) -> int:
        return self.hot_size if self.hot_size is not None else (self.queries + 1) * self.top_k


#: Small shapes straddling the corner cases (top-k 1, block size 1, MTP runs, H == Q*K, 2-byte rows).
SHAPES: tuple[SequenceShape, ...] = (
    SequenceShape(),
    SequenceShape(top_k=1, block_size=1, queries=1, requests=3, batch_rows=4, steps=4),
    SequenceShape(top_k=4, block_size=2, queries=3, requests=2, batch_rows=7, steps=3, row_width=8,
                  dtype=torch.int16),
    SequenceShape(top_k=5, block_size=4, queries=1, requests=3, batch_rows=4, steps=4),
    SequenceShape(top_k=3, block_size=4, queries=2, requests=1, batch_rows=3, steps=5, hot_size=6),
    SequenceShape(top_k=8, block_size=4, queries=2, requests=2, batch_rows=5, steps=3, row_width=32),
    SequenceShape(top_k=4, block_size=4, queries=4, requests=3, batch_rows=12, steps=4, block_gap=0,
                  output_gap=0),
)


#: A corruption of the persistent state applied before a step's resolve, in order: ``("lru_copy", s, i, j)``
#: sets ``LRU[s][i] = LRU[s][j]`` (slot ``LRU[s][i]`` is lost, ``LRU[s][j]`` named twice), ``("lru_set", s, i, v)``
#: sets ``LRU[s][i] = v`` (an out-of-range value), ``("dgi_copy", s, i, j)`` sets ``DGI[s][i] = DGI[s][j]`` (a row
#: held by two slots).
StateEdit = tuple[str, int, int, int]


@dataclasses.dataclass
class DecodeStep:
    """Inputs of one step (plain lists; ``run_sequence`` turns them into tensors).

    Rows at or past ``num_valid_rows`` are graph padding: their ``request_ids`` hold stale ids (0, as vLLM's
    padded ``req_id_per_token``, or others), which the op must ignore. ``request_state_indices`` is -1 on
    unused request rows. The hot and source tables are indexed by batch request row ``q``, the resident table
    by **state** row. ``host_writes`` are host rows rewritten after the step (the mirror);
    ``written_tokens``/``written_slots`` are what invalidation is called with.
    """

    global_indices: list[list[int]]
    request_ids: list[int]
    request_state_indices: list[int]
    hot_block_table: list[list[int]]
    source_block_table: list[list[int]]
    resident_block_table: list[list[int]] | None
    max_union_rows: int
    host_writes: list[int]
    written_tokens: list[int]
    written_slots: list[int]
    plan_rows: list[int]
    plan_mask: list[int]
    plan_targets: list[int]
    num_valid_rows: int
    state_edits: list[StateEdit] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class DecodeSequence:
    """A generated multi-step decode: geometry, initial state and steps. ``seed`` rebuilds it exactly."""

    seed: int
    shape: SequenceShape
    host_rows: int
    hot_blocks: int
    num_states: int
    initial_lru: list[list[int]]
    initial_stats: list[int]
    steps: list[DecodeStep]

    @property
    def top_k(self) -> int:
        return self.shape.top_k


class CacheOpsLike(Protocol):
    """The four ops (a module such as ``oracle`` or a backend's ``CacheOps``)."""

    # Read-only, so a backend's CacheOps (methods) matches as well as a module (functions).
    @property
    def resolve_residency(self) -> Callable[..., None]: ...
    @property
    def gather_compact(self) -> Callable[..., None]: ...
    @property
    def gather_plan(self) -> Callable[..., None]: ...
    @property
    def invalidate_written_slots(self) -> Callable[..., None]: ...


def _host_bytes(seed: int, rows: Sequence[int], row_bytes: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (len(rows), row_bytes), dtype=torch.uint8, generator=generator)


def _without_repeats(values: list[int]) -> list[int]:
    """``values`` with every repeat of a non-negative value replaced by -1."""
    seen: set[int] = set()
    kept = []
    for value in values:
        kept.append(-1 if value >= 0 and value in seen else value)
        seen.add(value)
    return kept


@dataclasses.dataclass
class _Requests:
    """What persists across one sequence's steps: geometry, each request's state row, hot and source blocks and
    length, and the table shapes every step shares."""

    shape: SequenceShape
    num_states: int
    pages: int
    host_rows: int
    states: list[int]
    hot_per_request: int
    hot_of: list[list[int]]
    resident_base: int
    hot_blocks: int
    source_of: list[list[int]]
    length: list[int]


def build_sequence(seed: int, shape: SequenceShape = SHAPES[0], corrupt_state: bool = False) -> DecodeSequence:
    """Build one decode sequence from ``seed``: requests with persistent state and hot rows, drifting top-k.

    Each step permutes the requests over the batch rows (so batch row != state row), gives each 1..Q rows
    (speculative verification rows share their request's union), fills the rest with graph padding past
    ``num_valid_rows`` (stale request ids), sometimes marks a request row inactive (state -1) or, rarely, gives
    two request rows one state row (the later run is padding, decision D1). Top-k mixes recent and old
    tokens, -1, positions past the source table, cross-row duplicates, rarely in-row duplicates and rows of
    host block 0 or past the host cache. Resident pages (by state row), a too-small ``max_union_rows`` (every
    implementation must raise before writing), a corrupted LRU entry and counters near 2**64 appear with small
    probability.

    ``corrupt_state`` adds :data:`StateEdit` lists to the steps after the first, when slots hold rows: the LRU
    loses slots and names others twice (sometimes many times, so misses outnumber the evictables, decision D5),
    takes out-of-range values, and the DGI holds a row in two slots (D3). Those draws follow all the others, so
    the sequence is otherwise the one ``corrupt_state=False`` builds from the same seed.
    """
    rng = random.Random(seed)
    world = _requests(rng, shape)
    slots = shape.slots
    initial_lru = [rng.sample(range(slots), slots) if rng.random() < 0.5 else list(range(slots))
                   for _ in range(world.num_states)]
    if rng.random() < 0.1:
        initial_lru[rng.choice(world.states)][rng.randrange(slots)] = rng.choice((-1, slots, 32767))
    initial_stats = [0, 0] if rng.random() < 0.8 else [2**64 - 2, 2**64 - 1]
    steps = [_step(rng, world) for _ in range(shape.steps)]
    if corrupt_state:
        for step in steps[1:]:
            step.state_edits = _state_edits(rng, world)
    return DecodeSequence(seed, shape, world.host_rows, world.hot_blocks, world.num_states, initial_lru, initial_stats,
                          steps)


def _state_edits(rng: random.Random, world: _Requests) -> list[StateEdit]:
    """A step's corruptions of the requests' state rows (none in 3 steps of 10); see :data:`StateEdit`."""
    edits: list[StateEdit] = []
    if rng.random() < 0.3:
        return edits
    slots = world.shape.slots
    for _ in range(rng.randint(1, 3)):
        s = rng.choice(world.states)
        kind = rng.random()
        if kind < 0.4:  # one slot lost, another named twice
            edits.append(("lru_copy", s, rng.randrange(slots), rng.randrange(slots)))
        elif kind < 0.55:  # one LRU entry repeated over many: more hit entries than union rows (D5)
            j = rng.randrange(slots)
            edits.extend(("lru_copy", s, i, j) for i in rng.sample(range(slots), rng.randint(2, slots)))
        elif kind < 0.75:
            edits.append(("lru_set", s, rng.randrange(slots), rng.choice((-1, -32768, slots, 32767))))
        else:  # one row in two slots (D3)
            edits.append(("dgi_copy", s, rng.randrange(slots), rng.randrange(slots)))
    return edits


def _requests(rng: random.Random, shape: SequenceShape) -> _Requests:
    """The requests' state rows, hot blocks, source pages (5% missing) and starting lengths."""
    k, block, q_max, slots, requests = shape.top_k, shape.block_size, shape.queries, shape.slots, shape.requests
    num_states = requests + 2
    pages = 4 + (q_max * shape.steps + k) // block + 2
    host_blocks = 1 + requests * pages + 2
    host_rows = host_blocks * block - rng.choice((0, 0, block // 2 + 1))  # sometimes a partial last block
    states = rng.sample(range(num_states), requests)
    hot_per_request = -(-slots // block)
    hot_ids = list(range(1, 1 + requests * hot_per_request))
    rng.shuffle(hot_ids)
    hot_of = [hot_ids[i * hot_per_request:(i + 1) * hot_per_request] for i in range(requests)]
    resident_base = 1 + requests * hot_per_request
    free_host = list(range(1, host_blocks + 1))  # block host_blocks lies past the host cache
    rng.shuffle(free_host)
    source_of = [[free_host.pop() if rng.random() > 0.05 else 0 for _ in range(pages)] for _ in range(requests)]
    length = [rng.randint(1, 3 * block) for _ in range(requests)]
    return _Requests(shape, num_states, pages, host_rows, states, hot_per_request, hot_of, resident_base,
                     resident_base + requests * 2 + 1, source_of, length)


def _step(rng: random.Random, world: _Requests) -> DecodeStep:
    """One decode step: the batch, its top-k rows and padding, the host writes and a gather plan."""
    shape = world.shape
    union_cap = shape.queries * shape.top_k if rng.random() < 0.9 else rng.randint(1, shape.queries * shape.top_k)
    order, rows_of = _batch(rng, world)
    topk, ids, rsi, hot_table, src_table, resident = _top_k_rows(rng, world, order, rows_of)
    valid = len(topk)
    while len(topk) < shape.batch_rows:  # graph padding: stale ids, masked by num_valid_rows
        topk.append([rng.choice((-1, 0, 1)) for _ in range(shape.top_k)])
        ids.append(rng.choice((0, 0, -1, len(order) - 1 if order else 0)))
    silent = _silent_runs(rng, rsi, len(order))
    writes, tokens, slots_written = _host_writes(rng, world, order, rows_of, silent)
    plan_rows, plan_mask, plan_targets = _gather_plan(rng, world)
    keep_resident = rng.random() < 0.8
    return DecodeStep(
        global_indices=topk, request_ids=ids, request_state_indices=rsi, hot_block_table=hot_table,
        source_block_table=src_table, resident_block_table=resident if keep_resident else None,
        max_union_rows=union_cap, host_writes=writes, written_tokens=tokens, written_slots=slots_written,
        plan_rows=plan_rows, plan_mask=plan_mask, plan_targets=plan_targets, num_valid_rows=valid,
    )


def _batch(rng: random.Random, world: _Requests) -> tuple[list[int], dict[int, int]]:
    """The requests in batch order (so batch row != state row) and 1..Q rows each, within the batch rows."""
    requests = world.shape.requests
    order = rng.sample(range(requests), requests)
    rows_of = {i: rng.randint(1, world.shape.queries) for i in order}
    while sum(rows_of.values()) > world.shape.batch_rows:
        i = max(rows_of, key=rows_of.__getitem__)
        rows_of[i] -= 1
        if rows_of[i] == 0:
            del rows_of[i]
            order.remove(i)
    return order, rows_of


def _top_k_rows(rng: random.Random, world: _Requests, order: list[int], rows_of: dict[int, int]) -> tuple[
        list[list[int]], list[int], list[int], list[list[int]], list[list[int]], list[list[int]]]:
    """Each request's run of top-k rows, with its state row (8% inactive), tables and sometimes a resident page:
    ``(topk, request_ids, request_state_indices, hot_table, source_table, resident_table)``."""
    k, block, n, pages = world.shape.top_k, world.shape.block_size, world.shape.batch_rows, world.pages
    topk: list[list[int]] = []
    ids: list[int] = []
    rsi = [-1] * n
    hot_table = [[0] * world.hot_per_request for _ in range(n)]
    src_table = [[0] * pages for _ in range(n)]
    resident = [[0] * pages for _ in range(world.num_states)]
    for q, i in enumerate(order):
        rsi[q] = world.states[i] if rng.random() > 0.08 else -1
        hot_table[q] = list(world.hot_of[i])
        src_table[q] = list(world.source_of[i])
        if rng.random() < 0.3:  # the request's last page is resident, looked up by its state row
            page = max(world.length[i] - 1, 0) // block
            resident[world.states[i]][page] = world.resident_base + 2 * i + rng.randint(0, 1)
        pool = list(range(world.length[i])) + [-1, pages * block + 1]
        for _ in range(rows_of[i]):
            limit = min(k, len(pool))
            values = rng.sample(pool, limit) + [-1] * (k - limit)
            if topk and ids and ids[-1] == q and rng.random() < 0.5:  # MTP rows share most of the union
                shared = rng.randint(0, k)
                values[:shared] = topk[-1][:shared]
                values = _without_repeats(values)
            if rng.random() < 0.05 and k > 1:  # an in-row duplicate (decision D4: one entry)
                values[-1] = values[0]
            rng.shuffle(values)
            topk.append(values)
            ids.append(q)
    return topk, ids, rsi, hot_table, src_table, resident


def _silent_runs(rng: random.Random, rsi: list[int], runs: int) -> set[int]:
    """Runs that write no tokens: inactive ones and, rarely, a later run given an earlier one's state row (D1)."""
    silent = {q for q in range(runs) if rsi[q] < 0}
    live = [q for q in range(runs) if rsi[q] >= 0]
    if len(live) >= 2 and rng.random() < 0.05:  # two runs on one state row: the later one is padded (D1)
        first, later = sorted(rng.sample(live, 2))
        rsi[later] = rsi[first]
        silent.add(later)
    return silent


def _host_writes(rng: random.Random, world: _Requests, order: list[int], rows_of: dict[int, int],
                 silent: set[int]) -> tuple[list[int], list[int], list[int]]:
    """The host mirror of the step's new tokens (and rewrites of older ones), then the invalidation list with
    noise entries that must change nothing: ``(host_writes, written_tokens, written_slots)``."""
    block, host_rows = world.shape.block_size, world.host_rows
    writes, tokens, slots_written = [], [], []
    for q, i in enumerate(order):
        if q in silent:  # an inactive (or padded) request writes no tokens
            continue
        for _ in range(rows_of[i]):
            t = world.length[i]
            world.length[i] += 1
            page, offset = divmod(t, block)
            host_block = world.source_of[i][page] if page < world.pages else 0
            g = host_block * block + offset if host_block > 0 else -1
            if 0 <= g < host_rows:
                writes.append(g)
            tokens.append(q)
            slots_written.append(g)
        if rng.random() < 0.3 and world.length[i] > 1:  # a rewrite of an older row (rejected speculation)
            t = rng.randrange(world.length[i])
            host_block = world.source_of[i][t // block]
            if host_block > 0 and host_block * block + t % block < host_rows:
                g = host_block * block + t % block
                writes.append(g)
                tokens.append(q)
                slots_written.append(g)
    tokens.append(rng.choice((-1, world.shape.batch_rows + 3)))
    slots_written.append(rng.randrange(host_rows))
    if tokens and rng.random() < 0.2:  # a slot past int32: matches nothing
        tokens.append(tokens[0])
        slots_written.append(2**32 + rng.randrange(host_rows))
    return writes, tokens, slots_written


def _gather_plan(rng: random.Random, world: _Requests) -> tuple[list[int], list[int], list[int]]:
    """A gather_plan call's rows, mask and targets (a fifth of the targets out of place or out of range)."""
    k, block, host_rows = world.shape.top_k, world.shape.block_size, world.host_rows
    plan_rows = [rng.randrange(-1, host_rows + 2) for _ in range(k)]
    plan_mask = [rng.randint(0, 1) for _ in range(k)]
    staging_rows = -(-k // block) * block
    plan_targets = [rng.randrange(-1, staging_rows + 1) if rng.random() < 0.2 else c for c in range(k)]
    return plan_rows, plan_mask, plan_targets


def decode_sequences(shapes: Sequence[SequenceShape] = SHAPES, corrupt_state: bool = False) -> Any:
    """A hypothesis strategy of :class:`DecodeSequence` (seed and shape drawn; shrinks toward seed 0)."""
    from hypothesis import strategies as st

    return st.builds(build_sequence, st.integers(0, 2**32 - 1), st.sampled_from(list(shapes)), st.just(corrupt_state))


@dataclasses.dataclass
class StepTensors:
    """The tensors one step's resolve call received (after the call: its outputs and state).

    ``attention_indices`` and ``valid_counts`` are row-strided views (``output_gap`` extra elements per row), as
    vLLM's own tests pass them.
    """

    hot_indices: torch.Tensor
    attention_indices: torch.Tensor
    valid_counts: torch.Tensor
    swap_host: torch.Tensor
    swap_device: torch.Tensor
    swap_counts: torch.Tensor
    global_indices: torch.Tensor
    request_ids: torch.Tensor
    request_state_indices: torch.Tensor
    hot_block_table: torch.Tensor
    source_block_table: torch.Tensor
    resident_block_table: torch.Tensor | None
    num_valid_rows: torch.Tensor


@dataclasses.dataclass
class StepRecord:
    """Everything one step produced, as plain values (compare two implementations with ``==``).

    ``error`` is the resolve call's typed error (``"UnionOverflowError: ..."``) or None; after an error the
    outputs must still be poison and the state unchanged.
    """

    outputs: dict[str, list[Any]]
    dgi: list[list[int]]
    lru: list[list[int]]
    stats: list[int]
    error: str | None
    hot_bytes: list[list[int]]
    staging_bytes: list[list[int]]
    tables_after_invalidate: list[list[list[int]]]


#: Tables of other index groups (same shape as the sequence's own) that invalidation also reaches.
OTHER_GROUPS = 1


class SequenceRun:
    """The live tensors of one sequence on one device: host and hot caches, state, counters, other groups'
    tables (all registered with :mod:`hisparse_hal.cache_ops.tables`)."""

    def __init__(self, sequence: DecodeSequence, device: torch.device | str = "cpu",
                 host_device: torch.device | str | None = None) -> None:
        from hisparse_hal.cache_ops import tables

        shape = sequence.shape
        self.sequence = sequence
        self.device = torch.device(device)
        self.host_device = torch.device(host_device) if host_device is not None else self.device
        width = shape.row_width
        row_bytes = width * torch.empty((), dtype=shape.dtype).element_size()
        host = _host_bytes(sequence.seed, range(sequence.host_rows), row_bytes)
        self.host = host.view(shape.dtype).to(self.host_device)
        generator = torch.Generator().manual_seed(sequence.seed + 1)
        slab = torch.randint(0, 256, (sequence.hot_blocks, shape.block_size + shape.block_gap, row_bytes),
                             dtype=torch.uint8, generator=generator)
        self.slab = slab.view(shape.dtype).to(self.device)
        self.hot = self.slab[:, :shape.block_size]  # block stride > block_size * row: not contiguous
        staging_blocks = -(-shape.top_k // shape.block_size)
        self.staging = torch.zeros(staging_blocks, shape.block_size, width, dtype=shape.dtype, device=self.device)
        self.dgi = torch.full((sequence.num_states, shape.slots), -1, dtype=_I32, device=self.device)
        others = torch.Generator().manual_seed(sequence.seed + 2)
        self.other_tables = [
            torch.randint(-1, sequence.host_rows, (sequence.num_states, shape.slots), dtype=_I32,
                          generator=others).to(self.device)
            for _ in range(OTHER_GROUPS)
        ]
        for table in (self.dgi, *self.other_tables):
            tables.register_table(table)
        # Duplicate addresses: a KV-sharing reader aliases its owner's table (runtime.py:733-738).
        addresses = [self.dgi.data_ptr(), *(t.data_ptr() for t in self.other_tables), self.dgi.data_ptr()]
        self.table_pointers = torch.tensor(addresses, dtype=torch.int64, device=self.device)
        self.lru = torch.tensor(sequence.initial_lru, dtype=torch.int16, device=self.device)
        signed = [v - 2**64 if v >= 2**63 else v for v in sequence.initial_stats]
        self.stats = torch.tensor(signed, dtype=torch.int64).view(torch.uint64).to(self.device)

    def tensors(self, step: DecodeStep) -> StepTensors:
        """Fresh input tensors of ``step`` and poisoned outputs (two of them row-strided)."""
        n, k = len(step.global_indices), self.sequence.top_k
        gap = self.sequence.shape.output_gap

        def t(values: Any) -> torch.Tensor:
            return torch.tensor(values, dtype=_I32, device=self.device)

        def poison(*size: int) -> torch.Tensor:
            return torch.full(size, POISON, dtype=_I32, device=self.device)

        resident = step.resident_block_table
        return StepTensors(
            hot_indices=poison(n, k), attention_indices=poison(n, k + gap)[:, :k],
            valid_counts=poison(n, 1 + gap)[:, 0], swap_host=poison(n, k), swap_device=poison(n, k),
            swap_counts=poison(n), global_indices=t(step.global_indices), request_ids=t(step.request_ids),
            request_state_indices=t(step.request_state_indices), hot_block_table=t(step.hot_block_table),
            source_block_table=t(step.source_block_table),
            resident_block_table=t(resident) if resident is not None else None,
            num_valid_rows=t([step.num_valid_rows]),
        )

    def attention_block_stride(self) -> int:
        return self.sequence.shape.block_size + self.sequence.shape.block_gap

    def corrupt(self, step: DecodeStep) -> None:
        """Apply the step's :data:`StateEdit` list to the live LRU and DGI, in order."""
        for kind, s, i, arg in step.state_edits:
            if kind == "lru_copy":
                self.lru[s, i] = self.lru[s, arg]
            elif kind == "lru_set":
                self.lru[s, i] = arg
            else:
                self.dgi[s, i] = self.dgi[s, arg]

    def resolve(self, ops: CacheOpsLike, step: DecodeStep, io: StepTensors) -> None:
        """One resolve call with vLLM 0.34.0's 23 positional arguments."""
        block = self.sequence.shape.block_size
        ops.resolve_residency(
            self.host, self.hot, io.hot_block_table, io.global_indices, io.hot_indices, self.dgi, self.lru,
            io.request_state_indices, self.sequence.shape.slots, step.max_union_rows, self.stats,
            io.attention_indices, self.attention_block_stride(), io.request_ids, io.source_block_table, block,
            io.valid_counts, io.swap_host, io.swap_device, io.swap_counts, io.resident_block_table,
            block if io.resident_block_table is not None else 0, io.num_valid_rows,
        )

    def gather(self, ops: CacheOpsLike, io: StepTensors) -> None:
        ops.gather_compact(self.host, self.hot, io.swap_host, io.swap_device, io.swap_counts)

    def mirror_and_invalidate(self, ops: CacheOpsLike, step: DecodeStep, index: int) -> None:
        """Rewrite this step's host rows (new bytes from the seed), then invalidate their hot copies in every
        group's table through the pointer tensor (with a duplicate address)."""
        if step.host_writes:
            fresh = _host_bytes(self.sequence.seed * 1000 + index + 7, step.host_writes, self.host_row_bytes())
            rows = torch.tensor(step.host_writes, dtype=torch.int64, device=self.host_device)
            self.host.view(torch.uint8)[rows] = fresh.to(self.host_device)
        ops.invalidate_written_slots(
            self.table_pointers, torch.tensor(step.request_state_indices, dtype=_I32, device=self.device),
            torch.tensor(step.written_tokens, dtype=_I32, device=self.device),
            torch.tensor(step.written_slots, dtype=torch.int64, device=self.device),
            self.sequence.num_states, self.sequence.shape.slots,
        )

    def host_row_bytes(self) -> int:
        return self.host.view(torch.uint8).shape[1]

    def plan(self, ops: CacheOpsLike, step: DecodeStep) -> None:
        """A prefill-style single-row plan into a 3-D staging buffer (vLLM passes ``[1, N]`` plans)."""
        ops.gather_plan(
            self.host, self.staging, torch.tensor([step.plan_rows], dtype=_I32, device=self.device),
            torch.tensor([step.plan_targets], dtype=_I32, device=self.device),
            torch.tensor([step.plan_mask], dtype=_I32, device=self.device),
        )


def run_sequence(ops: CacheOpsLike, sequence: DecodeSequence, device: torch.device | str = "cpu",
                 check: Callable[[SequenceRun, DecodeStep, StepTensors], None] | None = None,
                 host_device: torch.device | str | None = None, run: SequenceRun | None = None) -> list[StepRecord]:
    """Drive ``ops`` through ``sequence`` as vLLM's runtime does, recording every output after every step.

    ``host_device`` holds the host cache (default: ``device``; a backend's ``CacheOps`` wants it on CPU).
    ``run`` reuses prepared live tensors (e.g. with a pinned host cache) instead of building them.
    Per step: the step's state corruptions (``DecodeStep.state_edits``), resolve (poisoned outputs; a typed
    ``UnionOverflowError`` is recorded and the gather skipped) -> gather_compact -> ``check`` (if given) ->
    gather_plan into a staging buffer -> host mirror writes -> invalidate_written_slots.

    Returns:
        One :class:`StepRecord` per step.
    """
    from hisparse_hal.errors import UnionOverflowError

    run = run if run is not None else SequenceRun(sequence, device, host_device)
    records: list[StepRecord] = []
    for index, step in enumerate(sequence.steps):
        run.corrupt(step)
        io = run.tensors(step)
        error = None
        try:
            run.resolve(ops, step, io)
        except UnionOverflowError as exc:
            error = f"{type(exc).__name__}: {exc}"
        if error is None:
            run.gather(ops, io)
            if check is not None:
                check(run, step, io)
        outputs = {name: getattr(io, name).tolist() for name in (
            "hot_indices", "attention_indices", "valid_counts", "swap_host", "swap_device", "swap_counts")}
        dgi, lru = run.dgi.tolist(), run.lru.tolist()
        stats = run.stats.view(torch.int64).tolist()
        hot_bytes = run.slab.view(torch.uint8).flatten(0, 1).tolist()
        run.plan(ops, step)
        staging = run.staging.view(torch.uint8).flatten(0, 1).tolist()
        run.mirror_and_invalidate(ops, step, index)
        tables_after = [t.tolist() for t in (run.dgi, *run.other_tables)]
        records.append(StepRecord(outputs, dgi, lru, stats, error, hot_bytes, staging, tables_after))
    return records
