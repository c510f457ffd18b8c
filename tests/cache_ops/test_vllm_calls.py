"""The cache ops called exactly as vLLM 0.34.0's HiSparse runtime calls them, through ``create_cache_ops(runtime)``.

The runtime stand-in holds what a 0.34.0 ``HiSparseRuntime`` holds when ``create_cache_ops`` runs (design note
§2 B8: ``index_group.device_global_indices``, ``region_stride``, ``max_union_rows``); the tensors are laid out
as ``runtime.py`` lays them out (a hot view ``as_strided`` over a multi-layer slab, row-strided
``physical_topk_indices``, ``num_valid_rows = query_start_loc[-1:]``, an int64 tensor of table addresses), and
each op is called positionally with vLLM's argument order (B9 resolve, B10 compact, B11 plan, B16 invalidate).
The CPU backend's ops must equal the oracle bit for bit, also when resolve and compact are captured and replayed.
"""

from __future__ import annotations

import copy
import inspect
import pydoc
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from hisparse_hal.cache_ops import library, oracle, signatures, tables
from hisparse_hal.errors import CacheOpArityError, InvalidArgumentError, UnknownTableError
from hisparse_hal.vendors.cpu.backend import CpuBackend

I32 = torch.int32
BLOCK, TOP_K, QUERIES = 4, 4, 2
REGION = (QUERIES + 1) * TOP_K  # device_buffer_size default
MAX_UNION = QUERIES * TOP_K
MAX_REQS, PAGES, LAYERS = 4, 8, 2
ROW_BYTES = 32


class Runtime:
    """What ``create_cache_ops`` may read from a vLLM 0.34.0 HiSparseRuntime, and the step's tensors."""

    def __init__(self, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        host_rows = (1 + MAX_REQS * PAGES) * BLOCK
        self.host_cache = torch.randint(0, 256, (host_rows, ROW_BYTES), dtype=torch.uint8, generator=gen)
        hot_blocks = MAX_REQS * (REGION // BLOCK) + 1
        # One slab holding LAYERS layers' blocks interleaved: block stride LAYERS * BLOCK * ROW_BYTES bytes.
        self.slab = torch.zeros(hot_blocks * LAYERS * BLOCK * ROW_BYTES, dtype=torch.uint8)
        self.hot = torch.as_strided(self.slab, (hot_blocks, BLOCK, ROW_BYTES), (LAYERS * BLOCK * ROW_BYTES,
                                                                               ROW_BYTES, 1), 0)
        self.attention_block_stride = LAYERS * BLOCK
        self.hot_block_table = torch.arange(1, 1 + MAX_REQS * (REGION // BLOCK), dtype=I32).view(MAX_REQS, -1)
        self.index_group = SimpleNamespace(
            device_global_indices=torch.full((MAX_REQS, REGION), -1, dtype=I32),
            lru_slots=torch.arange(REGION, dtype=torch.int16).repeat(MAX_REQS, 1),
            swap_stats=torch.zeros(2, dtype=torch.uint64),
        )
        self.region_stride, self.max_union_rows = REGION, MAX_UNION
        self.request_state_indices = torch.tensor([2, 0, 3, -1], dtype=I32)
        self.source_block_table = (1 + torch.randperm(MAX_REQS * PAGES, generator=gen).to(I32)).view(MAX_REQS, PAGES)
        self.residency = torch.zeros(MAX_REQS, PAGES, dtype=I32)
        self.residency[0, 1] = 4  # state row 0 (request 1) has page 1 resident in hot block 4

    def step_tensors(self, topk: list[list[int]], req_ids: list[int], valid: int) -> dict[str, torch.Tensor]:
        rows = len(topk)
        workspace = torch.full((rows, TOP_K + 2), -5, dtype=I32)
        return dict(
            topk=torch.tensor(topk, dtype=I32), hot_indices=torch.full((rows, TOP_K), -5, dtype=I32),
            physical=workspace[:, :TOP_K], valid_counts=torch.full((rows,), -5, dtype=I32),
            swap_host=torch.full((rows, TOP_K), -5, dtype=I32), swap_dev=torch.full((rows, TOP_K), -5, dtype=I32),
            swap_counts=torch.full((rows,), -5, dtype=I32), req_ids=torch.tensor(req_ids, dtype=I32),
            query_start_loc=torch.tensor([0, valid], dtype=I32),
        )

    def resolve(self, ops: Any, name: str, t: dict[str, torch.Tensor]) -> None:
        """``runtime.py:904-930``: 23 positional arguments."""
        group = self.index_group
        getattr(ops, name)(
            self.host_cache, self.hot, self.hot_block_table, t["topk"], t["hot_indices"],
            group.device_global_indices, group.lru_slots, self.request_state_indices, self.region_stride,
            self.max_union_rows, group.swap_stats, t["physical"], self.attention_block_stride, t["req_ids"],
            self.source_block_table, BLOCK, t["valid_counts"], t["swap_host"], t["swap_dev"], t["swap_counts"],
            self.residency, BLOCK, t["query_start_loc"][-1:],
        )

    def compact(self, ops: Any, name: str, t: dict[str, torch.Tensor]) -> None:
        """``runtime.py:935-941``, once per layer sharing the swap plan (here: the same hot view)."""
        getattr(ops, name)(self.host_cache, self.hot, t["swap_host"], t["swap_dev"], t["swap_counts"])

    def invalidate(self, ops: Any, name: str, req_ids: list[int], slots: list[int]) -> None:
        """``runtime.py:1078-1085``: one launch for every leader's table, by address."""
        table = self.index_group.device_global_indices
        pointers = torch.tensor([table.data_ptr(), table.data_ptr()], dtype=torch.int64)  # a KV-sharing alias
        getattr(ops, name)(pointers, self.request_state_indices, torch.tensor(req_ids, dtype=I32),
                           torch.tensor(slots, dtype=torch.int64), MAX_REQS, REGION)

    def snapshot(self) -> list[Any]:
        group = self.index_group
        return [group.device_global_indices.tolist(), group.lru_slots.tolist(),
                group.swap_stats.view(torch.int64).tolist(), self.slab.tolist()]


STEPS = [  # (top-k rows, req_id_per_token padded to the graph size, num_valid_rows)
    ([[0, 1, 2, 3], [0, 1, 9, -1], [4, 5, 6, 7], [1, 2, 3, -1], [0, 0, 0, 0]], [0, 0, 1, 2, 0], 4),
    ([[0, 1, 10, 11], [0, 12, 9, -1], [4, 5, 6, 8], [1, 2, 3, -1], [3, 3, 3, 3]], [0, 0, 1, 2, 0], 4),
    ([[13, 1, 2, 3], [5, 6, 7, 8], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]], [2, 1, 0, 0, 0], 2),
]


def _run(ops: Any, prefix: str, runtime: Runtime) -> list[Any]:
    recorded = []
    for topk, req_ids, valid in STEPS:
        t = runtime.step_tensors(topk, req_ids, valid)
        runtime.resolve(ops, f"{prefix}resolve_residency", t)
        for _layer in range(LAYERS):
            runtime.compact(ops, f"{prefix}gather_compact", t)
        runtime.invalidate(ops, f"{prefix}invalidate_written_slots", [0, 2, 7], [int(runtime.host_cache.shape[0]) - 1,
                                                                                  8, 3])
        recorded.append(({k: v.tolist() for k, v in t.items()}, runtime.snapshot()))
    return recorded


def test_create_cache_ops_returns_the_four_names_vllm_calls_and_equals_the_oracle() -> None:
    backend = CpuBackend()
    runtime = Runtime()
    reference = copy.deepcopy(runtime)
    from hisparse_hal.cache_ops import tables

    tables.register_table(reference.index_group.device_global_indices)
    ops = backend.create_cache_ops(runtime)
    assert ops.implementation == "host"
    assert all(callable(getattr(ops, f"hisparse_{name}")) for name in
               ("resolve_residency", "gather_compact", "gather_plan", "invalidate_written_slots"))
    got = _run(ops, "hisparse_", runtime)
    want = _run(oracle, "", reference)
    assert got == want
    stats = runtime.index_group.swap_stats.view(torch.int64).tolist()
    assert stats[0] > 0 and stats[1] > 0


def test_create_cache_ops_registers_the_runtime_table_so_invalidation_finds_it_by_address() -> None:
    backend = CpuBackend()
    runtime = Runtime(seed=1)
    runtime.index_group.device_global_indices[2, :3] = torch.tensor([8, 8, 5], dtype=I32)
    stranger = torch.full((MAX_REQS, REGION), 8, dtype=I32)  # never registered
    ops = backend.create_cache_ops(runtime)
    runtime.invalidate(ops, "hisparse_invalidate_written_slots", [0], [8])  # request 0 -> state row 2
    assert runtime.index_group.device_global_indices[2, :3].tolist() == [-1, -1, 5]
    pointers = torch.tensor([stranger.data_ptr()], dtype=torch.int64)
    with pytest.raises(UnknownTableError, match="is no registered"):
        ops.hisparse_invalidate_written_slots(pointers, runtime.request_state_indices, torch.tensor([0], dtype=I32),
                                              torch.tensor([8], dtype=torch.int64), MAX_REQS, REGION)
    assert stranger.eq(8).all()


def test_resolve_and_compact_captured_on_the_cpu_device_replay_with_the_values_written_in_place() -> None:
    backend = CpuBackend()
    runtime = Runtime(seed=2)
    reference = copy.deepcopy(runtime)
    ops = backend.create_cache_ops(runtime)
    first = runtime.step_tensors(*STEPS[0][:2], STEPS[0][2])
    with backend.capture() as graph:  # a FULL decode graph: B9 and B10 on the copy stream
        runtime.resolve(ops, "hisparse_resolve_residency", first)
        runtime.compact(ops, "hisparse_gather_compact", first)
    assert graph.operations == ("resolve_residency", "gather_compact")
    assert runtime.index_group.swap_stats.view(torch.int64).tolist() == [0, 0]  # nothing ran at capture
    for topk, req_ids, valid in STEPS:
        step = runtime.step_tensors(topk, req_ids, valid)
        for name in ("topk", "req_ids", "query_start_loc"):
            first[name].copy_(step[name])  # the step's inputs written into the captured tensors
        graph.replay()
        t = reference.step_tensors(topk, req_ids, valid)
        oracle.resolve_residency(*_resolve_args(reference, t))
        oracle.gather_compact(reference.host_cache, reference.hot, t["swap_host"], t["swap_dev"], t["swap_counts"])
        assert first["hot_indices"].tolist() == t["hot_indices"].tolist()
        assert first["physical"].tolist() == t["physical"].tolist()
        assert runtime.snapshot() == reference.snapshot()


def _resolve_args(runtime: Runtime, t: dict[str, torch.Tensor]) -> tuple[Any, ...]:
    group = runtime.index_group
    return (runtime.host_cache, runtime.hot, runtime.hot_block_table, t["topk"], t["hot_indices"],
            group.device_global_indices, group.lru_slots, runtime.request_state_indices, runtime.region_stride,
            runtime.max_union_rows, group.swap_stats, t["physical"], runtime.attention_block_stride, t["req_ids"],
            runtime.source_block_table, BLOCK, t["valid_counts"], t["swap_host"], t["swap_dev"], t["swap_counts"],
            runtime.residency, BLOCK, t["query_start_loc"][-1:])


def test_gather_plan_as_stage_prefill_rows_calls_it_fills_a_fresh_staged_buffer() -> None:
    """``runtime.py:808-814``: a ``[1, N]`` plan into a fresh contiguous 3-D staged buffer."""
    backend = CpuBackend()
    runtime = Runtime(seed=3)
    ops = backend.create_cache_ops(runtime)
    staged = torch.zeros(2, BLOCK, ROW_BYTES, dtype=torch.uint8)
    rows = torch.tensor([[5, 6, -1, 7, 10_000, 9, 3, 2]], dtype=I32)
    dst = torch.arange(8, dtype=I32).view(1, 8)
    mask = torch.tensor([[1, 1, 1, 0, 1, 1, 1, 1]], dtype=I32)
    ops.hisparse_gather_plan(runtime.host_cache.view(-1, ROW_BYTES), staged, rows, dst, mask)
    want = torch.zeros(2, BLOCK, ROW_BYTES, dtype=torch.uint8)
    oracle.gather_plan(runtime.host_cache, want, rows, dst, mask)
    assert torch.equal(staged, want) and torch.equal(staged.view(8, -1)[0], runtime.host_cache[5])


_BINDINGS = Path("/work/vllm-src/vllm-0.34.0/csrc/torch_bindings.cpp")
_COUNTS = {"resolve_residency": 23, "gather_compact": 5, "gather_plan": 5, "invalidate_written_slots": 6}


def _schema_names(schema: str) -> list[str]:
    """Parameter names of a torch schema's argument list (``(Tensor! a, int b=0) -> ()`` -> ``[a, b]``)."""
    inside = schema[schema.index("(") + 1:schema.rindex(") ->")]
    return [part.split("=")[0].split()[-1] for part in inside.split(",")]


def _vllm_schemas() -> dict[str, list[str]]:
    """vLLM 0.34.0's four ``hisparse_*`` schemas from its ``csrc/torch_bindings.cpp``, names in order."""
    text = "".join(re.findall(r'"([^"]*)"', _BINDINGS.read_text()))
    found = {}
    for name in _COUNTS:
        start = text.index(f"hisparse_{name}(")
        found[name] = _schema_names(text[start:text.index("-> ()", start) + 5])
    return found


@pytest.mark.parametrize("name", list(_COUNTS))
def test_bound_ops_show_vllms_parameter_names_to_inspect_signature_and_help(name: str) -> None:
    ops = CpuBackend().create_cache_ops(None)
    names = list(signatures.SIGNATURES[name].parameters)
    assert len(names) == _COUNTS[name]
    assert names == _schema_names(library.SCHEMAS[name])  # our custom ops' schema, copied from vLLM
    for method in (getattr(ops, f"hisparse_{name}"), getattr(ops, name)):
        assert list(inspect.signature(method).parameters) == names
    rendered = pydoc.render_doc(getattr(ops, f"hisparse_{name}"), renderer=pydoc.TextDoc())
    assert all(f"{parameter}:" in rendered for parameter in names)


@pytest.mark.skipif(not _BINDINGS.exists(), reason=f"vLLM 0.34.0's source is not unpacked at {_BINDINGS}")
def test_bound_op_signatures_are_vllm_0_34_0s_torch_bindings_schemas() -> None:
    ops = CpuBackend().create_cache_ops(None)
    for name, names in _vllm_schemas().items():
        assert list(inspect.signature(getattr(ops, f"hisparse_{name}")).parameters) == names, name


def test_bound_ops_take_vllms_names_as_keywords_and_fill_the_schema_defaults() -> None:
    backend = CpuBackend()
    runtime, reference = Runtime(seed=4), Runtime(seed=4)
    ops = backend.create_cache_ops(runtime)
    tables.register_table(reference.index_group.device_global_indices)
    t, want = runtime.step_tensors(*STEPS[0]), reference.step_tensors(*STEPS[0])
    args = _resolve_args(runtime, t)
    optional = list(signatures.SIGNATURES["resolve_residency"].parameters)[10:]
    ops.hisparse_resolve_residency(*args[:10], **dict(zip(optional, args[10:], strict=True)))
    oracle.resolve_residency(*_resolve_args(reference, want))
    ops.gather_compact(host_cache=runtime.host_cache, hot_cache=runtime.hot, miss_global_indices=t["swap_host"],
                       miss_hot_indices=t["swap_dev"], miss_counts=t["swap_counts"])
    oracle.gather_compact(reference.host_cache, reference.hot, want["swap_host"], want["swap_dev"],
                          want["swap_counts"])
    assert {k: v.tolist() for k, v in t.items()} == {k: v.tolist() for k, v in want.items()}
    assert runtime.snapshot() == reference.snapshot()
    before = runtime.snapshot()
    one, one_want = (r.step_tensors([[0, 1, 2, 3]], [0], 1) for r in (runtime, reference))  # row 0: state row 2
    ops.hisparse_resolve_residency(*_resolve_args(runtime, one)[:10])  # 13 optional arguments: schema defaults
    oracle.resolve_residency(*_resolve_args(reference, one_want)[:10])
    assert one["hot_indices"].tolist() == one_want["hot_indices"].tolist() != [[-5] * TOP_K]
    assert runtime.snapshot() == reference.snapshot() != before  # host rows 0-3 loaded into state row 2
    assert runtime.index_group.swap_stats.view(torch.int64).tolist() == before[2]  # no stats tensor passed


def _op_args(runtime: Runtime, name: str) -> tuple[Any, ...]:
    """Valid positional arguments of op ``name`` as vLLM passes them."""
    t = runtime.step_tensors(*STEPS[0])
    table = runtime.index_group.device_global_indices
    return {
        "resolve_residency": _resolve_args(runtime, t),
        "gather_compact": (runtime.host_cache, runtime.hot, t["swap_host"], t["swap_dev"], t["swap_counts"]),
        "gather_plan": (runtime.host_cache, runtime.hot, t["swap_host"], t["swap_dev"], t["swap_counts"][:, None]
                        .expand(-1, TOP_K).contiguous()),
        "invalidate_written_slots": (torch.tensor([table.data_ptr()], dtype=torch.int64), runtime.request_state_indices,
                                     torch.tensor([0], dtype=I32), torch.tensor([8], dtype=torch.int64), MAX_REQS,
                                     REGION),
    }[name]


@pytest.mark.parametrize("change", ["one too many", "one too few"])
@pytest.mark.parametrize("name", list(_COUNTS))
def test_a_wrong_argument_count_is_a_typed_error_naming_the_op_and_counts_and_nothing_runs(name: str,
                                                                                            change: str) -> None:
    backend = CpuBackend()
    runtime = Runtime(seed=5)
    runtime.index_group.device_global_indices[2, :2] = torch.tensor([8, 9], dtype=I32)
    ops = backend.create_cache_ops(runtime)
    args = _op_args(runtime, name)
    required, total = signatures.ARITY[name]
    assert total == _COUNTS[name] and required == (10 if name == "resolve_residency" else total)
    wrong = (*args, args[-1]) if change == "one too many" else args[:required - 1]
    given = total + 1 if change == "one too many" else required - 1
    takes = "10 to 23" if name == "resolve_residency" else str(total)
    before = runtime.snapshot()
    for method in (getattr(ops, f"hisparse_{name}"), getattr(ops, name)):
        with pytest.raises(CacheOpArityError, match=rf"^hisparse_{name} takes {takes} arguments, .* given {given} "):
            method(*wrong)
    assert runtime.snapshot() == before
    error = CacheOpArityError(f"hisparse_{name}", given, (required, total))
    assert isinstance(error, TypeError) and isinstance(error, InvalidArgumentError)
    assert (error.op, error.given, error.expected) == (f"hisparse_{name}", given, (required, total))
    with pytest.raises(CacheOpArityError, match="unexpected keyword argument 'bogus'"):
        getattr(ops, f"hisparse_{name}")(*args, bogus=1)
    getattr(ops, f"hisparse_{name}")(*args)  # the right count runs
