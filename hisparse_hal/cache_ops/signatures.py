"""vLLM 0.34.0's positional signatures of the four cache ops, written once, wrapped around any implementation.

An implementation writes one function per op that takes the checked bundle (:class:`~.arguments.ResolveInputs`,
:class:`~.arguments.GatherInputs`, :class:`~.arguments.InvalidateInputs`); :func:`vllm_ops` turns them into the
four public functions with vLLM's argument names and order (design note §3.1; vLLM passes all 23 resolve
arguments positionally, ``runtime.py:904-930``).

Invariant: every public entry runs the shared check of :mod:`.arguments` first, so a bad argument raises
``InvalidArgumentError`` before the implementation sees (or writes) anything.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import torch

from hisparse_hal.errors import CacheOpArityError

from . import arguments
from .arguments import GatherInputs, InvalidateInputs, ResolveInputs

__all__ = ["ARITY", "OP_NAMES", "SIGNATURES", "VllmOps", "method_signature", "positional_arguments", "vllm_ops"]

#: Our op names, in the order of vLLM's ``hisparse_*`` ops (``torch.ops._C_cache_ops.hisparse_<name>``).
OP_NAMES: tuple[str, ...] = ("resolve_residency", "gather_compact", "gather_plan", "invalidate_written_slots")

Tensor = torch.Tensor


@dataclasses.dataclass(frozen=True)
class VllmOps:
    """The four ops of one implementation with vLLM 0.34.0's positional signatures."""

    resolve_residency: Callable[..., None]
    gather_compact: Callable[..., None]
    gather_plan: Callable[..., None]
    invalidate_written_slots: Callable[..., None]


def _resolve_residency(run: Callable[[ResolveInputs], None]) -> Callable[..., None]:
    """vLLM's ``hisparse_resolve_residency`` signature around ``run``."""

    def resolve_residency(
        host_cache: Tensor,
        hot_cache: Tensor,
        hot_block_table: Tensor,
        global_indices: Tensor,
        hot_indices: Tensor,
        device_global_indices: Tensor,
        lru_slots: Tensor,
        request_state_indices: Tensor | None,
        region_stride: int,
        max_union_rows: int,
        stats: Tensor | None = None,
        attention_indices: Tensor | None = None,
        attention_block_stride: int = 0,
        request_ids: Tensor | None = None,
        source_block_table: Tensor | None = None,
        source_block_size: int = 0,
        valid_counts: Tensor | None = None,
        swap_host_physical_rows: Tensor | None = None,
        swap_device_physical_rows: Tensor | None = None,
        swap_counts: Tensor | None = None,
        resident_block_table: Tensor | None = None,
        resident_block_size: int = 0,
        num_valid_rows: Tensor | None = None,
    ) -> None:
        """Plan one decode or verification step (vLLM 0.34.0 ``hisparse_resolve_residency``, 23 arguments).

        Translates top-k token positions to host rows, finds hot-buffer hits per contiguous request run, gives
        misses the oldest evictable slots, writes indices, swap plan, counts and stats, and rewrites the
        DGI and LRU state (docs/design/cache-ops.md). Moves no KV bytes.

        Raises:
            InvalidArgumentError: a dtype, shape, device, stride or scalar vLLM's op rejects (nothing written).
            UnionOverflowError: a run selects more than ``max_union_rows`` host rows (nothing written; on a
                GPU a device-side assertion instead, see the design doc).
        """
        run(arguments.check_resolve_residency(
            host_cache, hot_cache, hot_block_table, global_indices, hot_indices, device_global_indices,
            lru_slots, request_state_indices, region_stride, max_union_rows, stats, attention_indices,
            attention_block_stride, request_ids, source_block_table, source_block_size, valid_counts,
            swap_host_physical_rows, swap_device_physical_rows, swap_counts, resident_block_table,
            resident_block_size, num_valid_rows,
        ))
    return resolve_residency


def _gather_compact(run: Callable[[GatherInputs], None]) -> Callable[..., None]:
    """vLLM's ``hisparse_gather_compact`` signature around ``run``."""

    def gather_compact(
        host_cache: Tensor,
        hot_cache: Tensor,
        miss_global_indices: Tensor,
        miss_hot_indices: Tensor,
        miss_counts: Tensor,
    ) -> None:
        """Copy each row's first ``clamp(miss_counts[r], 0, K)`` planned host rows to hot rows (vLLM 0.34.0
        ``hisparse_gather_compact``). Host rows past the end zero-fill; negative sources or destinations
        outside the hot cache are skipped; a destination named twice ends with the later entry.

        Raises:
            InvalidArgumentError: a dtype, shape, device or stride check failed (nothing copied).
        """
        run(arguments.check_gather_compact(host_cache, hot_cache, miss_global_indices, miss_hot_indices,
                                              miss_counts))
    return gather_compact


def _gather_plan(run: Callable[[GatherInputs], None]) -> Callable[..., None]:
    """vLLM's ``hisparse_gather_plan`` signature around ``run``."""

    def gather_plan(
        host_cache: Tensor,
        hot_cache: Tensor,
        global_indices: Tensor,
        hot_indices: Tensor,
        miss_mask: Tensor,
    ) -> None:
        """Copy host row ``global_indices[r, c]`` to hot row ``hot_indices[r, c]`` where ``miss_mask`` is
        nonzero (vLLM 0.34.0 ``hisparse_gather_plan``), with ``compact``'s skip and zero-fill rules.

        Raises:
            InvalidArgumentError: a dtype, shape, device or stride check failed (nothing copied).
        """
        run(arguments.check_gather_plan(host_cache, hot_cache, global_indices, hot_indices, miss_mask))
    return gather_plan


def _invalidate_written_slots(run: Callable[[InvalidateInputs], None]) -> Callable[..., None]:
    """vLLM's ``hisparse_invalidate_written_slots`` signature around ``run``."""

    def invalidate_written_slots(
        device_global_indices_ptrs: Tensor,
        request_state_indices: Tensor,
        req_id_per_token: Tensor,
        written_slots: Tensor,
        num_state_rows: int,
        region_stride: int,
    ) -> None:
        """In every table named by address, set to -1 each entry of a written token's state row that holds
        the token's rewritten host row (vLLM 0.34.0 ``hisparse_invalidate_written_slots``).

        Raises:
            InvalidArgumentError: a dtype, shape or device check failed (nothing written).
            UnknownTableError: an address names no registered table of shape ``[num_state_rows,
                region_stride]`` (nothing written; on a GPU a device-side assertion instead).
        """
        run(arguments.check_invalidate_written_slots(
            device_global_indices_ptrs, request_state_indices, req_id_per_token, written_slots, num_state_rows,
            region_stride,
        ))
    return invalidate_written_slots


def vllm_ops(
    resolve: Callable[[ResolveInputs], None],
    gather: Callable[[GatherInputs], None],
    invalidate: Callable[[InvalidateInputs], None],
) -> VllmOps:
    """Wrap an implementation's bundle-taking functions in vLLM 0.34.0's four signatures.

    Args:
        resolve: runs one checked resolve call.
        gather: runs one checked gather (plan or compact, as ``inputs.compact`` says).
        invalidate: runs one checked invalidation.

    Returns:
        The four public functions (each checks its arguments first).
    """
    return VllmOps(_resolve_residency(resolve), _gather_compact(gather), _gather_plan(gather),
                   _invalidate_written_slots(invalidate))


def _ignore(inputs: object) -> None:
    """Stands in for an implementation where only the signatures are wanted."""


#: Each op's signature, vLLM 0.34.0's parameter names, order and defaults (``csrc/torch_bindings.cpp:1070-1115``).
SIGNATURES: dict[str, inspect.Signature] = {
    name: inspect.signature(getattr(vllm_ops(_ignore, _ignore, _ignore), name)) for name in OP_NAMES
}
#: Each op's ``(required, total)`` argument counts: resolve 10 to 23, the gathers 5, invalidation 6.
ARITY: dict[str, tuple[int, int]] = {
    name: (sum(p.default is inspect.Parameter.empty for p in signature.parameters.values()),
           len(signature.parameters))
    for name, signature in SIGNATURES.items()
}


def method_signature(name: str) -> inspect.Signature:
    """Op ``name``'s signature with ``self`` first, for a method taking ``*args`` (``inspect.signature`` and
    ``help()`` of the bound method then show vLLM's names; the call itself binds nothing)."""
    signature = SIGNATURES[name]
    this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return signature.replace(parameters=[this, *signature.parameters.values()])


def positional_arguments(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A call of op ``name`` with keywords (or a wrong count) as vLLM's positional argument tuple, defaults filled.

    Raises:
        CacheOpArityError: the arguments do not fit the op's signature (naming the op, the count given and the
            counts it takes).
    """
    try:
        bound = SIGNATURES[name].bind(*args, **kwargs)
    except TypeError as exc:
        raise CacheOpArityError(f"hisparse_{name}", len(args) + len(kwargs), ARITY[name], str(exc)) from None
    bound.apply_defaults()
    return bound.args
