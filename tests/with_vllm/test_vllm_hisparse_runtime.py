"""Multi-step HiSparse decode through vLLM 0.33.0's own ``HiSparseRuntime``, calling our ops via the plugin.

Every op call comes from vLLM's code (``HiSparseCacheHandle.swap_in`` -> ``_resolve_and_stage_group`` ->
``_resolve_residency`` / ``_swap_rows``, ``_stage_this_layer``, ``invalidate_written_slots``,
``gather_prefill_cache``); the test only builds the objects and checks bytes. CPU-only stand-ins, each where a
vLLM constructor or method needs a GPU: pinned memory (``HiSparseIndexGroup.swap_stats_host``), the copy stream
and the layer-ready events (CPU ops run in program order, so waiting on them is a no-op here).
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
from vllm_env import loaded_plugin, require_vllm

require_vllm()

import vllm.utils.torch_utils as vllm_torch_utils  # noqa: E402
from vllm.v1.hisparse import runtime as hr  # noqa: E402

from hisparse_hal.cache_ops import library, oracle, torch_impl  # noqa: E402

I32 = torch.int32
BLOCK, TOP_K, MAX_QUERY_LEN, MAX_REQS, LAYERS = 4, 4, 2, 4, 3
ROW_WIDTH, DTYPE = 8, torch.bfloat16  # 16-byte rows, as vLLM requires
ROW_BYTES = ROW_WIDTH * DTYPE.itemsize
HOT_PAGES = (MAX_QUERY_LEN + 1) * TOP_K // BLOCK  # device_buffer_size / block size
PAGES, HOST_BLOCKS, SLAB_BLOCKS = 6, 24, 20
STATE_OF_BATCH_ROW = [3, 1, 2]  # request_state_indices: non-identity
RESIDENT_BLOCK = 17  # request 0's page 5 is resident in GPU block 17 of every layer


class _InOrderStream:
    """CPU stand-in for vLLM's copy/compute streams: CPU kernels run in program order, so waits are no-ops."""

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def __enter__(self) -> _InOrderStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class _InOrderEvent:
    def record(self, stream: Any = None) -> None:
        return None


class _UnpinnedTorch(types.SimpleNamespace):
    """``torch`` for vLLM's runtime module while it constructs: ``pin_memory=True`` needs a GPU allocator."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def empty(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
        return torch.empty(*args, **kwargs)


class World:
    """One index group of LAYERS layers over one slab, built with vLLM's constructors and binders."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        config = hr.ResolvedHiSparseConfig(top_k=TOP_K, device_buffer_size=HOT_PAGES * BLOCK,
                                           max_union_rows=MAX_QUERY_LEN * TOP_K)
        stream = _InOrderStream()
        with monkeypatch.context() as m:
            m.setattr(hr, "torch", _UnpinnedTorch())
            leader = hr.HiSparseRuntime(config, MAX_REQS, ROW_WIDTH, DTYPE, "cpu", max_swap_rows=16,
                                        copy_stream=stream)
            self.runtimes = [leader] + [
                hr.HiSparseRuntime(config, MAX_REQS, ROW_WIDTH, DTYPE, "cpu", index_group=leader.index_group)
                for _ in range(LAYERS - 1)
            ]
        for runtime in self.runtimes:
            runtime._layer_ready_event = _InOrderEvent()
        # One slab, every layer's row of a block side by side: block stride > block size (PagedCacheView.bind).
        block_stride = LAYERS * BLOCK * ROW_BYTES
        self.slab = torch.randint(0, 256, (SLAB_BLOCKS * block_stride,), dtype=torch.uint8, generator=gen)
        self.hot_block_table = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]], dtype=I32)
        self.resident_table = torch.zeros((MAX_REQS, PAGES), dtype=I32)
        self.handles = [hr.HiSparseCacheHandle(runtime) for runtime in self.runtimes]
        self.host_kv = []
        for layer, (runtime, handle) in enumerate(zip(self.runtimes, self.handles, strict=True)):
            binding = dict(byte_offset=layer * BLOCK * ROW_BYTES, block_stride=block_stride,
                           num_blocks=SLAB_BLOCKS, block_size=BLOCK)
            runtime.bind_hot_cache(self.slab, **binding, block_table=self.hot_block_table)
            handle.bind_cache(self.slab, **binding, block_table=self.resident_table,
                              slot_mapping=torch.zeros(16, dtype=torch.int64))
            host = torch.randint(0, 256, (HOST_BLOCKS, BLOCK, ROW_BYTES), dtype=torch.uint8, generator=gen).view(DTYPE)
            # Not pinned (no GPU here): passed as registered_host_pool, vLLM's path for cudaHostRegister'd pools.
            runtime.bind_source_cache(host, registered_host_pool=host)
            self.host_kv.append(host)
            handle.index_group_caches = self.handles
        assert self.runtimes[0].hot.attention_block_stride == LAYERS * BLOCK > BLOCK
        hr.initialize_hisparse_runtime_buffers(self.handles, max_num_reqs=MAX_REQS)
        self.runtimes[0].request_state_indices[:3] = torch.tensor(STATE_OF_BATCH_ROW, dtype=I32)
        # The host group's block table (batch rows); block 0 is the null block.
        self.source_block_table = torch.tensor(
            [[3, 8, 12, 6, 0, 21], [10, 4, 15, 1, 9, 0], [5, 14, 2, 11, 7, 13], [0] * PAGES], dtype=I32)
        # Request 0 (batch row 0, state row 3) holds page 5 resident: the GPU block mirrors host block 21.
        # Set under both its batch row and its state row (nothing else uses row 3), so either reading agrees.
        self.resident_table[0, 5] = self.resident_table[3, 5] = RESIDENT_BLOCK
        for layer, handle in enumerate(self.handles):
            assert handle.view is not None
            handle.view.cache[RESIDENT_BLOCK].copy_(self.host_kv[layer][21])

    def attention_rows(self, layer: int, indices: torch.Tensor) -> torch.Tensor:
        return self.runtimes[layer].hot.attention_cache.reshape(-1, ROW_WIDTH)[indices.to(torch.long)]

    def host_row(self, batch_row: int, token: int) -> int | None:
        page = token // BLOCK
        if token < 0 or page >= PAGES or int(self.source_block_table[batch_row, page]) == 0:
            return None
        return int(self.source_block_table[batch_row, page]) * BLOCK + token % BLOCK

    def rewrite_host_row(self, host_row: int, batch_row: int, gen: torch.Generator) -> None:
        """The engine writes a new KV row into the host pool, then tells HiSparse (as the connector does)."""
        for host in self.host_kv:
            fresh = torch.randint(0, 256, (ROW_BYTES,), dtype=torch.uint8, generator=gen).view(DTYPE)
            host.view(-1, ROW_WIDTH)[host_row].copy_(fresh)
        self.runtimes[0].invalidate_written_slots(torch.tensor([host_row, -1], dtype=torch.int64),
                                                  torch.tensor([batch_row, 1], dtype=I32))


def _step(world: World, query_len: int, topk: list[list[int]]) -> list[Any]:
    """One forward: vLLM's attention backend calls swap_in per layer, leader first (index_group.py:260)."""
    num_reqs = len(STATE_OF_BATCH_ROW)
    num_valid = num_reqs * query_len
    padded = len(topk)
    req_id_per_token = torch.tensor([r // query_len if r < num_valid else 0 for r in range(padded)], dtype=I32)
    metadata = types.SimpleNamespace(num_actual_tokens=num_valid, num_decode_tokens=num_valid,
                                     max_query_len=query_len, num_reqs=num_reqs, req_id_per_token=req_id_per_token)
    world.handles[0].prepare_group_for_batch(metadata)
    indexer_out = torch.full((16, TOP_K + 3), -1, dtype=I32)  # the indexer's buffer: rows are strided
    logical = indexer_out[:padded, :TOP_K]
    logical.copy_(torch.tensor(topk, dtype=I32))
    results = []
    for layer, handle in enumerate(world.handles):
        results.append(handle.swap_in(req_id_per_token, world.source_block_table, logical, block_size=BLOCK,
                                      num_valid_rows=torch.tensor([num_valid], dtype=I32),
                                      return_valid_counts=layer == 0))
    return results


def _check_step(world: World, query_len: int, topk: list[list[int]], results: list[Any]) -> None:
    num_valid = len(STATE_OF_BATCH_ROW) * query_len
    attention, valid_counts = results[0]
    for layer in range(LAYERS):
        indices = results[layer] if layer else attention
        assert torch.equal(indices, attention), "index-sharing layers read one resolution"
        for r, row in enumerate(topk):
            if r >= num_valid:
                assert indices[r].tolist() == [-1] * TOP_K, f"padding row {r} must come out -1"
                continue
            q = r // query_len
            for c, token in enumerate(row):
                host_row = world.host_row(q, token)
                if host_row is None:
                    assert int(indices[r, c]) == -1, (layer, r, c, token)
                    continue
                held = world.attention_rows(layer, indices[r, c : c + 1])[0]
                expected = world.host_kv[layer].reshape(-1, ROW_WIDTH)[host_row]
                assert torch.equal(held.view(torch.uint8), expected.view(torch.uint8)), (layer, r, c, token)
    expected_counts = [sum(world.host_row(r // query_len, t) is not None for t in row) if r < num_valid else 0
                       for r, row in enumerate(topk)]
    assert valid_counts.tolist() == expected_counts


# (query_len, top-k rows incl. CUDA-graph padding rows, (host row, batch row) rewritten before the step or None).
# Request 0: pages 0-3 and 5 (resident); page 4 null. Request 1: page 5 null. Tokens 30+ are past the table.
STEPS = [
    (2, [[0, 5, 13, -1], [5, 9, 20, 14], [1, 6, 30, 3], [2, 6, 7, 17], [0, 4, 8, 12], [1, 5, 9, 13],
         [0, 1, 2, 3], [0, 1, 2, 3]], None),
    (1, [[5, 9, 4, 15], [14, 15, 7, 8], [0, 4, 8, 22], [1, 2, 3, 0]], (8 * BLOCK + 1, 0)),  # token 5 of req 0 rewritten
    (2, [[5, 1, 2, 3], [10, 11, 21, -1], [6, 1, 3, 11], [17, 18, 19, 16], [0, 4, 8, 12], [2, 3, 23, 22],
         [0, 0, 0, 0], [0, 0, 0, 0]], (10 * BLOCK + 1, 1)),  # token 1 of req 1 rewritten
    (1, [[5, 21, 22, 23], [1, 16, 17, 18], [12, 13, 14, 15], [0, 0, 0, 0]], None),
]


def _run(monkeypatch: pytest.MonkeyPatch, implementation: Any) -> tuple[World, list[list[int]]]:
    monkeypatch.setattr(library, "implementation_for", lambda device: implementation)
    monkeypatch.setattr(vllm_torch_utils._current_stream_tls, "value", _InOrderStream(), raising=False)
    world = World(monkeypatch, seed=7)
    gen = torch.Generator().manual_seed(11)
    stats = []
    for query_len, topk, rewrite in STEPS:
        if rewrite is not None:
            host_row, batch_row = rewrite
            held = world.runtimes[0].index_group.device_global_indices[STATE_OF_BATCH_ROW[batch_row]]
            assert (held == host_row).any(), "the rewritten row must be held, or invalidation proves nothing"
            world.rewrite_host_row(host_row, batch_row, gen)
            assert not (held == host_row).any(), "invalidate_written_slots must drop the stale hot copy"
        results = _step(world, query_len, topk)
        _check_step(world, query_len, topk, results)
        stats.append(world.runtimes[0].index_group.swap_stats.view(torch.int64).tolist())
    return world, stats


def test_vllm_decode_steps_put_every_selected_host_row_where_attention_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert loaded_plugin().active, "the plugin must have defined the ops vLLM calls"
    world, stats = _run(monkeypatch, torch_impl)
    hits, misses = stats[-1]
    assert hits > 0 and misses > 0


def test_vllm_swap_stats_equal_the_oracles_hits_and_misses_step_by_step(monkeypatch: pytest.MonkeyPatch) -> None:
    assert loaded_plugin().active, "the plugin must have defined the ops vLLM calls"
    ours, ours_stats = _run(monkeypatch, torch_impl)
    reference, reference_stats = _run(monkeypatch, oracle)
    assert ours_stats == reference_stats
    assert torch.equal(ours.slab, reference.slab)
    group, expected = ours.runtimes[0].index_group, reference.runtimes[0].index_group
    assert torch.equal(group.device_global_indices, expected.device_global_indices)
    assert torch.equal(group.lru_slots, expected.lru_slots)


def test_vllm_gather_prefill_cache_stages_host_and_resident_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """``HiSparseRuntime.gather_prefill_cache`` with vLLM's own staging plan and its resident-source pass."""
    assert loaded_plugin().active, "the plugin must have defined the ops vLLM calls"
    world = World(monkeypatch, seed=5)
    block_table = world.source_block_table[:3]
    seq_lens = torch.tensor([24, 17, 9])
    plan = hr.build_hisparse_prefill_staging_plan(block_table, seq_lens, BLOCK, staging_block_capacity=16)
    state_indices = world.runtimes[0].request_state_indices
    assert state_indices is not None
    plan.ensure_gpu_sources(world.resident_table, state_indices, BLOCK)
    assert plan.gpu_row_ids is not None and (plan.gpu_row_ids >= 0).any(), "the resident page must be sourced"
    for layer, (runtime, handle) in enumerate(zip(world.runtimes, world.handles, strict=True)):
        assert handle.view is not None
        staged = runtime.gather_prefill_cache(world.host_kv[layer], plan, resident_cache=handle.view.cache)
        for q, seq_len in enumerate(seq_lens.tolist()):
            for token in range(seq_len):
                page, offset = divmod(token, BLOCK)
                host_block = int(block_table[q, page])
                if host_block == 0:
                    continue  # the null block holds nothing to stage
                row = staged[int(plan.block_table[q, page]), offset]
                host = world.host_kv[layer][host_block, offset]
                assert torch.equal(row.view(torch.uint8), host.view(torch.uint8)), (layer, q, token)


def test_vllm_call_sites_trace_under_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.33.0 runs these call sites eagerly (inside the ``vllm::unified_mla_attention_with_output`` splitting
    op and the connector worker); tracing them anyway checks our fake kernels and declared mutations."""
    assert loaded_plugin().active, "the plugin must have defined the ops vLLM calls"
    monkeypatch.setattr(vllm_torch_utils._current_stream_tls, "value", _InOrderStream(), raising=False)
    eager, compiled = World(monkeypatch, seed=3), World(monkeypatch, seed=3)
    for world in (eager, compiled):
        world.runtimes[0].index_group.device_global_indices[3, :3] = torch.tensor([33, 85, 12], dtype=I32)
    slots, req_ids = torch.tensor([33, 12, 7], dtype=torch.int64), torch.tensor([0, 0, 1], dtype=I32)
    eager.runtimes[0].invalidate_written_slots(slots, req_ids)
    torch._dynamo.reset()
    invalidate = torch.compile(compiled.runtimes[0].invalidate_written_slots, backend="aot_eager", fullgraph=True)
    invalidate(slots, req_ids)
    after = compiled.runtimes[0].index_group.device_global_indices
    assert torch.equal(after, eager.runtimes[0].index_group.device_global_indices)
    assert after[3, :3].tolist() == [-1, 85, -1]
