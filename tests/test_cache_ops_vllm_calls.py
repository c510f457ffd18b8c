"""The cache ops driven with exactly the argument lists vLLM 0.33.0's HiSparse runtime passes.

The tensors are built the way ``vllm/v1/hisparse/runtime.py`` builds them (``HiSparseIndexGroup``,
``_SharedTopKState``, ``PagedCacheView.bind`` over a multi-layer slab, ``_resolve_and_stage_group``'s request-id
masking) and each op is called with the positions, dtypes and ``None``s of ``_resolve_residency``,
``_swap_rows``, ``invalidate_written_slots`` and ``gather_prefill_cache``. Every implementation present is
checked: the oracle on the data (attention rows hold the selected host rows), the others bit for bit against it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch

from hisparse_hal.cache_ops import oracle
from hisparse_hal.errors import HalError

if not torch.cuda.is_available():  # the Triton ops run CPU tensors only under the interpreter (read at first use)
    os.environ.setdefault("TRITON_INTERPRET", "1")

I32 = torch.int32
BLOCK, TOP_K, QUERIES = 4, 4, 2
REGION = (QUERIES + 1) * TOP_K  # device_buffer_size default
MAX_UNION = QUERIES * TOP_K
MAX_REQS, MAX_SWAP_ROWS, PAGES = 4, 8, 8
ROW_WIDTH, DTYPE = 8, torch.bfloat16  # 16-byte rows, as vLLM requires
LAYERS = 2


def _backend_ops() -> Any:
    from hisparse_hal.registry import get_backend

    backend = get_backend("cpu")
    if not hasattr(backend, "create_cache_ops"):
        pytest.skip("the CPU backend has no create_cache_ops yet")
    return backend.create_cache_ops(None)


def _module(name: str) -> Callable[[], Any]:
    def load() -> Any:
        try:
            module = importlib.import_module(f"hisparse_hal.cache_ops.{name}")
        except ImportError as exc:
            pytest.skip(f"hisparse_hal.cache_ops.{name} is not importable here: {exc}")
        if name == "triton_impl":
            try:
                module.kernels(torch.device("cpu"))
            except HalError as exc:
                pytest.skip(f"the Triton ops cannot run on CPU tensors in this process: {exc}")
        return module
    return load


IMPLEMENTATIONS = {
    "oracle": lambda: oracle,
    "torch_impl": _module("torch_impl"),
    "triton_impl": _module("triton_impl"),
    "backend_cache_ops": _backend_ops,
}


class Runtime:
    """One index group (leader + follower layer) laid out as vLLM 0.33.0's runtime lays it out."""

    def __init__(self, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        itemsize = torch.empty((), dtype=DTYPE).element_size()
        self.row_bytes = ROW_WIDTH * itemsize
        # HiSparseIndexGroup
        self.device_global_indices = torch.full((MAX_REQS, REGION), -1, dtype=I32)
        self.lru_init = torch.arange(REGION, dtype=torch.int16)
        self.lru_slots = self.lru_init.repeat(MAX_REQS, 1).contiguous()
        self.device_topk_rows = torch.full((MAX_SWAP_ROWS, TOP_K), -1, dtype=I32)  # _SharedTopKState
        self.physical_topk_indices = torch.empty_like(self.device_topk_rows)
        self.swap_host_physical_rows = torch.empty((MAX_SWAP_ROWS, TOP_K), dtype=I32)
        self.swap_device_physical_rows = torch.empty_like(self.swap_host_physical_rows)
        self.swap_counts = torch.empty(MAX_SWAP_ROWS, dtype=I32)
        self.valid_topk_counts = torch.empty(MAX_SWAP_ROWS, dtype=I32)
        self.row_indices = torch.arange(MAX_SWAP_ROWS, dtype=I32)
        self.request_ids = torch.empty_like(self.row_indices)
        self.swap_stats = torch.zeros(2, dtype=torch.uint64)
        # vLLM allocates these with torch.empty; poison them so untouched entries compare deterministically.
        for scratch in (self.physical_topk_indices, self.swap_host_physical_rows, self.swap_device_physical_rows,
                        self.swap_counts, self.valid_topk_counts, self.request_ids):
            scratch.fill_(-7777)
        self.request_state_indices = torch.full((MAX_REQS,), -1, dtype=I32)  # initialize_hisparse_runtime_buffers
        # One GPU slab for both layers: block stride spans every layer of a block (PagedCacheView.bind).
        self.num_blocks = 24
        self.block_stride = LAYERS * BLOCK * self.row_bytes
        self.slab = torch.randint(0, 256, (self.num_blocks * self.block_stride,), dtype=torch.uint8,
                                  generator=generator)
        self.hot = [self._bind(layer * BLOCK * self.row_bytes) for layer in range(LAYERS)]
        self.attention_block_stride = self.block_stride // self.row_bytes
        # Host KV per layer: [host blocks, B, row_width] on CPU, viewed [-1, row_width] (bind_source_cache).
        host_blocks = 16
        self.host_kv = [
            torch.randint(0, 256, (host_blocks, BLOCK, self.row_bytes), dtype=torch.uint8, generator=generator)
            .view(DTYPE) for _ in range(LAYERS)
        ]
        self.host_cache = [kv.view(-1, kv.shape[-1]) for kv in self.host_kv]
        # Input block tables of the hot group and the host group, and the residency tensor.
        self.hot_block_table = torch.zeros((MAX_REQS, PAGES), dtype=I32)
        self.source_block_table = torch.zeros((MAX_REQS, PAGES), dtype=I32)
        self.residency = torch.zeros((1, MAX_REQS, PAGES), dtype=I32)
        self._swap_step = 0

    def _bind(self, byte_offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        itemsize = torch.empty((), dtype=DTYPE).element_size()
        cache = torch.as_strided(
            self.slab.view(DTYPE), size=(self.num_blocks, BLOCK, ROW_WIDTH),
            stride=(self.block_stride // itemsize, ROW_WIDTH, 1), storage_offset=byte_offset // itemsize,
        )
        attention_cache = self.slab[byte_offset:].view(DTYPE).view(-1, BLOCK, ROW_WIDTH)
        return cache, attention_cache

    def step_rows(self, num_tokens: int) -> slice:
        start = self._swap_step * num_tokens
        self._swap_step += 1
        return slice(start, start + num_tokens)

    def masked_request_ids(self, req_id_per_token: torch.Tensor, num_valid_rows: torch.Tensor) -> torch.Tensor:
        """``_resolve_and_stage_group``: padding rows past ``num_valid_rows`` get request id -1."""
        num_tokens = req_id_per_token.shape[0]
        request_ids = self.request_ids[:num_tokens]
        request_ids.copy_(req_id_per_token)
        request_ids.masked_fill_(self.row_indices[:num_tokens] >= num_valid_rows, -1)
        return request_ids

    def resolve(self, ops: Any, *, req_id_per_token: torch.Tensor, topk_indices: torch.Tensor,
                shared_rows: slice, resident: bool, return_valid_counts: bool) -> None:
        """``HiSparseRuntime._resolve_residency``, argument for argument."""
        num_tokens = topk_indices.shape[0]
        valid_topk_counts = self.valid_topk_counts[shared_rows] if return_valid_counts else None
        ops.resolve_residency(
            self.host_cache[0],
            self.hot[0][0],
            self.hot_block_table,
            topk_indices,
            self.device_topk_rows[shared_rows],
            self.device_global_indices,
            self.lru_slots,
            self.request_state_indices,
            REGION,
            MAX_UNION,
            None,
            self.swap_stats,
            self.physical_topk_indices[shared_rows],
            self.attention_block_stride,
            req_id_per_token[:num_tokens].contiguous(),
            self.source_block_table,
            BLOCK,
            None,
            valid_topk_counts,
            self.swap_host_physical_rows[shared_rows],
            self.swap_device_physical_rows[shared_rows],
            self.swap_counts[shared_rows],
            self.residency[0] if resident else None,
            BLOCK if resident else 0,
            0,
        )

    def swap_rows(self, ops: Any, layer: int, shared_rows: slice) -> None:
        """``HiSparseRuntime._swap_rows`` for one layer."""
        ops.gather_compact(
            self.host_cache[layer],
            self.hot[layer][0],
            self.swap_host_physical_rows[shared_rows],
            self.swap_device_physical_rows[shared_rows],
            self.swap_counts[shared_rows],
        )

    def invalidate_written_slots(self, ops: Any, written_slots: torch.Tensor, req_id_per_token: torch.Tensor) -> None:
        """``HiSparseRuntime.invalidate_written_slots``."""
        num_tokens = min(written_slots.numel(), req_id_per_token.numel())
        ops.invalidate_written_slots(
            self.device_global_indices,
            self.request_state_indices,
            req_id_per_token[:num_tokens],
            written_slots[:num_tokens],
        )

    def gather_prefill_cache(self, ops: Any, layer: int, row_ids: torch.Tensor, miss_mask: torch.Tensor,
                             gpu_row_ids: torch.Tensor | None) -> torch.Tensor:
        """``HiSparseRuntime.gather_prefill_cache`` with a staging plan of ``row_ids`` ([1, blocks * B])."""
        kv_cache = self.host_kv[layer]
        num_blocks = row_ids.shape[1] // BLOCK
        staged = torch.empty((max(num_blocks, -(-256 // BLOCK)), BLOCK, ROW_WIDTH), dtype=DTYPE)[:num_blocks]
        staged.view(torch.uint8).fill_(0xAB)
        if gpu_row_ids is not None:
            resident_cache = self.hot[layer][0]
            src = gpu_row_ids[0].to(torch.long).clamp_min(0)
            staged.view(-1, ROW_WIDTH).copy_(resident_cache[src // BLOCK, src % BLOCK])
        dst_rows = torch.arange(row_ids.shape[1], dtype=I32).view(1, -1)
        ops.gather_plan(kv_cache.view(-1, ROW_WIDTH), staged, row_ids, dst_rows, miss_mask, None, None, 0)
        return staged

    def state(self) -> dict[str, torch.Tensor]:
        return {
            "device_topk_rows": self.device_topk_rows, "physical_topk_indices": self.physical_topk_indices,
            "swap_host_physical_rows": self.swap_host_physical_rows, "swap_counts": self.swap_counts,
            "swap_device_physical_rows": self.swap_device_physical_rows, "valid_topk_counts": self.valid_topk_counts,
            "device_global_indices": self.device_global_indices, "lru_slots": self.lru_slots,
            "swap_stats": self.swap_stats.view(torch.int64), "slab": self.slab,
        }


def _schedule(runtime: Runtime) -> None:
    """Two requests: state rows 3 and 1 at batch rows 0 and 1; request 0 has a resident tail page."""
    runtime.request_state_indices[:2] = torch.tensor([3, 1], dtype=I32)
    runtime.hot_block_table[0, :3] = torch.tensor([5, 9, 2], dtype=I32)
    runtime.hot_block_table[1, :3] = torch.tensor([14, 7, 11], dtype=I32)
    runtime.source_block_table[0, :4] = torch.tensor([3, 8, 12, 6], dtype=I32)
    runtime.source_block_table[1, :4] = torch.tensor([10, 4, 15, 1], dtype=I32)
    runtime.residency[0, 0, 3] = 20  # indexed by batch row, as kernel K reads it (and by state row 3 too)
    runtime.residency[0, 3, 3] = 20


def _decode_step(runtime: Runtime, ops: Any, topk: list[list[int]], req_id_per_token: list[int], num_valid: int,
                 *, return_valid_counts: bool = True) -> slice:
    """One FULL-graph decode step: resolve on the leader, then gather_compact for every layer (prefetch)."""
    num_tokens = len(topk)
    indexer_out = torch.full((MAX_SWAP_ROWS, TOP_K + 3), -1, dtype=I32)  # the indexer's buffer: rows strided
    topk_indices = indexer_out[:num_tokens, :TOP_K]
    topk_indices.copy_(torch.tensor(topk, dtype=I32))
    rows = runtime.step_rows(num_tokens)
    request_ids = runtime.masked_request_ids(torch.tensor(req_id_per_token, dtype=I32),
                                             torch.tensor([num_valid], dtype=I32))
    runtime.resolve(ops, req_id_per_token=request_ids, topk_indices=topk_indices, shared_rows=rows, resident=True,
                    return_valid_counts=return_valid_counts)
    for layer in range(LAYERS):
        runtime.swap_rows(ops, layer, rows)
    return rows


STEP_ONE = ([[0, 5, 13, -1], [5, 9, 2, 14], [1, 6, 30, 3], [0, 1, 2, 3]], [0, 0, 1, 0], 3)  # row 3: graph padding
STEP_TWO = ([[5, 9, 4, 15], [14, 15, 7, 8], [6, 1, 3, 11], [2, 2, 2, 2]], [0, 0, 1, 0], 3)


def _run_forward(ops: Any) -> tuple[Runtime, list[slice]]:
    runtime = Runtime()
    _schedule(runtime)
    slices = [_decode_step(runtime, ops, *STEP_ONE)]
    slices.append(_decode_step(runtime, ops, *STEP_TWO, return_valid_counts=False))  # 2nd swap_in, same forward
    return runtime, slices


@pytest.fixture(params=list(IMPLEMENTATIONS))
def ops(request: pytest.FixtureRequest) -> Any:
    return IMPLEMENTATIONS[request.param]()


@pytest.mark.parametrize("name", [name for name in IMPLEMENTATIONS if name != "oracle"])
def test_vllm_resolve_and_swap_rows_calls_match_the_oracle_bit_for_bit(name: str) -> None:
    # The oracle itself is checked against worked-out expectations by the tests below, not against itself.
    ops = IMPLEMENTATIONS[name]()
    expected, _ = _run_forward(oracle)
    actual, _ = _run_forward(ops)
    for name, tensor in expected.state().items():
        assert torch.equal(actual.state()[name], tensor), f"{name} differs from the oracle"


def test_vllm_calls_leave_the_attention_rows_of_every_layer_holding_the_selected_host_rows(ops: Any) -> None:
    runtime, slices = _run_forward(ops)
    rows = slices[-1]
    topk, request_of, num_valid = STEP_TWO
    attention = runtime.physical_topk_indices[rows].tolist()
    for r, q in enumerate(request_of):
        if r >= num_valid:
            assert attention[r] == [-1] * TOP_K, "graph-padding rows must come out -1"
            continue
        for c, t in enumerate(topk[r]):
            page, offset = divmod(t, BLOCK)
            if runtime.residency[0, q, page] > 0:
                assert attention[r][c] == (20 * BLOCK + offset) // BLOCK * runtime.attention_block_stride + offset
                continue
            host_row = int(runtime.source_block_table[q, page]) * BLOCK + offset
            for layer in range(LAYERS):
                held = runtime.hot[layer][1].reshape(-1, ROW_WIDTH)[attention[r][c]]
                assert torch.equal(held, runtime.host_cache[layer][host_row]), (r, c, layer)


def test_vllm_forward_counts_hits_and_misses_in_the_uint64_swap_stats(ops: Any) -> None:
    runtime, slices = _run_forward(ops)
    assert runtime.swap_stats.dtype == torch.uint64
    first, _ = slices
    assert runtime.valid_topk_counts[first].tolist() == [3, 4, 3, 0]
    hits, misses = runtime.swap_stats.view(torch.int64).tolist()
    # Step 1: request 0 loads tokens 0, 5, 9, 2 (token 5 again in row 1 is a hit; 13 and 14 are resident);
    # request 1 loads 1, 6, 3 (30 is past its source table). Step 2: request 0 hits 5, 9 and loads 4, 7, 8;
    # request 1 hits 6, 1, 3 and loads 11. Graph-padding rows count nothing.
    assert (hits, misses) == (1 + 2 + 3, 4 + 3 + 3 + 1)


def test_vllm_invalidate_written_slots_call_drops_the_rewritten_host_rows(ops: Any) -> None:
    runtime, _ = _run_forward(ops)
    host_row = int(runtime.source_block_table[0, 1]) * BLOCK + 1  # request 0's token 5, now rewritten
    held = runtime.device_global_indices[3].tolist()
    assert host_row in held
    slot_mapping = torch.tensor([host_row, -1, int(runtime.source_block_table[1, 0]) * BLOCK + 1, 7],
                                dtype=torch.int64)
    req_id_per_token = torch.tensor([0, 0, 1], dtype=I32)  # shorter than slot_mapping: min() of both is used
    runtime.invalidate_written_slots(ops, slot_mapping, req_id_per_token)
    after = runtime.device_global_indices.tolist()
    assert after[3] == [-1 if x == host_row else x for x in held]
    assert int(runtime.source_block_table[1, 0]) * BLOCK + 1 not in after[1]


def test_vllm_gather_prefill_cache_call_stages_missed_rows_over_the_resident_ones(ops: Any) -> None:
    runtime = Runtime(seed=3)
    row_ids = torch.tensor([[12, 13, 14, 15, -1, 40, 7, 70]], dtype=I32)
    gpu_row_ids = torch.tensor([[-1, 21, -1, -1, -1, -1, -1, -1]], dtype=I32)
    miss_mask = ((gpu_row_ids < 0) & (row_ids >= 0)).to(I32)
    staged = runtime.gather_prefill_cache(ops, 1, row_ids, miss_mask, gpu_row_ids)
    rows = staged.view(-1, ROW_WIDTH)
    host = runtime.host_cache[1]
    resident = runtime.hot[1][0]
    for i, g in enumerate(row_ids[0].tolist()):
        if gpu_row_ids[0, i] >= 0:
            assert torch.equal(rows[i], resident[21 // BLOCK, 21 % BLOCK])
        elif g < 0:
            assert torch.equal(rows[i], resident[0, 0]), "unmasked rows keep the resident-gather bytes (row 0)"
        elif g >= host.shape[0]:
            assert rows[i].view(torch.uint8).tolist() == [0] * runtime.row_bytes
        else:
            assert torch.equal(rows[i], host[g])
