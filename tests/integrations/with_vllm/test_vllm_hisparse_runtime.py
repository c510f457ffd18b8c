"""Multi-step HiSparse decode through vLLM 0.34.0's own ``HiSparseRuntime`` on hisparse-hal's CPU backend.

vLLM resolves the backend itself (``get_hisparse_backend()`` after ``load_general_plugins()`` with
``HISPARSE_HAL_VLLM_BACKEND=cpu``), and every backend call comes from vLLM's code: ``HiSparseRuntime.__init__``
(``check_available``, ``stats_dtype``), ``bind_source_cache`` (``create_cache_ops``), ``HiSparseCacheHandle.swap_in``
(``hisparse_resolve_residency`` / ``hisparse_gather_compact``), ``HiSparseSlotInvalidator``
(``hisparse_invalidate_written_slots``) and ``gather_prefill_cache`` (``gather_resident_rows`` /
``hisparse_gather_plan``). The test builds the objects and checks bytes, indices and stats against its own model.
CPU stand-ins (``cpu_standins.py`` beside this file) replace only the torch stream/event/pinned-memory calls a
CPU-only torch cannot serve.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.integrations.with_vllm.cpu_standins import install
from tests.integrations.with_vllm.vllm_env import loaded_plugin, require_vllm

require_vllm()

from vllm.v1.hisparse import runtime as hr  # noqa: E402
from vllm.v1.hisparse.backend import get_hisparse_backend  # noqa: E402

from hisparse_hal.integrations.vllm_backend import CpuHiSparseBackend  # noqa: E402

I32 = torch.int32
BLOCK, TOP_K, MAX_QUERY_LEN, MAX_REQS, LAYERS = 4, 4, 2, 4, 3
ROW_WIDTH, DTYPE = 8, torch.bfloat16  # 16-byte rows, as vLLM requires
ROW_BYTES = ROW_WIDTH * DTYPE.itemsize
HOT_PAGES = (MAX_QUERY_LEN + 1) * TOP_K // BLOCK  # device_buffer_size / block size
PAGES, HOST_BLOCKS, SLAB_BLOCKS = 6, 24, 20
STATE_OF_BATCH_ROW = [3, 1, 2]  # request_state_indices: non-identity
RESIDENT_BLOCK = 17  # request 0's page 5 is resident in GPU block 17 of every layer


class World:
    """One index group of LAYERS layers over one slab, built with vLLM's constructors and binders."""

    def __init__(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.backend = get_hisparse_backend()
        config = hr.ResolvedHiSparseConfig(top_k=TOP_K, device_buffer_size=HOT_PAGES * BLOCK,
                                           max_union_rows=MAX_QUERY_LEN * TOP_K)
        leader = hr.HiSparseRuntime(config, MAX_REQS, ROW_WIDTH, DTYPE, "cpu", max_swap_rows=16)
        self.runtimes = [leader] + [
            hr.HiSparseRuntime(config, MAX_REQS, ROW_WIDTH, DTYPE, "cpu", index_group=leader.index_group)
            for _ in range(LAYERS - 1)
        ]
        # One slab, every layer's row of a block side by side: block stride > block size (PagedCacheView.bind).
        block_stride = LAYERS * BLOCK * ROW_BYTES
        self.slab = torch.randint(0, 256, (SLAB_BLOCKS * block_stride,), dtype=torch.uint8, generator=gen)
        self.hot_block_table = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]], dtype=I32)
        self.resident_table = torch.zeros((MAX_REQS, PAGES), dtype=I32)  # by request *state* row
        self.handles = [hr.HiSparseCacheHandle(runtime) for runtime in self.runtimes]
        self.host_kv = []
        for layer, (runtime, handle) in enumerate(zip(self.runtimes, self.handles, strict=True)):
            binding: dict[str, Any] = dict(byte_offset=layer * BLOCK * ROW_BYTES, block_stride=block_stride,
                           num_blocks=SLAB_BLOCKS, block_size=BLOCK)
            runtime.bind_hot_cache(self.slab, **binding, block_table=self.hot_block_table)
            handle.bind_cache(self.slab, **binding, block_table=self.resident_table,
                              slot_mapping=torch.zeros(16, dtype=torch.int64))
            host = torch.randint(0, 256, (HOST_BLOCKS, BLOCK, ROW_BYTES), dtype=torch.uint8, generator=gen).view(DTYPE)
            self.backend.pin_tensor(host)  # as allocate_pinned_host_pool does (runtime.py:223-228)
            runtime.bind_source_cache(host, registered_host_pool=host)
            self.host_kv.append(host)
            handle.index_group_caches = self.handles
        assert self.runtimes[0].hot.attention_block_stride == LAYERS * BLOCK > BLOCK
        hr.initialize_hisparse_runtime_buffers(self.handles, max_num_reqs=MAX_REQS)
        rsi = self.runtimes[0].request_state_indices
        assert rsi is not None
        rsi[:3] = torch.tensor(STATE_OF_BATCH_ROW, dtype=I32)
        self.invalidator = hr.HiSparseSlotInvalidator(rsi)
        # The host group's block table (batch rows); block 0 is the null block.
        self.source_block_table = torch.tensor(
            [[3, 8, 12, 6, 0, 21], [10, 4, 15, 1, 9, 0], [5, 14, 2, 11, 7, 13], [0] * PAGES], dtype=I32)
        # Request 0 (batch row 0, state row 3) holds page 5 resident: the GPU block mirrors host block 21. Only
        # its state row is set (0.34.0 reads the table by state row), so a batch-row reading would miss it.
        self.resident_table[3, 5] = RESIDENT_BLOCK
        for layer, handle in enumerate(self.handles):
            assert handle.view is not None
            handle.view.cache[RESIDENT_BLOCK].copy_(self.host_kv[layer][21])

    def close(self) -> None:
        for host in self.host_kv:
            self.backend.unpin_tensor(host)

    def attention_rows(self, layer: int, indices: torch.Tensor) -> torch.Tensor:
        return self.runtimes[layer].hot.attention_cache.reshape(-1, ROW_WIDTH)[indices.to(torch.long)]

    def host_row(self, batch_row: int, token: int) -> int | None:
        page = token // BLOCK
        if token < 0 or page >= PAGES or int(self.source_block_table[batch_row, page]) == 0:
            return None
        return int(self.source_block_table[batch_row, page]) * BLOCK + token % BLOCK

    def resident(self, batch_row: int, token: int) -> bool:
        page = token // BLOCK
        return 0 <= token and page < PAGES and int(self.resident_table[STATE_OF_BATCH_ROW[batch_row], page]) > 0

    def rewrite_host_row(self, host_row: int, batch_row: int, gen: torch.Generator) -> None:
        """The engine writes a new KV row into the host pool, then tells HiSparse (worker.py:889-894)."""
        for host in self.host_kv:
            fresh = torch.randint(0, 256, (ROW_BYTES,), dtype=torch.uint8, generator=gen).view(DTYPE)
            host.view(-1, ROW_WIDTH)[host_row].copy_(fresh)
        self.invalidator([self.runtimes[0]], torch.tensor([host_row, -1], dtype=torch.int64),
                         torch.tensor([batch_row, 1], dtype=I32))


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    status = loaded_plugin()
    assert status.active and status.backend_cls.endswith(".CpuHiSparseBackend"), status
    install(monkeypatch, hr)
    assert isinstance(get_hisparse_backend(), CpuHiSparseBackend)
    built = World(seed=7)
    yield built
    built.close()


def _step(world: World, query_len: int, topk: list[list[int]]) -> list[Any]:
    """One forward: vLLM's attention backend calls swap_in per layer, leader first (index_group.py:255-262)."""
    num_reqs = len(STATE_OF_BATCH_ROW)
    num_valid = num_reqs * query_len
    padded = len(topk)
    # FULL-graph padding rows carry request 0 (design note §3.3): num_valid_rows must mask them.
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


def _expected_stats(world: World, query_len: int, topk: list[list[int]], held: dict[int, set[int]]) -> list[int]:
    """Hits and misses one step adds (design note §3.3 step 6): each request's distinct host rows not held in
    its state row are misses; every other host reference is a hit; resident positions count as neither."""
    hits = misses = 0
    for q in range(len(STATE_OF_BATCH_ROW)):
        refs = [world.host_row(q, t) for row in topk[q * query_len:(q + 1) * query_len] for t in row
                if not world.resident(q, t)]
        refs = [g for g in refs if g is not None]
        loaded = set(refs) - held[STATE_OF_BATCH_ROW[q]]
        misses += len(loaded)
        hits += len(refs) - len(loaded)
    return [hits, misses]


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


def test_vllm_decode_steps_put_every_selected_host_row_where_attention_reads_it(world: World) -> None:
    gen = torch.Generator().manual_seed(11)
    group = world.runtimes[0].index_group
    total = [0, 0]
    for query_len, topk, rewrite in STEPS:
        if rewrite is not None:
            host_row, batch_row = rewrite
            held_row = group.device_global_indices[STATE_OF_BATCH_ROW[batch_row]]
            assert (held_row == host_row).any(), "the rewritten row must be held, or invalidation proves nothing"
            world.rewrite_host_row(host_row, batch_row, gen)
            assert not (held_row == host_row).any(), "the slot invalidator must drop the stale hot copy"
        held = {state: {int(g) for g in group.device_global_indices[state].tolist() if g >= 0}
                for state in STATE_OF_BATCH_ROW}
        expected = _expected_stats(world, query_len, topk, held)
        results = _step(world, query_len, topk)
        _check_step(world, query_len, topk, results)
        total = [total[0] + expected[0], total[1] + expected[1]]
        assert group.swap_stats.dtype == world.backend.stats_dtype == torch.uint64
        assert group.swap_stats.view(torch.int64).tolist() == total, (query_len, topk)
    assert total[0] > 0 and total[1] > 0


def test_vllm_gather_prefill_cache_stages_host_and_resident_rows(world: World) -> None:
    """``HiSparseRuntime.gather_prefill_cache`` with vLLM's own staging plan and its resident-source pass."""
    block_table = world.source_block_table[:3]
    seq_lens = torch.tensor([24, 17, 9])
    plan = hr.build_hisparse_prefill_staging_plan(block_table, seq_lens, BLOCK, staging_block_capacity=16)
    state_indices = world.runtimes[0].request_state_indices
    assert state_indices is not None
    plan.ensure_gpu_sources(world.resident_table, state_indices[:3], BLOCK)
    assert plan.gpu_row_ids is not None and (plan.gpu_row_ids >= 0).any(), "the resident page must be sourced"
    # Poison the resident page's host copy: a staged row equal to the resident bytes proves the device source.
    for layer, (runtime, handle) in enumerate(zip(world.runtimes, world.handles, strict=True)):
        assert handle.view is not None
        resident_bytes = handle.view.cache[RESIDENT_BLOCK].clone()
        world.host_kv[layer][21].view(torch.uint8).fill_(0xEE)
        staged = runtime.gather_prefill_cache(world.host_kv[layer], plan, resident_cache=handle.view.cache)
        for q, seq_len in enumerate(seq_lens.tolist()):
            for token in range(seq_len):
                page, offset = divmod(token, BLOCK)
                host_block = int(block_table[q, page])
                if host_block == 0:
                    continue  # the null block holds nothing to stage
                row = staged[int(plan.block_table[q, page]), offset]
                source = resident_bytes[offset] if (q, page) == (0, 5) else world.host_kv[layer][host_block, offset]
                assert torch.equal(row.view(torch.uint8), source.view(torch.uint8)), (layer, q, token)
