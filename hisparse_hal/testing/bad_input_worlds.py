"""Guarded memory worlds for the bad-input tests: one backend (CPU, or CUDA/ROCm on their SIMULATED
vendor libraries) with its regions laid out between guard bytes, and a snapshot of every byte and of
every registration table, so a test can prove that a rejected call changed nothing anywhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from hisparse_hal.backend import HiSparseBackend
from hisparse_hal.regions import Region
from hisparse_hal.testing.sim_cuda_driver import SimulatedCudaDriver
from hisparse_hal.testing.sim_device_module import SimulatedDeviceModule
from hisparse_hal.testing.sim_hip_runtime import SimulatedHipRuntime, simulated_rocm_backend
from hisparse_hal.vendors.cpu.backend import CpuBackend
from hisparse_hal.vendors.cuda.backend import CudaBackend
from hisparse_hal.vendors.cuda.runtime import CudaDriver

__all__ = ["BACKENDS", "GUARD", "Arena", "World", "build_world"]

BACKENDS = ("cpu", "cuda-sim", "rocm-sim")
GUARD = 512  # guard bytes before and after every region
GUARD_BYTE = 0xA5
BLOCK = 256  # swap block bytes
POOL_BLOCKS = 32  # host pool: 8 KiB, pinned in two 4 KiB chunks
NEIGHBOUR_BLOCKS = 16  # a second pinned tensor right after the pool (a separate registration)
DEVICE_BYTES = 32 * BLOCK
LOOSE_BYTES = 1024  # the never-pinned and the pinned-then-unpinned host tensors
GATHER_SHAPE = (10, 4, 200)  # gather source: 10 blocks of 4 rows of 200 bytes, at the start of the device cache
STAGING_ROWS = 24
SIM_GPU = torch.device("cuda", 0)  # label of simulated device memory (host bytes underneath)
CUDA_STREAM = 0x5A00


class Arena:
    """One uint8 allocation: named parts laid out between guard bytes, filled, and snapshotted."""

    def __init__(self, name: str, parts: list[tuple[str, int]], allocate: Callable[[int], torch.Tensor],
                 fill: Callable[[str, torch.Tensor], None]) -> None:
        self.name = name
        total = GUARD + sum(size for _, size in parts) + GUARD * len(parts)
        self.tensor = allocate(total)
        self.tensor.fill_(GUARD_BYTE)
        self.parts: dict[str, torch.Tensor] = {}
        self.guards: list[tuple[int, int]] = [(0, GUARD)]
        offset = GUARD
        for part, size in parts:
            self.parts[part] = self.tensor[offset:offset + size]
            fill(part, self.parts[part])
            offset += size
            if part != "pool":  # the pool and its pinned neighbour are adjacent on purpose
                self.guards.append((offset, offset + GUARD))
                offset += GUARD
        self.tensor = self.tensor[:offset]
        self.snapshot = self.tensor.clone()

    def changed(self) -> str | None:
        """None when every byte equals the snapshot; else which guard or part changed."""
        if torch.equal(self.tensor, self.snapshot):
            return None
        diff = (self.tensor != self.snapshot).nonzero().flatten()
        first = int(diff[0])
        where = "a region"
        if any(lo <= first < hi for lo, hi in self.guards):
            where = "a GUARD"
        return f"{self.name}: {diff.numel()} bytes changed, first at offset {first} ({where})"

    def restore(self) -> None:
        """Put the snapshot back (after a case that was meant to write)."""
        self.tensor.copy_(self.snapshot)


@dataclasses.dataclass
class World:
    """A backend with its guarded regions; see the module docstring."""

    name: str
    backend: HiSparseBackend
    host: Arena
    device: Arena
    staging: Arena
    pool: torch.Tensor  # [POOL_BLOCKS, BLOCK], pinned (two chunks)
    neighbour: torch.Tensor  # [NEIGHBOUR_BLOCKS, BLOCK], pinned right after the pool
    unpinned: torch.Tensor  # host memory never pinned
    released: torch.Tensor  # host memory pinned once, then unpinned
    device_cache: torch.Tensor  # an explicit device region
    device_region: Region
    driver_registrations: Callable[[], Any]
    driver_copies: Callable[[], int]
    start_state: Any = None

    @property
    def arenas(self) -> tuple[Arena, ...]:
        return (self.host, self.device, self.staging)

    def state(self) -> tuple[Any, ...]:
        """Every registration the HAL and the (simulated) driver hold, in comparable form."""
        backend = self.backend
        locked = backend.page_locker.locked_ranges() if isinstance(backend, CpuBackend) else ()
        return (
            tuple(backend.regions),
            tuple(sorted((r.address, r.size, r.chunks) for r in backend.pinned_registrations())),
            self.driver_registrations(),
            tuple(sorted(locked)),
        )

    def gather_source(self) -> torch.Tensor:
        blocks, rows, width = GATHER_SHAPE
        return self.device_cache[: blocks * rows * width].view(GATHER_SHAPE)

    def swap_regions(self) -> dict[str, Region]:
        """The regions a test aims at, by role: device cache, pool chunks 1 and 2, neighbour."""
        by_start = {region.start: region for region in self.backend.regions}
        pool, half = self.pool.data_ptr(), POOL_BLOCKS * BLOCK // 2
        return {
            "device": self.device_region,
            "pool_chunk1": by_start[pool],
            "pool_chunk2": by_start[pool + half],
            "neighbour": by_start[self.neighbour.data_ptr()],
        }

    def release(self) -> None:
        """Unpin and unregister everything this world registered."""
        self.backend.unpin_tensor(self.neighbour)
        self.backend.unpin_tensor(self.pool)
        self.backend.unregister_region(self.device_region)


def _fill(part: str, tensor: torch.Tensor) -> None:
    if part == "cache":
        generator = torch.Generator().manual_seed(20261203)
        tensor.copy_(torch.randint(0, 256, tensor.shape, dtype=torch.uint8, generator=generator))
    else:  # host pool, staging and loose host memory: a constant the random cache bytes would disturb
        tensor.fill_(0x5A)


@dataclasses.dataclass
class _Vendor:
    """What differs per backend: the backend, how device memory is made, and the driver's own tables."""

    backend: HiSparseBackend
    device_label: torch.device | None
    allocate_device: Callable[[int], torch.Tensor]
    registrations: Callable[[], Any]
    copies: Callable[[], int]


def _host_bytes(n: int) -> torch.Tensor:
    return torch.empty(n, dtype=torch.uint8)


def _cpu_vendor() -> _Vendor:
    return _Vendor(CpuBackend(), None, _host_bytes, tuple, int)


def _cuda_vendor() -> _Vendor:
    sim = SimulatedCudaDriver(12080)
    backend = CudaBackend.for_device(
        0, 12080, "sm_90", runtime=CudaDriver(0, sim), device=torch.device("cpu"),
        device_module=SimulatedDeviceModule(CUDA_STREAM),
    )

    def registrations() -> Any:
        return tuple(sorted(sim.registered.items()))

    def copies() -> int:
        return sum(1 for call, _ in sim.calls if call.startswith("cuMemcpy"))

    return _Vendor(backend, SIM_GPU, sim.allocate_device, registrations, copies)


def _rocm_vendor() -> _Vendor:
    hip = SimulatedHipRuntime("7.14", run_copies_immediately=True)

    def allocate_device(n: int) -> torch.Tensor:
        tensor = _host_bytes(n)
        hip.adopt_device_memory(tensor, "bad-input device arena")
        return tensor

    def registrations() -> Any:
        return tuple(sorted((address, r.size, r.alias) for address, r in hip.registrations.items()))

    def copies() -> int:
        return hip.calls["hipMemcpyAsync"] + hip.calls["hipMemcpyBatchAsync"]

    return _Vendor(simulated_rocm_backend(hip, "gfx950"), SIM_GPU, allocate_device, registrations, copies)


_VENDORS = {"cpu": _cpu_vendor, "cuda-sim": _cuda_vendor, "rocm-sim": _rocm_vendor}


def build_world(name: str) -> World:
    """A backend named by ``name`` (one of :data:`BACKENDS`) with every region registered.

    The host pool is pinned with a 4 KiB chunk cap, so it is two registrations; its neighbour is a third,
    adjacent to it. ``released`` is pinned and unpinned once, so later swaps aim at memory after unpin.
    """
    vendor = _VENDORS[name]()
    backend, registrations = vendor.backend, vendor.registrations
    empty_state = (tuple(backend.regions), (), registrations())
    assert empty_state == ((), (), ()), f"{name}: a fresh backend already holds registrations: {empty_state}"
    backend.host_chunk_bytes = POOL_BLOCKS * BLOCK // 2
    host = Arena("host", [("pool", POOL_BLOCKS * BLOCK), ("neighbour", NEIGHBOUR_BLOCKS * BLOCK),
                          ("unpinned", LOOSE_BYTES), ("released", LOOSE_BYTES)], _host_bytes, _fill)
    device = Arena("device", [("cache", DEVICE_BYTES)], vendor.allocate_device, _fill)
    staging = Arena("staging", [("staging", STAGING_ROWS * GATHER_SHAPE[2])], _host_bytes, _fill)
    pool = host.parts["pool"].view(POOL_BLOCKS, BLOCK)
    neighbour = host.parts["neighbour"].view(NEIGHBOUR_BLOCKS, BLOCK)
    released = host.parts["released"]
    backend.pin_tensor(released)
    backend.unpin_tensor(released)
    backend.pin_tensor(pool)
    backend.pin_tensor(neighbour)
    cache = device.parts["cache"]
    region = backend.register_region(cache.data_ptr(), DEVICE_BYTES, "bad-input device cache",
                                     device=vendor.device_label)
    world = World(name, backend, host, device, staging, pool, neighbour, host.parts["unpinned"], released,
                  cache, region, registrations, vendor.copies)
    assert len(backend.pinned_registrations()) == 2 and len(backend.regions) == 4, list(backend.regions)
    world.start_state = world.state()
    return world
