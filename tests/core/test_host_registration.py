"""Chunk planning for host registration and rollback on a failing chunk."""

from __future__ import annotations

import pytest

from hisparse_hal.errors import DeviceRuntimeError, InvalidArgumentError
from hisparse_hal.host_registration import (
    DEFAULT_CHUNK_BYTES,
    PAGE_BYTES,
    default_chunk_bytes,
    plan_host_chunks,
    register_in_chunks,
)


def test_small_range_is_one_chunk():
    assert plan_host_chunks(0x1000, 4096, 656) == [(0x1000, 4096)]


def test_one_tib_pool_is_split_under_256_gib_on_page_and_block_boundaries():
    block = 656 * 64
    size = (1 << 40) // block * block
    plan = plan_host_chunks(0x7F0000000000, size, block)
    assert max(s for _, s in plan) <= DEFAULT_CHUNK_BYTES
    assert sum(s for _, s in plan) == size
    for address, chunk_size in plan[:-1]:
        assert (address + chunk_size - 0x7F0000000000) % block == 0
        assert (address + chunk_size) % PAGE_BYTES == 0
    assert [a for a, _ in plan] == sorted(a for a, _ in plan)


def test_period_larger_than_cap_is_rejected():
    with pytest.raises(InvalidArgumentError, match=r"one page-and-block period is .* over the 8192-byte chunk cap"):
        plan_host_chunks(0, 1 << 20, 3 * PAGE_BYTES + 1, 8192)


@pytest.mark.parametrize("size", [0, -5])
def test_non_positive_size_is_rejected(size):
    with pytest.raises(InvalidArgumentError, match=f"cannot register {size} bytes"):
        plan_host_chunks(0x1000, size, 64)


def test_chunk_failure_rolls_back_registered_chunks_in_reverse():
    calls: list[tuple[str, int]] = []

    def register(address, size, index):
        if index == 2:
            raise DeviceRuntimeError("cuMemHostRegister", 2, "CUDA_ERROR_OUT_OF_MEMORY")
        calls.append(("register", address))
        return None

    def unregister(address, size):
        calls.append(("unregister", address))

    with pytest.raises(DeviceRuntimeError, match="CUDA_ERROR_OUT_OF_MEMORY"):
        register_in_chunks([(0, 10), (10, 10), (20, 10), (30, 10)], register, unregister)
    assert calls == [("register", 0), ("register", 10), ("unregister", 10), ("unregister", 0)]


def test_rollback_failure_is_logged_and_original_error_kept(caplog):
    def register(address, size, index):
        if index == 1:
            raise DeviceRuntimeError("hipHostRegister", 2, "hipErrorOutOfMemory")
        return address + 1

    def unregister(address, size):
        raise RuntimeError("context gone")

    with pytest.raises(DeviceRuntimeError, match="hipErrorOutOfMemory"):
        register_in_chunks([(0, 10), (10, 10)], register, unregister)
    assert "rollback: releasing host chunk" in caplog.text


def test_chunk_cap_from_environment(monkeypatch):
    monkeypatch.setenv("HISPARSE_HAL_PIN_CHUNK_BYTES", "0x100000")
    assert default_chunk_bytes() == 1 << 20
    monkeypatch.setenv("HISPARSE_HAL_PIN_CHUNK_BYTES", "lots")
    with pytest.raises(
        InvalidArgumentError, match=r"HISPARSE_HAL_PIN_CHUNK_BYTES must be a positive byte count, got 'lots'"
    ):
        default_chunk_bytes()


def test_unwritable_part_names_a_gap_or_a_read_only_mapping_and_accepts_writable_ones(tmp_path):
    from hisparse_hal.host_registration import unwritable_part

    maps = tmp_path / "maps"
    maps.write_text(
        "1000-3000 rw-p 00000000 00:00 0 \n"
        "3000-4000 rw-s 00000000 00:05 12 /dev/shm/pool\n"
        "6000-8000 r--p 00000000 08:01 99 /usr/lib/libx.so\n"
    )
    assert unwritable_part(0x1800, 0x2000, str(maps)) is None  # across two writable mappings
    assert unwritable_part(0x3800, 0x1000, str(maps)) == "[0x4000, 0x4800) is not mapped"
    assert unwritable_part(0x6100, 0x10, str(maps)) == "[0x6100, 0x6110) is mapped r--p (/usr/lib/libx.so)"
    assert unwritable_part(0x9000, 0x10, str(maps)) == "[0x9000, 0x9010) is not mapped"
    assert unwritable_part(0x1000, 8, str(tmp_path / "absent")) is None  # not Linux: nothing can be said
