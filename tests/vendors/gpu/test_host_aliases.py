"""The GPU backends' one host-to-device address translation (``vendors/gpu/host_aliases.py``, ``HostAliasMap``) and
its users.

``device_addresses`` (vectorized), ``device_address_of_host`` (a tensor's range) and, through it,
``device_view_of_host`` all read one table per pin generation, on the simulated CUDA driver (with and
without device attribute 91) and HIP runtime.
"""

from __future__ import annotations

import random

import pytest
import torch

from hisparse_hal.errors import InvalidArgumentError, UnsupportedCapabilityError
from hisparse_hal.host_registration import HostChunk, HostRegistration
from hisparse_hal.testing.sim_cuda_driver import DEVICE_ALIAS_OFFSET, SimulatedCudaDriver
from hisparse_hal.testing.sim_device_module import SimulatedDeviceModule
from hisparse_hal.testing.sim_hip_runtime import SimulatedHipRuntime, simulated_rocm_backend
from hisparse_hal.vendors.cuda.backend import CudaBackend
from hisparse_hal.vendors.cuda.runtime import CudaDriver
from hisparse_hal.vendors.gpu import host_aliases
from hisparse_hal.vendors.gpu.host_aliases import HostAliasMap

CPU = torch.device("cpu")


def _sim_cuda(host_pointer_usable: bool = True) -> CudaBackend:
    driver = CudaDriver(0, SimulatedCudaDriver(12080, host_pointer_usable=host_pointer_usable))
    return CudaBackend.for_device(0, 12080, "sm_90", runtime=driver, device=CPU,
                                  device_module=SimulatedDeviceModule(0x5A00))


def _record(*chunks: tuple[int, int, int | None]) -> HostRegistration:
    parts = tuple(HostChunk(a, n, alias) for a, n, alias in chunks)
    return HostRegistration(parts[0].address, sum(c.size for c in parts), parts, True, parts[0].device_alias)


def test_map_translates_many_addresses_over_many_chunks_like_a_per_address_loop():
    rng = random.Random(1)
    records, address = [], 0x10000
    for _ in range(40):
        chunks = []
        for _ in range(rng.randrange(1, 4)):
            size = rng.randrange(1, 9) * 4096
            chunks.append((address, size, address + rng.randrange(1, 1 << 40)))
            address += size
        records.append(_record(*chunks))
        address += rng.choice([0, 4096])
    table = HostAliasMap(records, "sim", use_alias=True)
    flat = [c for r in records for c in r.chunks]
    queries = [rng.choice(flat) for _ in range(5000)]
    addresses = torch.tensor([c.address + rng.randrange(c.size) for c in queries])
    expected = [a - c.address + c.device_alias for a, c in zip(addresses.tolist(), queries, strict=True)]
    assert table.translate(addresses, "device_addresses").tolist() == expected
    assert HostAliasMap(records, "sim", use_alias=False).translate(addresses, "x").tolist() == addresses.tolist()


def test_map_names_the_first_address_outside_every_chunk():
    table = HostAliasMap([_record((0x1000, 4096, 0x9000)), _record((0x3000, 4096, 0xB000))], "sim", use_alias=True)
    addresses = torch.tensor([0x1000, 0x2FFF + 1, 0x2000, 0x0FFF])  # 0x2000 is the gap between the two
    with pytest.raises(InvalidArgumentError, match=r"device_addresses: address 0x2000 \(index 2\) is not inside a "
                       r"tensor pinned by backend 'sim'; pin it with pin_tensor first"):
        table.translate(addresses, "device_addresses")
    with pytest.raises(InvalidArgumentError, match=r"nothing is pinned on backend 'sim'"):
        HostAliasMap([], "sim", use_alias=True).translate(torch.tensor([5]), "device_addresses")
    assert HostAliasMap([], "sim", use_alias=True).translate(torch.tensor([], dtype=torch.int64), "d").numel() == 0


def test_map_refuses_a_missing_alias_where_kernels_need_one():
    table = HostAliasMap([_record((0x1000, 4096, None))], "sim", use_alias=True)
    with pytest.raises(UnsupportedCapabilityError, match=r"host memory at 0x1000 recorded no device alias"):
        table.translate(torch.tensor([0x1004]), "device_addresses")
    with pytest.raises(UnsupportedCapabilityError, match=r"recorded no device alias"):
        table.translate_range(0x1000, 0x1010, "device_view_of_host")
    assert HostAliasMap([_record((0x1000, 4096, None))], "sim", use_alias=False).translate_range(0x1000, 0x1010, "v") \
        == 0x1000


def test_a_range_must_lie_in_one_registration_with_contiguous_aliases():
    contiguous = _record((0x1000, 4096, 0x9000), (0x2000, 4096, 0xA000))
    broken = _record((0x10000, 4096, 0x90000), (0x11000, 4096, 0x70000))
    neighbour = _record((0x3000, 4096, 0xB000))  # adjacent to ``contiguous`` but a separate pin
    table = HostAliasMap([contiguous, broken, neighbour], "sim", use_alias=True)
    assert table.translate_range(0x1800, 0x2800, "device_view_of_host") == 0x9800
    with pytest.raises(InvalidArgumentError, match=r"spans 2 registration chunks whose device aliases are not contig"):
        table.translate_range(0x10800, 0x11800, "device_view_of_host")
    with pytest.raises(InvalidArgumentError, match=r"host tensor at 0x2800 \(4096 bytes\) is not inside memory pinned"):
        table.translate_range(0x2800, 0x3800, "device_view_of_host")
    with pytest.raises(InvalidArgumentError, match="is not inside memory pinned"):
        table.translate_range(0x800, 0x1800, "device_view_of_host")


@pytest.mark.parametrize("usable", [True, False], ids=["attribute_91_set", "alias_needed"])
def test_cuda_device_addresses_follow_attribute_91(usable):
    backend = _sim_cuda(host_pointer_usable=usable)
    backend.host_chunk_bytes = 16 * 1024
    host = torch.zeros(12, 4096, dtype=torch.uint8)
    backend.pin_tensor(host)
    addresses = host.data_ptr() + torch.tensor([0, 5 * 4096 + 7, 12 * 4096 - 1])
    offset = 0 if usable else DEVICE_ALIAS_OFFSET
    assert backend.device_addresses(addresses).tolist() == (addresses + offset).tolist()
    assert backend.device_address(host.data_ptr() + 9) == host.data_ptr() + 9 + offset
    assert backend.device_address_of_host(host[4:8]) == host[4:8].data_ptr() + offset
    backend.unpin_tensor(host)
    with pytest.raises(InvalidArgumentError, match=r"address 0x[0-9a-f]+ \(index 0\) is not in a pinned host tensor"):
        backend.device_addresses(addresses)


def test_rocm_device_addresses_come_from_the_shared_layer():
    from hisparse_hal.vendors.gpu.backend import TorchGpuBackend
    from hisparse_hal.vendors.rocm.backend import RocmBackend

    assert "device_addresses" not in vars(RocmBackend)  # one translation: ROCm's own copy is gone
    sim = SimulatedHipRuntime("7.2.1")
    backend = simulated_rocm_backend(sim)
    assert type(backend).device_addresses is TorchGpuBackend.device_addresses
    host = torch.arange(4 * 4096, dtype=torch.int64).to(torch.uint8).view(4, 4096)
    backend.pin_tensor(host)
    alias = backend.device_address_of_host(host[2:])
    assert alias == int(backend.device_addresses(torch.tensor([host[2:].data_ptr()]))[0])
    assert sim.kernel_read(alias, 16) == bytes(host[2, :16].tolist())


def test_the_table_is_rebuilt_only_after_a_pin_or_unpin(monkeypatch):
    builds = []
    real = host_aliases.HostAliasMap.__init__

    def counting(self, *args, **kwargs):
        builds.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(host_aliases.HostAliasMap, "__init__", counting)
    backend = _sim_cuda(host_pointer_usable=False)
    host, other = torch.zeros(4, 4096, dtype=torch.uint8), torch.zeros(2, 4096, dtype=torch.uint8)
    backend.pin_tensor(host)
    for _ in range(5):
        backend.device_addresses(torch.tensor([host.data_ptr()]))
        backend.device_address_of_host(host[1])
    assert len(builds) == 1
    backend.pin_tensor(other)
    backend.device_address_of_host(other)
    assert len(builds) == 2
    backend.unpin_tensor(other)
    with pytest.raises(InvalidArgumentError, match="is not inside memory pinned"):
        backend.device_address_of_host(other)  # the unpinned tensor is not served from a stale table
    assert len(builds) == 3
