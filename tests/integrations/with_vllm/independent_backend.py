"""A vLLM 0.34.0 ``HiSparseBackend`` written as a third party would: it subclasses vLLM's class and composes
hisparse-hal's CPU backend through the public ``hisparse_hal.get_backend("cpu")``, not hisparse-hal's adapter classes.
``conformance --vllm-backend tests.integrations.with_vllm.independent_backend:IndependentCpuBackend`` must pass it.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.hisparse.backend import HiSparseBackend

import hisparse_hal

__all__ = ["IndependentCpuBackend"]


class IndependentCpuBackend(HiSparseBackend):
    """Every member vLLM calls goes to the CPU device; one host pool per rank (no shared pool: on the CPU device a
    peer's ``wait_event`` on torch's CPU stream would not reach the event, so it claims none)."""

    supports_shared_host_pool = False
    stats_dtype = torch.uint64

    def __init__(self) -> None:
        self._device = hisparse_hal.get_backend("cpu")

    def check_available(self) -> None:
        self._device.check_available()

    def pin_tensor(self, tensor: torch.Tensor) -> None:
        self._device.pin_tensor(tensor)

    def unpin_tensor(self, tensor: torch.Tensor) -> None:
        self._device.unpin_tensor(tensor)

    def create_cache_ops(self, runtime: Any) -> Any:
        return self._device.create_cache_ops(runtime)

    def validate_kv_cache_config(self, kv_cache_config: Any) -> None:
        self._device.validate_kv_cache_config(kv_cache_config)

    def prepare_kv_cache_views(self, kv_cache_config: Any, kv_caches: dict[str, Any],
                               forward_context: dict[str, Any]) -> None:
        self._device.prepare_kv_cache_views(kv_cache_config, kv_caches, forward_context)

    def create_ipc_event(self) -> Any:
        return self._device.create_ipc_event()

    def export_event(self, event: Any) -> Any:
        return self._device.export_event(event)

    def import_event(self, device: torch.device, handle: Any) -> Any:
        return self._device.import_event(device, handle)

    def gather_resident_rows(self, source: torch.Tensor, destination: torch.Tensor, row_ids: torch.Tensor) -> None:
        self._device.gather_resident_rows(source, destination, row_ids)

    def is_current_stream_capturing(self) -> bool:
        return self._device.is_current_stream_capturing()

    def swap_blocks_batch(self, src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor) -> None:
        self._device.swap_blocks_batch(src, dst, sizes)
