"""The CPU device's libc binding (``vendors/cpu/runtime.py``) and the pinning built on it: registration, mlock
page-locking (``PageLocker``), chunks and rollback, and ``memmove_each``."""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import mmap
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch

from hisparse_hal.errors import DeviceRuntimeError, InvalidArgumentError, InvalidDescriptorError
from hisparse_hal.vendors.cpu.backend import CpuBackend
from hisparse_hal.vendors.cpu.runtime import PageLocker, memmove_each, probe_page_lock

PAGE = mmap.PAGESIZE
MLOCK_WORKS = probe_page_lock()[0]
needs_mlock = pytest.mark.skipif(not MLOCK_WORKS, reason="mlock is refused in this process (RLIMIT_MEMLOCK)")


def _locked_kib() -> int:
    """VmLck of this process, in KiB (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmLck:"):
                return int(line.split()[1])
    raise AssertionError("no VmLck line in /proc/self/status")


@pytest.fixture
def backend() -> CpuBackend:
    return CpuBackend()


def _assert_nothing_pinned(backend: CpuBackend) -> None:
    assert backend.pinned_registrations() == ()
    assert len(backend.regions) == 0
    assert backend.page_locker.locked_ranges() == ()


# ----------------------------------------------------------------------------- pin and unpin
@needs_mlock
def test_pin_registers_and_page_locks_the_tensor_and_unpin_releases_both(backend):
    tensor = torch.zeros(256, PAGE, dtype=torch.uint8)  # 1 MiB
    before = _locked_kib()
    backend.pin_tensor(tensor)
    record = backend.host_registration(tensor)
    assert record.page_locked and record.address == tensor.data_ptr() and record.size == tensor.numel()
    assert record.device_alias is None and len(record.chunks) == 1
    assert _locked_kib() - before >= 1024
    (region,) = backend.regions
    assert (region.start, region.size, region.kind) == (tensor.data_ptr(), tensor.numel(), "pinned_host")
    backend.unpin_tensor(tensor)
    assert _locked_kib() == before
    _assert_nothing_pinned(backend)


@needs_mlock
def test_unpinning_one_tensor_keeps_a_shared_boundary_page_locked_for_its_neighbour(backend):
    raw = torch.zeros(4 * PAGE, dtype=torch.uint8)
    skip = -raw.data_ptr() % PAGE
    arena = raw[skip:skip + 3 * PAGE]  # three whole pages
    first, second = arena[: PAGE + 100], arena[PAGE + 100:]  # both touch the middle page
    before = _locked_kib() * 1024 // PAGE
    backend.pin_tensor(first)
    backend.pin_tensor(second)
    assert _locked_kib() * 1024 // PAGE - before == 3
    backend.unpin_tensor(first)
    assert _locked_kib() * 1024 // PAGE - before == 2  # the middle page stays locked for `second`
    backend.unpin_tensor(second)
    assert _locked_kib() * 1024 // PAGE == before


def test_pin_where_the_os_refuses_mlock_registers_unlocked_and_logs_once(backend, caplog):
    backend.page_locker.mlock = lambda address, size: errno.ENOMEM
    a, b = torch.zeros(PAGE, dtype=torch.uint8), torch.zeros(PAGE, dtype=torch.uint8)
    with caplog.at_level(logging.INFO, logger="hisparse_hal.vendors.cpu.runtime"):
        backend.pin_tensor(a)
        backend.pin_tensor(b)
    assert not backend.host_registration(a).page_locked and not backend.host_registration(b).page_locked
    messages = [r.getMessage() for r in caplog.records if "not page-locked" in r.getMessage()]
    assert len(messages) == 1 and "ENOMEM" in messages[0] and "RLIMIT_MEMLOCK" in messages[0]
    source = torch.ones(PAGE, dtype=torch.uint8)
    backend.register_region(source.data_ptr(), PAGE, "source")
    backend.swap_blocks_batch(torch.tensor([source.data_ptr()]), torch.tensor([a.data_ptr()]), torch.tensor([PAGE]))
    assert a.eq(1).all()
    backend.unpin_tensor(a)
    backend.unpin_tensor(b)
    assert backend.pinned_registrations() == ()


_OVER_LIMIT_CHILD = """
import json, logging, resource, torch
logging.basicConfig(level=logging.INFO)
resource.setrlimit(resource.RLIMIT_MEMLOCK, (1 << 20, resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]))
from hisparse_hal.vendors.cpu.backend import CpuBackend
backend = CpuBackend()
small, big = torch.zeros(64 << 10, dtype=torch.uint8), torch.zeros(4 << 20, dtype=torch.uint8)
backend.pin_tensor(small)
backend.pin_tensor(big)
print(json.dumps([backend.host_registration(small).page_locked, backend.host_registration(big).page_locked]))
"""


@pytest.mark.timeout(120)
def test_pin_over_the_real_rlimit_memlock_registers_unlocked(tmp_path):
    command = [sys.executable, "-c", _OVER_LIMIT_CHILD]
    if os.geteuid() == 0:  # root ignores RLIMIT_MEMLOCK through CAP_IPC_LOCK; drop it for the child
        capsh = shutil.which("capsh")
        if capsh is None:
            pytest.skip("running as root without capsh: cannot drop CAP_IPC_LOCK to make mlock hit its limit")
        command = [capsh, "--drop=cap_ipc_lock", "--", "-c", shlex.join(command)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [True, False]
    assert "not page-locked: mlock of 4194304 bytes refused with ENOMEM" in done.stderr


def test_pin_with_eperm_says_the_process_may_not_lock(backend, caplog):
    backend.page_locker.mlock = lambda address, size: errno.EPERM
    tensor = torch.zeros(PAGE, dtype=torch.uint8)
    with caplog.at_level(logging.INFO, logger="hisparse_hal.vendors.cpu.runtime"):
        backend.pin_tensor(tensor)
    assert not backend.host_registration(tensor).page_locked
    assert "EPERM" in caplog.text and "may not lock memory" in caplog.text


def test_pin_with_an_unexpected_mlock_error_raises_and_leaves_nothing_pinned(backend):
    backend.page_locker.mlock = lambda address, size: errno.EINVAL
    tensor = torch.zeros(PAGE, dtype=torch.uint8)
    with pytest.raises(DeviceRuntimeError, match=r"mlock failed with EINVAL \(22\): locking 4096 bytes") as info:
        backend.pin_tensor(tensor)
    assert info.value.call == "mlock" and info.value.error_name == "EINVAL"
    _assert_nothing_pinned(backend)


# ----------------------------------------------------------------------------- chunks and rollback
def test_pin_registers_in_chunks_on_page_and_block_boundaries(backend):
    tensor = torch.zeros(10, PAGE, dtype=torch.uint8)
    backend.host_chunk_bytes = 4 * PAGE
    backend.pin_tensor(tensor)
    record = backend.host_registration(tensor)
    assert [c.size for c in record.chunks] == [4 * PAGE, 4 * PAGE, 2 * PAGE]
    assert [c.address - tensor.data_ptr() for c in record.chunks] == [0, 4 * PAGE, 8 * PAGE]
    assert record.page_locked is MLOCK_WORKS
    assert len(backend.regions) == 3
    assert len(backend.page_locker.locked_ranges()) == (3 if MLOCK_WORKS else 0)
    backend.unpin_tensor(tensor)
    _assert_nothing_pinned(backend)


@pytest.mark.parametrize("failing_chunk", [0, 1, 2])
def test_pin_rolls_back_every_chunk_when_one_fails(backend, monkeypatch, failing_chunk):
    tensor = torch.zeros(12, PAGE, dtype=torch.uint8)
    backend.host_chunk_bytes = 4 * PAGE
    register = backend._register_host_chunk
    before = _locked_kib()

    def failing(address, size, index):
        if index == failing_chunk:
            raise DeviceRuntimeError("mlock", errno.ENOMEM, "ENOMEM", "simulated chunk failure")
        return register(address, size, index)

    monkeypatch.setattr(backend, "_register_host_chunk", failing)
    with pytest.raises(DeviceRuntimeError, match="simulated chunk failure"):
        backend.pin_tensor(tensor)
    _assert_nothing_pinned(backend)
    assert _locked_kib() == before
    with pytest.raises(InvalidArgumentError, match="was not pinned"):
        backend.unpin_tensor(tensor)
    monkeypatch.undo()
    backend.pin_tensor(tensor)  # a later pin of the same tensor works
    backend.unpin_tensor(tensor)


def test_failed_lock_is_undone_without_unlocking_a_neighbours_shared_page():
    calls: list[tuple[str, int, int]] = []

    def recorded(name: str, result: int) -> Callable[[int, int], int]:
        def call(address: int, size: int) -> int:
            calls.append((name, address, size))
            return result
        return call

    locker = PageLocker()
    locker.mlock = recorded("mlock", 0)
    locker.munlock = recorded("munlock", 0)
    assert locker.lock(0x10000 + 100, PAGE)  # pages 0x10000 and 0x10000 + PAGE
    locker.mlock = recorded("mlock", errno.EAGAIN)
    assert not locker.lock(0x10000 + PAGE + 200, 2 * PAGE)  # shares the page at 0x10000 + PAGE
    assert calls[-1] == ("munlock", 0x10000 + 2 * PAGE, 2 * PAGE)
    locker.unlock(0x10000 + 100, PAGE)
    assert calls[-1] == ("munlock", 0x10000, 2 * PAGE) and locker.locked_ranges() == ()


# ----------------------------------------------------------------------------- bad input
def test_pin_rejects_a_tensor_pinned_twice(backend):
    tensor = torch.zeros(PAGE, dtype=torch.uint8)
    backend.pin_tensor(tensor)
    with pytest.raises(
        InvalidArgumentError,
        match=r"pin_tensor: tensor at 0x[0-9a-f]+ \(4096 bytes\) is already pinned; unpin it first",
    ):
        backend.pin_tensor(tensor)
    assert len(backend.pinned_registrations()) == 1
    backend.unpin_tensor(tensor)


def test_pin_rejects_a_view_overlapping_a_pinned_tensor(backend):
    tensor = torch.zeros(2 * PAGE, dtype=torch.uint8)
    backend.pin_tensor(tensor)
    with pytest.raises(InvalidArgumentError, match=r"overlaps known region 'pinned host"):
        backend.pin_tensor(tensor[PAGE:])
    assert len(backend.pinned_registrations()) == 1 and len(backend.page_locker.locked_ranges()) <= 1
    backend.unpin_tensor(tensor)


def test_unpin_rejects_a_tensor_that_was_not_pinned(backend):
    with pytest.raises(
        InvalidArgumentError, match=r"unpin_tensor: tensor at 0x[0-9a-f]+ \(64 bytes\) was not pinned by backend 'cpu'"
    ):
        backend.unpin_tensor(torch.zeros(64, dtype=torch.uint8))


def test_unpin_rejects_a_tensor_unpinned_twice(backend):
    tensor = torch.zeros(PAGE, dtype=torch.uint8)
    backend.pin_tensor(tensor)
    backend.unpin_tensor(tensor)
    with pytest.raises(InvalidArgumentError, match="was not pinned"):
        backend.unpin_tensor(tensor)


@pytest.mark.parametrize("member", ["pin_tensor", "unpin_tensor"])
@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: torch.zeros(8, 8)[:, ::2], r"tensor must be contiguous, got strides \(8, 2\)"),
        (lambda: torch.zeros(8, device="meta"), r"tensor must be in host memory, got device meta"),
        (lambda: torch.zeros(0), r"tensor is empty \(shape \(0,\)\)"),
        (lambda: bytearray(8), r"expected a torch.Tensor, got bytearray"),
    ],
    ids=["non_contiguous", "non_cpu", "empty", "not_a_tensor"],
)
def test_pin_and_unpin_reject_bad_tensors(backend, member, make, message):
    with pytest.raises(InvalidArgumentError, match=f"{member}: {message}"):
        getattr(backend, member)(make())
    _assert_nothing_pinned(backend)


def test_host_registration_of_an_unpinned_tensor_is_rejected(backend):
    with pytest.raises(InvalidArgumentError, match="is not pinned by 'cpu'"):
        backend.host_registration(torch.zeros(8))


def test_register_region_rejects_non_host_device_and_unknown_unregister(backend):
    with pytest.raises(InvalidArgumentError, match="only knows host memory, got device meta"):
        backend.register_region(0x1000, 64, device=torch.device("meta"))
    with pytest.raises(InvalidArgumentError, match=r"must be ints, got '4096'"):
        backend.register_region("4096", 64)
    staging = torch.zeros(64, dtype=torch.uint8)
    region = backend.register_region(staging.data_ptr(), 64, "staging")
    backend.unregister_region(region)
    with pytest.raises(InvalidArgumentError, match="'staging' was not registered explicitly"):
        backend.unregister_region(region)
    at = torch.tensor([staging.data_ptr()])
    with pytest.raises(InvalidDescriptorError, match="not inside any known region"):
        backend.swap_blocks_batch(at, at, torch.tensor([8]))


@pytest.mark.parametrize("address,size", [(True, 4096), (0x1000, True), (0x1000, False)])
def test_register_region_rejects_a_bool_address_or_size_and_registers_nothing(backend, address, size):
    with pytest.raises(InvalidArgumentError, match=rf"must be ints, got {address!r}, {size!r}"):
        backend.register_region(address, size, "flag")
    assert list(backend.regions) == []


def test_memmove_each_copies_in_order():
    buffer = (ctypes.c_uint8 * 8)(*range(8))
    base = ctypes.addressof(buffer)
    i64 = lambda values: torch.tensor(values, dtype=torch.int64)  # noqa: E731
    memmove_each(i64([base, base + 1]), i64([base + 1, base + 2]), i64([1, 1]))
    assert list(buffer) == [0, 0, 0, 3, 4, 5, 6, 7]
