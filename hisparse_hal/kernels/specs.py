"""The Triton launches ``hisparse-hal kernels`` compiles: the ops' own launch plans at DeepSeek-V3.2 shapes.

Each case lays out ``meta`` tensors (shapes, strides and storage sizes, no memory) the way vLLM 0.34.0's
HiSparse runtime passes them (design note §2 B9-B11, B16), checks them with
:mod:`hisparse_hal.cache_ops.arguments` and asks :mod:`hisparse_hal.cache_ops.triton_impl` for its launches, so the
constexprs, tile sizes and argument values are the ones the ops pick, not a copy of them.
"""

from __future__ import annotations

import dataclasses

import torch

from hisparse_hal.cache_ops import arguments, triton_impl
from hisparse_hal.cache_ops.shapes import BLOCK, ROW_BYTES, TOP_K

__all__ = ["KernelCase", "LANE_TOP_K", "REQUESTS", "production_cases", "lane_cases", "all_cases"]

#: Top-k values around 32- and 64-lane boundaries (an NVIDIA warp, an AMD wavefront) and a tile floor.
LANE_TOP_K = (1, 31, 32, 33, 63, 64, 65, 128)
#: Decode requests in the production cases (the bench's smallest case).
REQUESTS = 64
#: Tokens of context per request; host pool rows = (1 + requests x pages) x block (block 0 is null).
CONTEXT = 8192
#: Host rows of the large-pool gather: 2^22 rows x 656 bytes = 2.6 GiB, past the 2 GiB within which
#: Triton's AMD backend specializes a pointer for 32-bit buffer offsets (``HIPBackend.is_within_2gb``).
LARGE_POOL_ROWS = 1 << 22
#: Prefill tokens staged by one gather_plan (``gather_prefill_cache``).
PREFILL_TOKENS = 8192
I32 = torch.int32


@dataclasses.dataclass(frozen=True)
class KernelCase:
    """One launch to compile: which op makes it, at which shape, and whether it is a production shape."""

    op: str
    shape: str
    production: bool
    launch: triton_impl.Launch

    @property
    def kernel(self) -> str:
        return self.launch.kernel

    @property
    def name(self) -> str:
        return f"{self.kernel}[{self.shape}]"


def _meta(*shape: int, dtype: torch.dtype = I32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def _resolve(requests: int, queries: int, top_k: int, slots: int) -> list[triton_impl.Launch]:
    """``HiSparseRuntime`` resolve (``runtime.py:904-930``): rows = requests x queries (an MTP run per request),
    hot buffer ``slots`` per request in a layer-interleaved slab (block stride 2 layers), row-strided attention
    indices, valid counts, stats, swap lists, the residency table by state row and ``num_valid_rows``."""
    rows, pages = requests * queries, CONTEXT // BLOCK
    hot_blocks = requests * (-(-slots // BLOCK))
    slab = torch.empty(hot_blocks * 2 * BLOCK * ROW_BYTES, dtype=torch.uint8, device="meta")
    hot = torch.as_strided(slab, (hot_blocks, BLOCK, ROW_BYTES), (2 * BLOCK * ROW_BYTES, ROW_BYTES, 1))
    inputs = arguments.check_resolve_residency(
        host_cache=_meta((1 + requests * pages) * BLOCK, ROW_BYTES, dtype=torch.uint8),
        hot_cache=hot,
        hot_block_table=_meta(requests, hot_blocks // requests),
        global_indices=_meta(rows, top_k),
        hot_indices=_meta(rows, top_k),
        device_global_indices=_meta(requests, slots),
        lru_slots=_meta(requests, slots, dtype=torch.int16),
        request_state_indices=_meta(requests),
        region_stride=slots,
        max_union_rows=queries * top_k,
        stats=_meta(2, dtype=torch.uint64),
        attention_indices=_meta(rows, top_k + 64)[:, :top_k],
        attention_block_stride=2 * BLOCK,
        request_ids=_meta(rows),
        source_block_table=_meta(requests, pages),
        source_block_size=BLOCK,
        valid_counts=_meta(rows),
        swap_host_physical_rows=_meta(rows, top_k),
        swap_device_physical_rows=_meta(rows, top_k),
        swap_counts=_meta(rows),
        resident_block_table=_meta(requests, pages),  # by state row
        resident_block_size=BLOCK,
        num_valid_rows=_meta(1),
    )
    return triton_impl.plan_resolve_residency(inputs)


def _compact(rows: int, top_k: int, host_rows: int, hot_blocks: int) -> list[triton_impl.Launch]:
    """``runtime.py:935-941``: one layer's compact swap plan, ``[rows, top_k]``."""
    return triton_impl.plan_gather(arguments.check_gather_compact(
        _meta(host_rows, ROW_BYTES, dtype=torch.uint8), _meta(hot_blocks, BLOCK, ROW_BYTES, dtype=torch.uint8),
        _meta(rows, top_k), _meta(rows, top_k), _meta(rows),
    ))


def _plan(tokens: int) -> list[triton_impl.Launch]:
    """``runtime.py:808-814``: a ``[1, tokens]`` plan into a fresh contiguous 3-D staged buffer."""
    return triton_impl.plan_gather(arguments.check_gather_plan(
        _meta((1 + REQUESTS * CONTEXT // BLOCK) * BLOCK, ROW_BYTES, dtype=torch.uint8),
        _meta(tokens // BLOCK, BLOCK, ROW_BYTES, dtype=torch.uint8),
        _meta(1, tokens), _meta(1, tokens), _meta(1, tokens),
    ))


def _invalidate(requests: int, slots: int, tokens: int, groups: int = 2) -> list[triton_impl.Launch]:
    """``runtime.py:1078-1085``: one launch over every index-group leader's table (``groups`` addresses)."""
    inputs = arguments.check_invalidate_written_slots(
        _meta(groups, dtype=torch.int64), _meta(requests), _meta(tokens), _meta(tokens, dtype=torch.int64),
        requests, slots,
    )
    return triton_impl.plan_invalidate_written_slots(inputs)


def _cases(op: str, shape: str, production: bool, launches: list[triton_impl.Launch]) -> list[KernelCase]:
    return [KernelCase(op, shape, production, launch) for launch in launches]


def production_cases(requests: int = REQUESTS) -> list[KernelCase]:
    """Top-k 2048, 656-byte rows, hot 2x (decode, one row per request) and 5x (MTP, 4 rows per request)."""
    k = TOP_K
    pool = (1 + requests * CONTEXT // BLOCK) * BLOCK
    cases: list[KernelCase] = []
    for queries, hot in ((1, 2), (4, 5)):
        shape = f"k={k} hot={hot}x rows={requests * queries}"
        cases += _cases("resolve_residency", shape, True, _resolve(requests, queries, k, hot * k))
        cases += _cases("invalidate_written_slots", f"hot={hot}x tokens={requests * queries}", True,
                        _invalidate(requests, hot * k, requests * queries))
    blocks = requests * 2 * k // BLOCK
    cases += _cases("gather_compact", f"k={k} rows={requests} pool={pool}", True, _compact(requests, k, pool, blocks))
    cases += _cases("gather_compact", f"k={k} rows={requests} pool={LARGE_POOL_ROWS} (>2 GiB)", True,
                    _compact(requests, k, LARGE_POOL_ROWS, blocks))
    cases += _cases("gather_plan", f"prefill tokens={PREFILL_TOKENS}", True, _plan(PREFILL_TOKENS))
    return cases


def lane_cases(top_ks: tuple[int, ...] = LANE_TOP_K, requests: int = REQUESTS) -> list[KernelCase]:
    """Each top-k in ``top_ks`` with hot 2x: resolve, gather_compact and invalidate."""
    cases: list[KernelCase] = []
    for k in top_ks:
        pool = (1 + requests * CONTEXT // BLOCK) * BLOCK
        cases += _cases("resolve_residency", f"k={k} hot=2x rows={requests}", False, _resolve(requests, 1, k, 2 * k))
        cases += _cases("gather_compact", f"k={k} rows={requests}", False,
                        _compact(requests, k, pool, requests * -(-2 * k // BLOCK)))
        cases += _cases("invalidate_written_slots", f"k={k} hot=2x tokens={requests}", False,
                        _invalidate(requests, 2 * k, requests))
    return cases


def all_cases() -> list[KernelCase]:
    """Production cases, then the lane-boundary ones."""
    return production_cases() + lane_cases()
