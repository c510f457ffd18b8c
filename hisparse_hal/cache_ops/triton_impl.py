"""The four HiSparse cache ops as Triton kernels (NVIDIA and AMD from one source), with vLLM 0.33.0's signatures.

Every op checks its arguments with :mod:`hisparse_hal.cache_ops.arguments` first (metadata only, no host
sync), then launches a fixed grid whose counts are read on the device. Triton is imported on first use
(:func:`kernels`), so this module imports without it; on CPU tensors the kernels run under
``TRITON_INTERPRET=1``. The implementations never move data between devices: on a GPU, ``host_cache`` is
the device view of pinned host memory (``TorchGpuBackend.device_view_of_host``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import types
from collections.abc import Iterator
from typing import Any

import torch

from hisparse_hal.errors import UnsupportedCapabilityError

from . import arguments

__all__ = [
    "resolve_residency", "gather_compact", "gather_plan", "invalidate_written_slots", "kernels",
    "Launch", "counting_launches",
    "plan_resolve_residency", "plan_gather_compact", "plan_gather_plan", "plan_invalidate_written_slots",
]

#: Tile widths. Slots and positions are scanned in tiles of this many lanes with ``tl.cumsum``; any power
#: of two gives the same result (the scans are block-level, not warp- or wave-level).
_BLOCK = 1024
_BLOCK_ROWS = 256
_GATHER_COLUMNS = 16
#: Programs of a gather launch at most: each walks the plan's tiles grid-stride (tile i, i + P, ...), so the
#: grid is fixed by the plan's shape and a tile past a row's count costs one load. 2,048 programs of 4 warps
#: is about 16 per SM on a 132-SM H100/H200 and 7 per CU on a 304-CU MI300X.
_GATHER_PROGRAMS = 2048


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch as an op makes it: the kernel's name in the kernel module, the grid, the positional
    arguments and the constexpr keyword arguments. ``hisparse-hal kernels`` compiles these same objects."""

    kernel: str
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    constexprs: dict[str, Any]


#: Open launch counters (:func:`counting_launches`), innermost last.
_COUNTERS: list[collections.Counter[str]] = []


@contextlib.contextmanager
def counting_launches() -> Iterator[collections.Counter[str]]:
    """Count the kernel launches the Triton ops make while the block runs, by kernel name.

    A decode step of vLLM's (resolve_residency, then gather_compact per layer) is 2 + 1 launches per layer;
    gather_plan and invalidate_written_slots are one each; an op with an empty batch launches nothing.

    Returns:
        A ``collections.Counter`` (kernel name -> launches), filled as launches happen; ``sum(c.values())``
        is the total. Counters nest: an inner block's launches count in the outer one too.
    """
    counter: collections.Counter[str] = collections.Counter()
    _COUNTERS.append(counter)
    try:
        yield counter
    finally:
        _COUNTERS.remove(counter)


def _launch(launches: list[Launch], device: torch.device) -> None:
    module = kernels(device)
    for launch in launches:
        getattr(module, launch.kernel)[launch.grid](*launch.args, **launch.constexprs)
        for counter in _COUNTERS:
            counter[launch.kernel] += 1


def kernels(device: torch.device | None = None) -> types.ModuleType:
    """The kernel module (imports triton on first call), checked against the tensors' ``device``.

    Raises:
        UnsupportedCapabilityError: triton is not installed or does not import, or ``device`` is not a GPU
            and the kernels were not defined for triton's interpreter.
    """
    module = _kernel_module()
    if device is not None and device.type != "cuda" and not module.INTERPRETED:
        raise UnsupportedCapabilityError(
            f"the Triton cache ops got tensors on {device}; triton runs CPU tensors only through its "
            "interpreter, which must be on (TRITON_INTERPRET=1) before the first cache-op call"
        )
    return module


@functools.lru_cache(maxsize=1)
def _kernel_module() -> types.ModuleType:
    try:
        from . import triton_kernels
    except ImportError as exc:  # triton missing or broken
        raise UnsupportedCapabilityError(
            f"the Triton cache ops need triton, which does not import here ({exc}); install "
            "'hisparse-hal[triton]' or use the torch implementation (HISPARSE_HAL_CACHE_OPS=torch)"
        ) from exc
    return triton_kernels


def _pow2(n: int, floor: int = 16, cap: int = _BLOCK) -> int:
    size = floor
    while size < min(n, cap):
        size *= 2
    return size


def _words(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` reinterpreted as int32 words (rows are multiples of 16 bytes), else as bytes."""
    try:
        return tensor.view(torch.int32)
    except RuntimeError:  # a block stride or offset that is not a whole number of words
        return tensor.view(torch.uint8)


def _or_dummy(tensor: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return tensor if tensor is not None else like


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
    miss_mask: torch.Tensor | None,
    stats: torch.Tensor | None,
    attention_indices: torch.Tensor | None,
    attention_block_stride: int,
    request_ids: torch.Tensor | None,
    source_block_table: torch.Tensor | None,
    source_block_size: int,
    resolved_global_indices: torch.Tensor | None,
    valid_counts: torch.Tensor | None,
    swap_host_physical_rows: torch.Tensor | None,
    swap_device_physical_rows: torch.Tensor | None,
    swap_counts: torch.Tensor | None,
    resident_block_table: torch.Tensor | None,
    resident_block_size: int,
    resident_null_block: int,
    *,
    error_flags: torch.Tensor | None = None,
) -> None:
    """Plan one decode step: translate top-k, find hot hits, pick LRU victims, update DGI/LRU, list swaps.

    Semantics, arguments and outputs exactly as ``hisparse_resolve_residency`` in vLLM 0.33.0 (see
    ``docs/design/cache-ops.md``); in place, returns None. Two launches of one program per batch row; the
    first row of each run (rows with one request id) handles the whole run in tiles: launch 1 builds the
    run's union in a hash table in global scratch (no shared-memory limit, unlike the CUDA kernel's on
    64 KiB-LDS AMD parts), launch 2 does the rest.

    Args:
        error_flags: optional int32 ``[1]`` on the ops' device, OR-ed with 1 (a run's union overflowed
            ``max_union_rows``; it was treated as padding), 2 (an LRU victim slot was out of range) and 4
            (a state row used by two runs; the later one was treated as padding).

    Raises:
        InvalidArgumentError: a dtype, shape, device, stride or scalar that vLLM's op would reject.
        UnsupportedCapabilityError: triton is not available.
    """
    arguments.check_resolve_residency(
        host_cache, hot_cache, hot_block_table, global_indices, hot_indices, device_global_indices, lru_slots,
        request_state_indices, region_stride, max_union_rows, miss_mask, stats, attention_indices,
        attention_block_stride, request_ids, source_block_table, source_block_size, resolved_global_indices,
        valid_counts, swap_host_physical_rows, swap_device_physical_rows, swap_counts, resident_block_table,
        resident_block_size, resident_null_block, error_flags=error_flags,
    )
    _launch(
        plan_resolve_residency(
            host_cache, hot_cache, hot_block_table, global_indices, hot_indices, device_global_indices, lru_slots,
            request_state_indices, max_union_rows, miss_mask, stats, attention_indices, attention_block_stride,
            request_ids, source_block_table, source_block_size, resolved_global_indices, valid_counts,
            swap_host_physical_rows, swap_device_physical_rows, swap_counts, resident_block_table,
            resident_block_size, resident_null_block, error_flags,
        ),
        global_indices.device,
    )


def plan_resolve_residency(
    host_cache: torch.Tensor,
    hot_cache: torch.Tensor,
    hot_block_table: torch.Tensor,
    global_indices: torch.Tensor,
    hot_indices: torch.Tensor,
    device_global_indices: torch.Tensor,
    lru_slots: torch.Tensor,
    request_state_indices: torch.Tensor | None,
    max_union_rows: int,
    miss_mask: torch.Tensor | None,
    stats: torch.Tensor | None,
    attention_indices: torch.Tensor | None,
    attention_block_stride: int,
    request_ids: torch.Tensor | None,
    source_block_table: torch.Tensor | None,
    source_block_size: int,
    resolved_global_indices: torch.Tensor | None,
    valid_counts: torch.Tensor | None,
    swap_host_physical_rows: torch.Tensor | None,
    swap_device_physical_rows: torch.Tensor | None,
    swap_counts: torch.Tensor | None,
    resident_block_table: torch.Tensor | None,
    resident_block_size: int,
    resident_null_block: int,
    error_flags: torch.Tensor | None,
) -> list[Launch]:
    """The launches of :func:`resolve_residency` for checked arguments (``region_stride`` aside, which the
    kernels do not need): two, or none for an empty batch. Allocates the call's scratch on the tensors' device
    (``meta`` tensors give a plan without memory, as ``hisparse-hal kernels`` uses it)."""
    rows, top_k = global_indices.shape
    if rows == 0 or top_k == 0:
        return []
    device = global_indices.device
    slots = device_global_indices.size(1)
    block_size = hot_cache.size(1)
    scratch = _Scratch(rows, top_k, slots, device)
    dummy = hot_indices
    src = _or_dummy(source_block_table, dummy)
    res = _or_dummy(resident_block_table, dummy)
    att = _or_dummy(attention_indices, dummy)
    valid = _or_dummy(valid_counts, dummy)
    flags = dict(
        HAS_RSI=request_state_indices is not None,
        HAS_RID=request_ids is not None,
        HAS_SRC=source_block_table is not None,
        HAS_RES=resident_block_table is not None,
    )
    state_rows = request_state_indices.numel() if request_state_indices is not None else 0
    source = (
        src, src.size(0) if source_block_table is not None else 0,
        src.size(1) if source_block_table is not None else 0, src.stride(0), max(source_block_size, 1),
        res, res.size(0) if resident_block_table is not None else 0,
        res.size(1) if resident_block_table is not None else 0, res.stride(0), max(resident_block_size, 1),
        resident_null_block,
    )
    union = Launch("resolve_union_kernel", (rows,), (
        host_cache.size(0), rows, top_k, device_global_indices.size(0),
        global_indices, global_indices.stride(0),
        _or_dummy(request_state_indices, dummy), state_rows,
        _or_dummy(request_ids, dummy),
        *source,
        scratch.keys, scratch.first, scratch.kind, scratch.cells, scratch.union,
    ), dict(BLOCK_K=_pow2(top_k), **flags))
    residency = Launch("resolve_residency_kernel", (rows,), (
        host_cache.size(0), block_size, rows, top_k, slots, device_global_indices.size(0), max_union_rows,
        hot_block_table, hot_block_table.size(0), hot_block_table.size(1), hot_block_table.stride(0),
        global_indices, global_indices.stride(0),
        hot_indices,
        device_global_indices, lru_slots,
        _or_dummy(request_state_indices, dummy), state_rows,
        _or_dummy(request_ids, dummy),
        *source,
        _or_dummy(miss_mask, dummy),
        stats.view(torch.int64) if stats is not None else dummy,
        att, att.stride(0), attention_block_stride,
        _or_dummy(resolved_global_indices, dummy),
        valid, valid.stride(0) if valid_counts is not None else 0,
        _or_dummy(swap_host_physical_rows, dummy),
        _or_dummy(swap_device_physical_rows, dummy),
        _or_dummy(swap_counts, dummy),
        _or_dummy(error_flags, dummy),
        scratch.keys, scratch.first, scratch.kind, scratch.slot, scratch.cells, scratch.order, scratch.union,
    ), dict(
        HAS_MISS=miss_mask is not None,
        HAS_STATS=stats is not None,
        HAS_ATT=attention_indices is not None,
        HAS_RESOLVED=resolved_global_indices is not None,
        HAS_VALID=valid_counts is not None,
        HAS_SWAP=swap_counts is not None,
        HAS_ERR=error_flags is not None,
        BLOCK_K=_pow2(top_k),
        BLOCK_H=_pow2(slots),
        BLOCK_R=_pow2(rows, cap=_BLOCK_ROWS),
        **flags,
    ))
    return [union, residency]


class _Scratch:
    """Global-memory scratch of one resolve call: a hash table of 2 cells per position, the position->cell
    map, one LRU-ordered slot list per run (each run uses the part indexed by its first row) and each run's
    union size (at its first row)."""

    def __init__(self, rows: int, top_k: int, slots: int, device: torch.device) -> None:
        cells = 2 * rows * top_k
        self.keys = torch.empty(cells, dtype=torch.int32, device=device)
        self.first = torch.empty(cells, dtype=torch.int32, device=device)
        self.kind = torch.empty(cells, dtype=torch.int32, device=device)
        self.slot = torch.empty(cells, dtype=torch.int32, device=device)
        self.cells = torch.empty(rows * top_k, dtype=torch.int32, device=device)
        self.order = torch.empty(rows * slots, dtype=torch.int32, device=device)
        self.union = torch.empty(rows, dtype=torch.int32, device=device)


def gather_compact(
    host_cache: torch.Tensor,
    hot_cache: torch.Tensor,
    miss_global_indices: torch.Tensor,
    miss_hot_indices: torch.Tensor,
    miss_counts: torch.Tensor,
) -> None:
    """Copy the compact swap plan from host rows to hot rows (``hisparse_gather_compact``).

    For each row ``r``, the first ``clamp(miss_counts[r], 0, K)`` entries: host row ``g`` to physical hot
    row ``d``; ``g >= host_rows`` writes zeros; negative ``g`` or ``d``, or ``d`` past the hot cache, are
    skipped. The count is read on the device; the grid is fixed by the shapes.

    Raises:
        InvalidArgumentError: as vLLM's op would. UnsupportedCapabilityError: triton is not available.
    """
    arguments.check_gather_compact(host_cache, hot_cache, miss_global_indices, miss_hot_indices, miss_counts)
    _launch(plan_gather_compact(host_cache, hot_cache, miss_global_indices, miss_hot_indices, miss_counts),
            miss_global_indices.device)


def plan_gather_compact(
    host_cache: torch.Tensor,
    hot_cache: torch.Tensor,
    miss_global_indices: torch.Tensor,
    miss_hot_indices: torch.Tensor,
    miss_counts: torch.Tensor,
) -> list[Launch]:
    """The launch of :func:`gather_compact` for checked arguments (none for an empty plan)."""
    return _plan_gather(host_cache, hot_cache, miss_global_indices, miss_hot_indices, None, miss_counts, None,
                        None, 0)


def gather_plan(
    host_cache: torch.Tensor,
    hot_cache: torch.Tensor,
    global_indices: torch.Tensor,
    hot_indices: torch.Tensor,
    miss_mask: torch.Tensor,
    request_state_indices: torch.Tensor | None,
    attention_indices: torch.Tensor | None,
    attention_block_stride: int,
) -> None:
    """Masked gather from host rows into a hot or staging buffer (``hisparse_gather_plan``).

    ``request_state_indices`` is indexed by plan row; a negative entry marks a padding row (nothing copied,
    attention index -1). ``attention_indices``, when given, is written for every column.

    Raises:
        InvalidArgumentError: as vLLM's op would. UnsupportedCapabilityError: triton is not available.
    """
    arguments.check_gather_plan(
        host_cache, hot_cache, global_indices, hot_indices, miss_mask, request_state_indices, attention_indices,
        attention_block_stride,
    )
    _launch(
        plan_gather_plan(host_cache, hot_cache, global_indices, hot_indices, miss_mask, request_state_indices,
                         attention_indices, attention_block_stride),
        global_indices.device,
    )


def plan_gather_plan(
    host_cache: torch.Tensor,
    hot_cache: torch.Tensor,
    global_indices: torch.Tensor,
    hot_indices: torch.Tensor,
    miss_mask: torch.Tensor,
    request_state_indices: torch.Tensor | None,
    attention_indices: torch.Tensor | None,
    attention_block_stride: int,
) -> list[Launch]:
    """The launch of :func:`gather_plan` for checked arguments (none for an empty plan)."""
    return _plan_gather(host_cache, hot_cache, global_indices, hot_indices, miss_mask, None, request_state_indices,
                        attention_indices, attention_block_stride)


def _plan_gather(
    host_cache: torch.Tensor,
    hot_cache: torch.Tensor,
    global_indices: torch.Tensor,
    hot_indices: torch.Tensor,
    miss_mask: torch.Tensor | None,
    counts: torch.Tensor | None,
    request_state_indices: torch.Tensor | None,
    attention_indices: torch.Tensor | None,
    attention_block_stride: int,
) -> list[Launch]:
    rows, columns = global_indices.shape
    if rows == 0 or columns == 0:
        return []
    paged = hot_cache if hot_cache.dim() == 3 else hot_cache.unsqueeze(1)  # 2-D staging: block size 1
    host_words, hot_words = _words(host_cache), _words(paged)
    if host_words.dtype != hot_words.dtype:
        host_words, hot_words = host_cache.view(torch.uint8), paged.view(torch.uint8)
    row_words = host_words.size(1)
    block_count, block_size = paged.size(0), paged.size(1)
    dummy = hot_indices
    tiles_per_row = -(-columns // _GATHER_COLUMNS)
    tiles = rows * tiles_per_row
    return [Launch("gather_rows_kernel", (min(tiles, _GATHER_PROGRAMS),), (
        host_words, hot_words, global_indices, hot_indices, _or_dummy(miss_mask, dummy), _or_dummy(counts, dummy),
        _or_dummy(request_state_indices, dummy), _or_dummy(attention_indices, dummy),
        columns, tiles_per_row, tiles, host_cache.size(0), block_count * block_size, block_size,
        hot_words.stride(0), hot_words.stride(1), row_words, attention_block_stride,
    ), dict(
        COMPACT=counts is not None,
        HAS_RSI=request_state_indices is not None,
        HAS_ATT=attention_indices is not None,
        BLOCK_C=_GATHER_COLUMNS,
        BLOCK_W=_pow2(row_words, cap=256),
    ))]


def invalidate_written_slots(
    device_global_indices: torch.Tensor,
    request_state_indices: torch.Tensor,
    req_id_per_token: torch.Tensor,
    written_slots: torch.Tensor,
) -> None:
    """Drop hot copies of host rows rewritten this step (``hisparse_invalidate_written_slots``).

    For each token ``t`` with a request ``q`` in range, state ``s`` in range and ``written_slots[t] >= 0``,
    every entry of ``device_global_indices[s]`` equal to it becomes -1.

    Raises:
        InvalidArgumentError: as vLLM's op would. UnsupportedCapabilityError: triton is not available.
    """
    arguments.check_invalidate_written_slots(
        device_global_indices, request_state_indices, req_id_per_token, written_slots
    )
    _launch(plan_invalidate_written_slots(device_global_indices, request_state_indices, req_id_per_token,
                                          written_slots), device_global_indices.device)


def plan_invalidate_written_slots(
    device_global_indices: torch.Tensor,
    request_state_indices: torch.Tensor,
    req_id_per_token: torch.Tensor,
    written_slots: torch.Tensor,
) -> list[Launch]:
    """The launch of :func:`invalidate_written_slots` for checked arguments (none without tokens or slots)."""
    tokens = req_id_per_token.numel()
    if tokens == 0 or device_global_indices.numel() == 0:
        return []
    slots = device_global_indices.size(1)
    return [Launch("invalidate_written_slots_kernel", (tokens,), (
        device_global_indices, request_state_indices, req_id_per_token, written_slots,
        request_state_indices.numel(), device_global_indices.size(0), slots,
    ), dict(BLOCK_H=_pow2(slots)))]
