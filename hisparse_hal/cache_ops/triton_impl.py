"""The four vLLM 0.34.0 HiSparse cache ops as Triton kernels (NVIDIA and AMD from one source).

Every op checks its arguments with :mod:`hisparse_hal.cache_ops.arguments` first (metadata only, no host
sync), then launches a fixed grid whose counts are read on the device. The union bound and the table
addresses are enforced by :mod:`.device_checks` between launches (a typed error on CPU tensors, a device-side
assertion on a GPU, ordered before any write). Triton is imported on first use
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

from hisparse_hal.errors import UnionOverflowError, UnknownTableError, UnsupportedCapabilityError

from . import device_checks, selection, tables
from .arguments import GatherInputs, InvalidateInputs, ResolveInputs
from .signatures import VllmOps, vllm_ops

__all__ = [
    "resolve_residency", "gather_compact", "gather_plan", "invalidate_written_slots", "kernels", "entries",
    "Launch", "ResolveScratch", "counting_launches",
    "plan_resolve_residency", "plan_gather", "plan_invalidate_written_slots",
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

    A decode step of vLLM's (resolve_residency, then gather_compact per layer) is 2 + 1 launches per layer
    (resolve's bound check between its launches is a torch ``_assert_async``, not a Triton launch);
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
    if device is not None and device.type not in selection.triton_device_types() and not module.INTERPRETED:
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
            "triton (the [triton] extra: pip install -e '.[triton]' in a hisparse-hal checkout) or use the torch"
            " implementation (HISPARSE_HAL_CACHE_OPS=torch)"
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


class ResolveScratch:
    """Global-memory scratch of resolve calls: a hash table of 2 cells per position, the position -> cell map,
    one LRU-ordered slot list per run (each run uses the part indexed by its first row) and each run's union
    size (at its first row).

    One per ops object (vLLM's copy stream serializes its calls): buffers are allocated on the first call of a
    batch shape and reused at the same addresses, so a captured graph's replays find them. Not thread-safe.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[object, ...], dict[str, torch.Tensor]] = {}

    def get(self, rows: int, top_k: int, slots: int, device: torch.device) -> dict[str, torch.Tensor]:
        """The buffers for ``rows x top_k`` positions and ``slots`` slots on ``device``."""
        key = (rows, top_k, slots, device)
        buffers = self._buffers.get(key)
        if buffers is None:
            cells = 2 * rows * top_k

            def empty(size: int) -> torch.Tensor:
                return torch.empty(size, dtype=torch.int32, device=device)

            buffers = {"keys": empty(cells), "first": empty(cells), "kind": empty(cells), "slot": empty(cells),
                       "cells": empty(rows * top_k), "order": empty(rows * slots), "union": empty(rows)}
            if device.type != "meta":
                self._buffers[key] = buffers
        return buffers


def plan_resolve_residency(inputs: ResolveInputs, scratch: ResolveScratch | None = None) -> list[Launch]:
    """The two launches of :func:`resolve` for checked inputs (none for an empty batch), with the scratch
    they share (``meta`` tensors give a plan without memory, as ``hisparse-hal kernels`` uses it)."""
    if inputs.empty:
        return []
    rows, top_k, slots = inputs.num_rows, inputs.top_k, inputs.hot_size
    buffers = (scratch or ResolveScratch()).get(rows, top_k, slots, inputs.device)
    dummy = inputs.hot_indices
    src = _or_dummy(inputs.source_block_table, dummy)
    res = _or_dummy(inputs.resident_block_table, dummy)
    att = _or_dummy(inputs.attention_indices, dummy)
    valid = _or_dummy(inputs.valid_counts, dummy)
    rsi = inputs.request_state_indices
    flags = dict(
        HAS_RSI=rsi is not None,
        HAS_RID=inputs.request_ids is not None,
        HAS_NVR=inputs.num_valid_rows is not None,
        HAS_SRC=inputs.source_block_table is not None,
        HAS_RES=inputs.resident_block_table is not None,
    )
    state_rows = rsi.numel() if rsi is not None else 0
    has_src, has_res = inputs.source_block_table is not None, inputs.resident_block_table is not None
    source = (
        src, src.size(0) if has_src else 0, src.size(1) if has_src else 0, src.stride(0),
        max(inputs.source_block_size, 1),
        res, res.size(0) if has_res else 0, res.size(1) if has_res else 0, res.stride(0),
        max(inputs.resident_block_size, 1),
    )
    ids = (_or_dummy(inputs.request_ids, dummy), _or_dummy(inputs.num_valid_rows, dummy))
    gi = inputs.global_indices
    union = Launch("resolve_union_kernel", (rows,), (
        inputs.host_rows, rows, top_k, inputs.num_states,
        gi, gi.stride(0),
        _or_dummy(rsi, dummy), state_rows,
        *ids,
        *source,
        buffers["keys"], buffers["first"], buffers["kind"], buffers["slot"], buffers["cells"], buffers["union"],
    ), dict(BLOCK_K=_pow2(top_k), BLOCK_R=_pow2(rows, cap=_BLOCK_ROWS), **flags))
    stats = inputs.stats
    residency = Launch("resolve_residency_kernel", (rows,), (
        inputs.host_rows, inputs.block_size, rows, top_k, slots, inputs.num_states, inputs.max_union_rows,
        inputs.hot_block_table, inputs.hot_block_table.size(0), inputs.hot_block_table.size(1),
        inputs.hot_block_table.stride(0),
        gi, gi.stride(0),
        inputs.hot_indices,
        inputs.device_global_indices, inputs.lru_slots,
        _or_dummy(rsi, dummy), state_rows,
        *ids,
        *source,
        stats.view(torch.int64) if stats is not None else dummy,
        att, att.stride(0), inputs.attention_block_stride,
        valid, valid.stride(0) if inputs.valid_counts is not None else 0,
        _or_dummy(inputs.swap_host_physical_rows, dummy),
        _or_dummy(inputs.swap_device_physical_rows, dummy),
        _or_dummy(inputs.swap_counts, dummy),
        buffers["keys"], buffers["first"], buffers["kind"], buffers["slot"], buffers["cells"], buffers["order"],
        buffers["union"],
    ), dict(
        HAS_STATS=stats is not None,
        HAS_ATT=inputs.attention_indices is not None,
        HAS_VALID=inputs.valid_counts is not None,
        HAS_SWAP=inputs.has_swaps,
        BLOCK_K=_pow2(top_k),
        BLOCK_H=_pow2(slots),
        **flags,
    ))
    return [union, residency]


def _check_union(inputs: ResolveInputs, union: torch.Tensor) -> None:
    """The bound between the launches: typed error on CPU tensors, ``_assert_async`` on a GPU (the second
    launch also writes an overflowing run as padding and leaves its state alone)."""

    def error(row: int) -> UnionOverflowError:
        if inputs.request_ids is None:
            request = row
        else:
            request = int(inputs.request_ids.reshape(-1)[row])
        rsi = inputs.request_state_indices
        state = int(rsi[request]) if rsi is not None else request
        return UnionOverflowError(state, request, int(union[row]), inputs.max_union_rows)

    device_checks.refuse(union > inputs.max_union_rows, error,
                         f"hisparse resolve_residency: a request's union exceeds max_union_rows = "
                         f"{inputs.max_union_rows}")


def resolve(inputs: ResolveInputs, scratch: ResolveScratch | None = None) -> None:
    """``hisparse_resolve_residency`` on checked inputs: launch 1 (translate, union; scratch only), the
    union bound, launch 2 (classify, misses, publish, LRU, stats). One program per batch row; the first row of
    each run handles the whole run in tiles, with its union in a hash table in global scratch (no shared-memory
    limit, unlike the CUDA kernel's on 64 KiB-LDS AMD parts).

    Raises:
        UnionOverflowError: on CPU tensors (interpreter), before any output or state is written.
        UnsupportedCapabilityError: triton is not available.
    """
    launches = plan_resolve_residency(inputs, scratch)
    if not launches:
        return
    _launch(launches[:1], inputs.device)
    _check_union(inputs, launches[0].args[-1])
    _launch(launches[1:], inputs.device)


def plan_gather(inputs: GatherInputs) -> list[Launch]:
    """The launch of :func:`gather` for checked inputs (none for an empty plan)."""
    if inputs.empty:
        return []
    host_words, hot_words = _words(inputs.host_cache), _words(inputs.hot_cache)
    if host_words.dtype != hot_words.dtype:
        host_words, hot_words = inputs.host_cache.view(torch.uint8), inputs.hot_cache.view(torch.uint8)
    row_words = host_words.size(1)
    columns = inputs.columns
    tiles_per_row = -(-columns // _GATHER_COLUMNS)
    tiles = inputs.num_rows * tiles_per_row
    compact = inputs.compact
    dummy = inputs.hot_indices
    return [Launch("gather_rows_kernel", (min(tiles, _GATHER_PROGRAMS),), (
        host_words, hot_words, inputs.global_indices, inputs.hot_indices,
        dummy if compact else inputs.selector, inputs.selector if compact else dummy,
        columns, tiles_per_row, tiles, inputs.host_rows, inputs.hot_rows, inputs.block_size,
        hot_words.stride(0), hot_words.stride(1), row_words,
    ), dict(
        COMPACT=compact,
        BLOCK_C=_GATHER_COLUMNS,
        BLOCK_W=_pow2(row_words, cap=256),
    ))]


def gather(inputs: GatherInputs) -> None:
    """``hisparse_gather_plan`` / ``hisparse_gather_compact`` on checked inputs: one grid-stride launch.

    Raises:
        UnsupportedCapabilityError: triton is not available.
    """
    _launch(plan_gather(inputs), inputs.device)


def _known_addresses(inputs: InvalidateInputs) -> torch.Tensor:
    """The registered candidates' addresses as an int64 tensor on the ops' device (at least one element),
    built once per address list (:func:`tables.address_tensor`)."""
    return tables.address_tensor(inputs.addresses, inputs.device)


def plan_invalidate_written_slots(inputs: InvalidateInputs, known: torch.Tensor | None = None) -> list[Launch]:
    """The launch of :func:`invalidate` for checked inputs: a ``(tokens, tables)`` grid (none when empty)."""
    if inputs.empty:
        return []
    known = known if known is not None else _known_addresses(inputs)
    tokens, groups = inputs.written_slots.numel(), inputs.device_global_indices_ptrs.numel()
    return [Launch("invalidate_written_slots_kernel", (tokens, groups), (
        inputs.device_global_indices_ptrs, known, len(inputs.addresses), inputs.request_state_indices,
        inputs.req_id_per_token, inputs.written_slots, inputs.request_state_indices.numel(),
        inputs.num_state_rows, inputs.region_stride,
    ), dict(BLOCK_H=_pow2(inputs.region_stride), BLOCK_T=16))]


def invalidate(inputs: InvalidateInputs) -> None:
    """``hisparse_invalidate_written_slots`` on checked inputs: every address must be a registered table (typed
    error on CPU tensors, ``_assert_async`` on a GPU, before the launch); the kernel casts only known addresses.

    Raises:
        UnknownTableError: on CPU tensors, before anything is written.
        UnsupportedCapabilityError: triton is not available.
    """
    pointers = inputs.device_global_indices_ptrs
    known = _known_addresses(inputs)
    if pointers.numel():
        names = (pointers[:, None] == known[None, :]) & bool(inputs.addresses)

        def error(index: int) -> UnknownTableError:
            return UnknownTableError(int(pointers[index]), index, f"is no registered [{inputs.num_state_rows}, "
                                     f"{inputs.region_stride}] int32 device_global_indices table on {inputs.device}")

        device_checks.refuse(~names.any(1), error, "hisparse invalidate_written_slots: unknown table address")
    _launch(plan_invalidate_written_slots(inputs, known), inputs.device)


def entries() -> VllmOps:
    """The four vLLM-order entries with their own :class:`ResolveScratch` (one per ops object)."""
    scratch = ResolveScratch()

    def resolve_with_scratch(inputs: ResolveInputs) -> None:
        resolve(inputs, scratch)

    return vllm_ops(resolve_with_scratch, gather, invalidate)


_OPS = vllm_ops(resolve, gather, invalidate)
resolve_residency = _OPS.resolve_residency
gather_compact = _OPS.gather_compact
gather_plan = _OPS.gather_plan
invalidate_written_slots = _OPS.invalidate_written_slots
