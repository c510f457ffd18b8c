"""CPU stand-ins for the torch stream, event and pinned-memory calls vLLM 0.34.0's HiSparse makes that a
CPU-only torch cannot serve. Each is marked STAND-IN with the call it replaces; nothing else is replaced.

CPU work runs in program order, so ordering between streams is already given: waits are no-ops here.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch


class CpuStream(torch.Stream):
    """STAND-IN for ``torch.Stream(device)``: torch's CPU stream raises "cpu backend doesn't support events"
    in ``wait_stream`` (vLLM: ``worker.py:610``, ``runtime.py:961``)."""

    def __new__(cls, device: Any = "cpu", *args: Any, **kwargs: Any) -> CpuStream:
        return super().__new__(cls, device="cpu")

    def wait_stream(self, stream: Any) -> None:
        return None


class CpuEvent(torch.Event):
    """STAND-IN for ``torch.Event()``: ``record`` raises on torch's CPU backend (vLLM: ``runtime.py:981``,
    ``worker.py:613-620``). A ``torch.Event``, so ``torch.Stream.wait_event`` accepts it."""

    def __new__(cls, *args: Any, **kwargs: Any) -> CpuEvent:
        return super().__new__(cls, "cpu")

    def record(self, stream: Any = None) -> None:
        return None


def _unpinned(factory: Any) -> Any:
    def make(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
        return factory(*args, **kwargs)

    return make


class CpuTorch(types.SimpleNamespace):
    """``torch`` as vLLM's HiSparse modules see it in these tests: torch itself except the stand-ins."""

    Stream = CpuStream
    Event = CpuEvent
    # STAND-IN: pin_memory=True needs an accelerator's host allocator (runtime.py:625-627, worker.py:293-297).
    empty = staticmethod(_unpinned(torch.empty))
    zeros = staticmethod(_unpinned(torch.zeros))
    tensor = staticmethod(_unpinned(torch.tensor))  # STAND-IN likewise: worker.py:544 (invalidate_blocks)
    # STAND-IN: torch.accelerator.* raise "Cannot access accelerator device when none is available".
    accelerator = types.SimpleNamespace(
        current_stream=lambda device=None: CpuStream(),
        synchronize=lambda device=None: None,
        current_device_index=lambda: 0,
    )

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def install(monkeypatch: pytest.MonkeyPatch, *modules: Any) -> None:
    """Give each of vLLM's ``modules`` the CPU ``torch`` for the rest of the test."""
    import vllm.utils.torch_utils as torch_utils

    for module in modules:
        monkeypatch.setattr(module, "torch", CpuTorch())
    # STAND-IN: vLLM decides pinning once from the platform (utils/torch_utils.py); UnspecifiedPlatform says
    # yes, but a CPU-only torch has no pinned allocator (async_tensor_h2d, runtime.py:1073-1075).
    monkeypatch.setattr(torch_utils, "PIN_MEMORY", False)
