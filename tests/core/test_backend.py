"""The contract's shared logic (``backend.py:HiSparseBackend``) on a minimal backend that implements only the
identity and the two host-registration hooks, which record every call and can be made to fail: chunked pinning
with rollback, typed errors naming the bad value, and members a backend does not implement."""

from __future__ import annotations

import pytest
import torch

from hisparse_hal.backend import HiSparseBackend
from hisparse_hal.capabilities import KV_FORMATS, Capabilities
from hisparse_hal.errors import DeviceRuntimeError, InvalidArgumentError, UnpinError, UnsupportedCapabilityError
from hisparse_hal.host_registration import PAGE_BYTES


class RecordingBackend(HiSparseBackend):
    """Registers host chunks by recording them; ``fail_at`` makes that chunk's registration fail."""

    name = "recording"

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.calls: list[tuple[str, int, int]] = []

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities("loop", None, False, None, False, False, False, KV_FORMATS)

    def _register_host_chunk(self, address: int, size: int, index: int) -> int | None:
        if index == self.fail_at:
            raise DeviceRuntimeError("hostRegister", 2, "OUT_OF_MEMORY")
        self.calls.append(("register", address, size))
        return None

    def _unregister_host_chunk(self, address: int, size: int) -> None:
        self.calls.append(("unregister", address, size))


def _pool(pages: int) -> torch.Tensor:
    return torch.zeros(pages, PAGE_BYTES, dtype=torch.uint8)


def test_pinning_registers_page_aligned_chunks_and_unpinning_releases_them_in_reverse():
    backend = RecordingBackend()
    backend.host_chunk_bytes = 2 * PAGE_BYTES
    pool = _pool(5)
    backend.pin_tensor(pool)
    registered = [call for call in backend.calls if call[0] == "register"]
    assert sum(size for _, _, size in registered) == pool.numel() and len(registered) >= 3
    assert all(size <= 2 * PAGE_BYTES for _, _, size in registered)
    assert backend.pin_generation == 1 and len(backend.pinned_registrations()) == 1
    backend.calls.clear()
    backend.unpin_tensor(pool)
    assert backend.calls == [("unregister", a, s) for _, a, s in reversed(registered)]
    assert backend.pin_generation == 2 and backend.pinned_registrations() == ()
    assert len(list(backend.regions)) == 0


def test_a_failed_chunk_rolls_back_every_earlier_chunk_and_leaves_nothing_pinned():
    backend = RecordingBackend(fail_at=2)
    backend.host_chunk_bytes = PAGE_BYTES
    pool = _pool(4)
    with pytest.raises(DeviceRuntimeError, match="OUT_OF_MEMORY"):
        backend.pin_tensor(pool)
    registered = [(a, s) for kind, a, s in backend.calls if kind == "register"]
    released = [(a, s) for kind, a, s in backend.calls if kind == "unregister"]
    assert len(registered) == 2 and released == list(reversed(registered))
    assert backend.pinned_registrations() == () and backend.pin_generation == 0 and len(list(backend.regions)) == 0


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        ("not a tensor", "pin_tensor: expected a torch.Tensor, got str"),
        (torch.zeros(4, 4).t(), r"pin_tensor: tensor must be contiguous, got strides \(1, 4\)"),
        (torch.zeros(0, 8), r"pin_tensor: tensor is empty \(shape \(0, 8\)\)"),
        (torch.zeros(4, 4, device="meta"), "pin_tensor: tensor must be in host memory, got device meta"),
    ],
)
def test_pinning_refuses_bad_tensors_naming_them(tensor, message):
    backend = RecordingBackend()
    with pytest.raises(InvalidArgumentError, match=message):
        backend.pin_tensor(tensor)
    assert backend.calls == []


def test_pinning_twice_or_over_a_known_region_is_refused_naming_the_region():
    backend = RecordingBackend()
    pool = _pool(2)
    backend.pin_tensor(pool)
    with pytest.raises(InvalidArgumentError, match="is already pinned; unpin it first"):
        backend.pin_tensor(pool)
    other = _pool(2)
    backend.register_region(other.data_ptr(), PAGE_BYTES, "staging")
    with pytest.raises(InvalidArgumentError, match="overlaps known region 'staging'"):
        backend.pin_tensor(other)


def test_unpinning_what_was_not_pinned_is_a_runtime_error_vllm_catches():
    backend = RecordingBackend()
    pool = _pool(1)
    with pytest.raises(UnpinError, match=r"was not pinned by backend 'recording'") as caught:
        backend.unpin_tensor(pool)
    assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, InvalidArgumentError)
    with pytest.raises(UnpinError, match="expected a torch.Tensor, got int"):
        backend.unpin_tensor(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(("address", "size"), [(True, 8), (4096, 2.0), (4096, 0), (-8, 8)])
def test_register_region_refuses_bad_ranges(address, size):
    with pytest.raises(InvalidArgumentError):
        RecordingBackend().register_region(address, size)


def test_members_a_backend_does_not_implement_name_the_backend_and_the_member():
    backend = RecordingBackend()
    with pytest.raises(UnsupportedCapabilityError,
                       match=r"backend 'recording' \(RecordingBackend\) does not implement create_ipc_event"):
        backend.create_ipc_event()
    assert backend.supports_shared_host_pool is False and backend.stats_dtype == torch.uint64


def test_synchronize_is_a_member_a_backend_must_implement():
    with pytest.raises(UnsupportedCapabilityError,
                       match=r"^backend 'recording' \(RecordingBackend\) does not implement synchronize$"):
        RecordingBackend().synchronize()
