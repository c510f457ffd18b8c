"""``CacheOps`` builds the device view of a pinned host cache once per host tensor and pin generation.

The simulated CUDA driver and HIP runtime stand in for the GPUs; a counter on the backend's
``device_view_of_host`` counts the builds across decode steps, pins and unpins.
"""

from __future__ import annotations

import pytest
import torch

from hisparse_hal.cache_ops.bound import DeviceViews
from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.testing.sim_cuda_driver import SimulatedCudaDriver
from hisparse_hal.testing.sim_hip_runtime import SimulatedHipRuntime, simulated_rocm_backend
from hisparse_hal.vendors.cuda.backend import CudaBackend
from hisparse_hal.vendors.cuda.runtime import CudaDriver


class _SimCuda(CudaBackend):
    def _current_stream_handle(self) -> int:
        return 0x5A00

    def is_current_stream_capturing(self) -> bool:
        return False


def _cuda():
    return _SimCuda.for_device(0, 12080, "sm_90", runtime=CudaDriver(0, SimulatedCudaDriver(12080)),
                               device=torch.device("cpu"))


def _rocm():
    return simulated_rocm_backend(SimulatedHipRuntime("7.14"))


def _count_builds(monkeypatch, backend) -> list[torch.Tensor]:
    built: list[torch.Tensor] = []
    real = backend.device_view_of_host

    def counting(host_tensor):
        view = real(host_tensor)
        built.append(host_tensor)
        return view

    monkeypatch.setattr(backend, "device_view_of_host", counting)
    return built


def _step(ops, layer: torch.Tensor, hot: torch.Tensor) -> None:
    """One gather_compact of host rows 1 and 3 of ``layer`` into hot rows 0 and 1."""
    rows = torch.tensor([[1, 3]], dtype=torch.int32)
    ops.gather_compact(
        layer, hot, rows, torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([2], dtype=torch.int32)
    )


@pytest.mark.parametrize("make", [_cuda, _rocm], ids=["cuda", "rocm"])
def test_views_are_built_once_per_layer_and_rebuilt_only_after_a_pin_or_unpin(monkeypatch, make):
    monkeypatch.setenv("HISPARSE_HAL_CACHE_OPS", "torch")  # the view is the subject; the torch ops run on CPU
    backend = make()
    assert backend.capabilities.cache_ops == "torch"
    built = _count_builds(monkeypatch, backend)
    pool = torch.randint(0, 256, (3, 8, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    backend.pin_tensor(pool)
    ops = backend.create_cache_ops(None)
    hot = torch.zeros(2, 2, 32, dtype=torch.uint8)
    for _step_index in range(4):
        for layer in range(3):
            _step(ops, pool[layer], hot)  # a fresh view object of the same layer every step
            assert torch.equal(hot.view(4, 32)[:2], pool[layer][[1, 3]])
    assert len(built) == 3  # one per layer, not one per layer per step
    other = torch.zeros(4, 32, dtype=torch.uint8)
    backend.pin_tensor(other)
    _step(ops, pool[0], hot)
    _step(ops, pool[0], hot)
    assert len(built) == 4  # the pin moved the generation: rebuilt once
    backend.unpin_tensor(other)
    _step(ops, pool[1], hot)
    assert len(built) == 5
    backend.unpin_tensor(pool)
    with pytest.raises(InvalidArgumentError, match="is not inside memory pinned"):
        _step(ops, pool[1], hot)  # no stale view after the unpin
    assert len(built) == 5  # the refused build is not counted as a view


def test_different_shapes_of_the_same_bytes_get_their_own_views(monkeypatch):
    backend = _cuda()
    built = _count_builds(monkeypatch, backend)
    pool = torch.zeros(4, 64, dtype=torch.uint8)
    backend.pin_tensor(pool)
    views = DeviceViews(backend)
    assert views.of(pool) is views.of(pool.view(4, 64))
    assert views.of(pool.view(8, 32)).shape == (8, 32)
    assert views.of(pool.view(torch.int32)).dtype == torch.int32
    assert len(built) == 3


def test_a_non_tensor_host_cache_gets_the_backends_typed_error():
    with pytest.raises(InvalidArgumentError, match="device_view_of_host: expected a pinned CPU tensor, got list"):
        DeviceViews(_cuda()).of([1, 2])  # type: ignore[arg-type]
