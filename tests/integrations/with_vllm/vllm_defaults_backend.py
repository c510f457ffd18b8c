"""A vLLM 0.34.0 ``HiSparseBackend`` that behaves as vLLM's own ``CUDAHiSparseBackend`` would on a CPU: it implements
only the members vLLM's base leaves abstract, keeps vLLM's default ``validate_kv_cache_config``,
``prepare_kv_cache_views`` (no-ops) and ``gather_resident_rows`` (backend.py:36-70), and fails only as torch ops fail.

``conformance --vllm-backend tests.integrations.with_vllm.vllm_defaults_backend:VllmDefaultsBackend`` must pass it.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from vllm.v1.hisparse.backend import HiSparseBackend

import hisparse_hal

__all__ = ["VllmDefaultsBackend"]

T = TypeVar("T")


def _as_torch_fails(call: Callable[..., T]) -> Callable[..., T]:
    """``call`` with any failure raised as a plain ``RuntimeError`` carrying its text, as a torch op or
    ``cudaHostRegister`` reports one (``vllm/utils/host_memory.py:13-26``): no hisparse-hal error type leaks."""
    @functools.wraps(call)
    def plain(*args: Any) -> T:
        try:
            return call(*args)
        except Exception as exc:  # noqa: BLE001 - every failure becomes what a torch op raises
            raise RuntimeError(f"{type(exc).__name__}: {exc}") from None

    return plain


class _PlainOps:
    """Cache ops whose every call fails with a plain ``RuntimeError`` (what ``torch.ops._C_cache_ops`` raises)."""

    def __init__(self, ops: Any) -> None:
        self._ops = ops

    def __getattr__(self, name: str) -> Any:
        member = getattr(self._ops, name)
        return _as_torch_fails(member) if callable(member) else member


def _descriptor_checks(src: Any, dst: Any, sizes: Any) -> None:
    """What vLLM's ``swap_blocks_batch`` op checks before copying (``csrc/cache_kernels.cu:114-126``): three CPU
    int64 tensors of one length. Nothing about the addresses: they are raw pointers."""
    for name, tensor in (("src_ptrs", src), ("dst_ptrs", dst), ("sizes", sizes)):
        if not isinstance(tensor, torch.Tensor):
            raise RuntimeError(f"{name} must be a Tensor, got {type(tensor).__name__}")
        if tensor.device.type != "cpu":
            raise RuntimeError(f"{name} must be on CPU")
        if tensor.dtype != torch.int64:
            raise RuntimeError(f"{name} must be int64")
    if dst.size(0) != src.size(0) or sizes.size(0) != src.size(0):
        raise RuntimeError("dst_ptrs and sizes length must match src_ptrs")


class VllmDefaultsBackend(HiSparseBackend):
    """vLLM's base class with its abstract members filled in on hisparse-hal's CPU device: pinning, cache ops,
    events and the capture query forward to it; ``swap_blocks_batch`` copies raw pointers as vLLM's op does. No
    override of vLLM's three defaults; one host pool per rank, as the CPU device needs (see
    ``independent_backend.py``)."""

    supports_shared_host_pool = False
    stats_dtype = torch.uint64

    def __init__(self) -> None:
        self._device = hisparse_hal.get_backend("cpu")

    def check_available(self) -> None:
        _as_torch_fails(self._device.check_available)()

    def pin_tensor(self, tensor: torch.Tensor) -> None:
        _as_torch_fails(self._device.pin_tensor)(tensor)

    def unpin_tensor(self, tensor: torch.Tensor) -> None:
        _as_torch_fails(self._device.unpin_tensor)(tensor)

    def create_cache_ops(self, runtime: Any) -> Any:
        return _PlainOps(_as_torch_fails(self._device.create_cache_ops)(runtime))

    def create_ipc_event(self) -> Any:
        return _as_torch_fails(self._device.create_ipc_event)()

    def export_event(self, event: Any) -> Any:
        return _as_torch_fails(self._device.export_event)(event)

    def import_event(self, device: torch.device, handle: Any) -> Any:
        return _as_torch_fails(self._device.import_event)(device, handle)

    def is_current_stream_capturing(self) -> bool:
        return bool(_as_torch_fails(self._device.is_current_stream_capturing)())

    def swap_blocks_batch(self, src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor) -> None:
        """Copy ``sizes[i]`` bytes from address ``src[i]`` to ``dst[i]``, in order, unchecked (vLLM's op hands the
        pointers to ``cuMemcpyBatchAsync``; here the host copies them at once, the CPU device's stream)."""
        _descriptor_checks(src, dst, sizes)
        for source, destination, size in zip(src.tolist(), dst.tolist(), sizes.tolist(), strict=True):
            if size:
                ctypes.memmove(destination, source, size)
