"""The CPU device's delayed work (``vendors/cpu/delayed_work.py``) through ``CpuBackend.synchronize()``: it returns
only once a delayed swap has landed, re-raises the swap's failure, and returns at once when nothing is in flight.
A delayed swap is held on a gate the test opens, so no outcome depends on timing."""

from __future__ import annotations

import threading

import pytest
import torch

from hisparse_hal.vendors.cpu import backend as cpu_backend
from hisparse_hal.vendors.cpu.backend import CpuBackend

BLOCK = 64


def _pinned_pair(backend: CpuBackend) -> tuple[torch.Tensor, torch.Tensor]:
    source = torch.arange(4 * BLOCK, dtype=torch.int64).to(torch.uint8)
    destination = torch.zeros(4 * BLOCK, dtype=torch.uint8)
    backend.pin_tensor(source)
    backend.pin_tensor(destination)
    return source, destination


def _swap(backend: CpuBackend, source: torch.Tensor, destination: torch.Tensor) -> None:
    offsets = torch.arange(4, dtype=torch.int64) * BLOCK
    backend.swap_blocks_batch(source.data_ptr() + offsets, destination.data_ptr() + offsets.flip(0),
                              torch.full((4,), BLOCK, dtype=torch.int64))


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Swaps wait for this gate before moving a byte."""
    opened = threading.Event()
    move = cpu_backend.move_swap_batch

    def gated(batch):
        assert opened.wait(60), "the test never opened the gate"
        return move(batch)

    monkeypatch.setattr(cpu_backend, "move_swap_batch", gated)
    return opened


def test_synchronize_returns_only_after_a_delayed_swap_has_landed(gate: threading.Event) -> None:
    backend = CpuBackend()
    source, destination = _pinned_pair(backend)
    backend.delay_next_swap(0.001)
    _swap(backend, source, destination)  # returns with the swap in flight, held at the gate
    assert not destination.any()
    waiter = threading.Thread(target=backend.synchronize)
    waiter.start()
    waiter.join(0.05)
    assert waiter.is_alive(), "synchronize returned while the swap was still held"
    assert not destination.any()
    gate.set()
    waiter.join(60)
    assert not waiter.is_alive()
    assert torch.equal(destination.view(4, BLOCK), source.view(4, BLOCK).flip(0))


def test_synchronize_re_raises_the_failure_of_a_delayed_swap(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(batch):
        raise OSError("simulated copy fault")

    monkeypatch.setattr(cpu_backend, "move_swap_batch", broken)
    backend = CpuBackend()
    source, destination = _pinned_pair(backend)
    backend.delay_next_swap(0.001)
    _swap(backend, source, destination)
    with pytest.raises(OSError, match="simulated copy fault"):
        backend.synchronize()
    backend.synchronize()  # reported once, as a stream reports an earlier fault


def test_synchronize_with_nothing_in_flight_returns_and_a_plain_swap_has_landed_already() -> None:
    backend = CpuBackend()
    source, destination = _pinned_pair(backend)
    _swap(backend, source, destination)
    assert torch.equal(destination.view(4, BLOCK), source.view(4, BLOCK).flip(0))
    backend.synchronize()
