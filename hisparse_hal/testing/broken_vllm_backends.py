"""Planted-bug classes of vLLM 0.34.0's ``HiSparseBackend`` contract for ``conformance --vllm-backend``: each subclasses
vLLM's class, most by forwarding to hisparse-hal's CPU adapter, and breaks ONE thing vLLM relies on. The suite must fail
each with a message naming the defect (tests/integrations/with_vllm/test_vllm_conformance.py).

Imports vLLM. Test doubles, not models of any vendor.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.hisparse.backend import HiSparseBackend as VllmHiSparseBackend

from hisparse_hal.integrations.vllm_backend import CpuHiSparseBackend

__all__ = [
    "PLANTED",
    "UnpinRaisesValueError",
    "UnpinKeepsThePin",
    "ResolveAcceptsTooManyArguments",
    "GatherMinusOneNotRowZero",
    "SwapCopiesOnlyFirstDescriptor",
    "StatsDtypeIsNot64Bit",
    "CapturingQueryRaises",
    "SwapBlocksBatchMissing",
]


class UnpinRaisesValueError(CpuHiSparseBackend):
    """Pinning: ``unpin_tensor`` fails with a ValueError, which vLLM does not catch when it releases its host pools
    (it catches RuntimeError, vllm/v1/hisparse/runtime.py:372-374)."""

    def unpin_tensor(self, tensor: torch.Tensor) -> None:
        try:
            super().unpin_tensor(tensor)
        except RuntimeError as exc:
            raise ValueError(str(exc)) from None


class UnpinKeepsThePin(CpuHiSparseBackend):
    """Pinning: ``unpin_tensor`` returns without releasing the tensor, which stays a swap region (and pinned)."""

    def unpin_tensor(self, tensor: torch.Tensor) -> None:
        return None


class _TooManyArguments:
    """Ops whose ``hisparse_resolve_residency`` takes any number of arguments and ignores those past 23."""

    def __init__(self, ops: Any) -> None:
        self.ops = ops

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ops, name)

    def hisparse_resolve_residency(self, *args: Any) -> None:
        self.ops.hisparse_resolve_residency(*args[:23])


class ResolveAcceptsTooManyArguments(CpuHiSparseBackend):
    """Surface: ``hisparse_resolve_residency`` accepts 24 positional arguments (vLLM's schema takes at most 23)."""

    def create_cache_ops(self, runtime: Any) -> Any:
        return _TooManyArguments(super().create_cache_ops(runtime))


class GatherMinusOneNotRowZero(CpuHiSparseBackend):
    """Gathers: a row id of -1 reads row 1 instead of row 0 (vLLM's default clamps it to 0, backend.py:65)."""

    def gather_resident_rows(self, source: torch.Tensor, destination: torch.Tensor, row_ids: torch.Tensor) -> None:
        shifted = torch.where(row_ids == -1, torch.ones_like(row_ids), row_ids)
        super().gather_resident_rows(source, destination, shifted)


class SwapCopiesOnlyFirstDescriptor(CpuHiSparseBackend):
    """Swaps: ``swap_blocks_batch`` copies only the first descriptor of a batch."""

    def swap_blocks_batch(self, src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor) -> None:
        super().swap_blocks_batch(src[:1], dst[:1], sizes[:1])


class StatsDtypeIsNot64Bit(CpuHiSparseBackend):
    """Stats: ``stats_dtype`` claims int32 while the counters the ops write are 64-bit."""

    @property
    def stats_dtype(self) -> torch.dtype:  # type: ignore[override, unused-ignore]
        return torch.int32


class CapturingQueryRaises(CpuHiSparseBackend):
    """Capture: ``is_current_stream_capturing`` raises instead of answering False outside a capture."""

    def is_current_stream_capturing(self) -> bool:
        raise RuntimeError("planted: this backend cannot tell whether the current stream is capturing")


class SwapBlocksBatchMissing(VllmHiSparseBackend):
    """Surface: every member forwards to the CPU adapter except ``swap_blocks_batch``, left as vLLM's
    NotImplementedError stub (backend.py:75-79)."""

    supports_shared_host_pool = False

    def __init__(self) -> None:
        self._inner = CpuHiSparseBackend()

    def check_available(self) -> None:
        self._inner.check_available()

    def pin_tensor(self, tensor: torch.Tensor) -> None:
        self._inner.pin_tensor(tensor)

    def unpin_tensor(self, tensor: torch.Tensor) -> None:
        self._inner.unpin_tensor(tensor)

    def create_cache_ops(self, runtime: Any) -> Any:
        return self._inner.create_cache_ops(runtime)

    def validate_kv_cache_config(self, kv_cache_config: Any) -> None:
        self._inner.validate_kv_cache_config(kv_cache_config)

    def prepare_kv_cache_views(self, kv_cache_config: Any, kv_caches: dict[str, Any],
                               forward_context: dict[str, Any]) -> None:
        self._inner.prepare_kv_cache_views(kv_cache_config, kv_caches, forward_context)

    def create_ipc_event(self) -> Any:
        return self._inner.create_ipc_event()

    def export_event(self, event: Any) -> Any:
        return self._inner.export_event(event)

    def import_event(self, device: torch.device, handle: Any) -> Any:
        return self._inner.import_event(device, handle)

    def is_current_stream_capturing(self) -> bool:
        return self._inner.is_current_stream_capturing()


#: Class name -> (a ``-k`` expression that selects the tests catching it, the failing test ids they must include
#: (a prefix of the id), a word the failure's reason must contain).
PLANTED: dict[str, tuple[str, tuple[str, ...], str]] = {
    "UnpinRaisesValueError": ("test_unpin_of_a_tensor_never_pinned",
                              ("test_pinning.py::test_unpin_of_a_tensor_never_pinned_is_rejected",), "RuntimeError"),
    "UnpinKeepsThePin": ("test_pin_and_unpin_round_trip", ("test_pinning.py::test_pin_and_unpin_round_trip",),
                         "still accepted"),
    "ResolveAcceptsTooManyArguments": ("test_op_refuses",
                                       ("test_surface.py::test_op_refuses_a_wrong_argument_count_and_writes_nothing"
                                        "[resolve_residency-one_too_many]",), "24 positional arguments"),
    "GatherMinusOneNotRowZero": ("test_gather_reads_row_zero_for_minus_one_ids",
                                 ("test_gathers.py::test_gather_reads_row_zero_for_minus_one_ids",), "id -1"),
    "SwapCopiesOnlyFirstDescriptor": ("test_swap_batch_of_n_descriptors",
                                      ("test_swaps.py::test_swap_batch_of_n_descriptors_copies_every_byte[2]",),
                                      "byte"),
    "StatsDtypeIsNot64Bit": ("test_stats_dtype", ("test_stats.py::test_stats_dtype_is_a_64_bit_integer",),
                             "stats_dtype"),
    "CapturingQueryRaises": ("test_is_current_stream_capturing",
                             ("test_capture.py::test_is_current_stream_capturing_is_false_outside_any_capture",),
                             "capturing"),
    "SwapBlocksBatchMissing": ("test_members_vllm_calls", ("test_surface.py::test_members_vllm_calls_are_implemented",),
                               "swap_blocks_batch"),
}
