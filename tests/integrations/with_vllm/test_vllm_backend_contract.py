"""The contract as vLLM 0.34.0 uses it, with vLLM's own objects: its ``KVCacheConfig`` (binding.py:139, 150), its
``release_pinned_state`` (runtime.py:350-381) and its stream/event calls on IPC events (worker.py:164-184, 419)."""

from __future__ import annotations

import logging
import pickle
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.integrations.with_vllm.cpu_standins import install
from tests.integrations.with_vllm.vllm_env import loaded_plugin, require_vllm

require_vllm()

from vllm.v1.hisparse import runtime as hr  # noqa: E402
from vllm.v1.hisparse.backend import HiSparseBackend as VllmHiSparseBackend  # noqa: E402
from vllm.v1.hisparse.backend import get_hisparse_backend  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    HiSparseHotSpec,
    HiSparseResidentSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MLAAttentionSpec,
)

from hisparse_hal.errors import (  # noqa: E402
    InvalidArgumentError,
    InvalidDescriptorError,
    UnpinError,
    UnsupportedCapabilityError,
)
from hisparse_hal.integrations.vllm_backend import CpuHiSparseBackend  # noqa: E402

LAYER = "model.layers.0.self_attn.attn"
RESIDENT, HOT = f"{LAYER}.hisparse_resident", f"{LAYER}.hisparse_hot"
BLOCK, ROW_BYTES, NUM_BLOCKS, HOST_BLOCKS = 4, 64, 8, 6
PAGE = BLOCK * ROW_BYTES


def vllm_config(dtype: torch.dtype = torch.bfloat16, **overrides: Any) -> KVCacheConfig:
    """A HiSparse ``KVCacheConfig`` as vLLM's planner lays one out: a host-resident source group, and resident
    and hot groups overlaying one device backing (kv_cache_interface.py:490-555)."""
    source = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=ROW_BYTES // dtype.itemsize, dtype=dtype)
    fields: dict[str, object] = dict(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[
            KVCacheTensor(size=NUM_BLOCKS * PAGE, layers=[RESIDENT], layer_stride=NUM_BLOCKS * PAGE,
                          block_stride=PAGE),
            KVCacheTensor(size=NUM_BLOCKS * PAGE, layers=[HOT], layer_stride=NUM_BLOCKS * PAGE, block_stride=PAGE),
            KVCacheTensor(size=HOST_BLOCKS * PAGE, layers=[LAYER], layer_stride=HOST_BLOCKS * PAGE,
                          block_stride=PAGE, host_resident=True),
        ],
        kv_cache_groups=[
            KVCacheGroupSpec([LAYER], source, host_resident=True),
            KVCacheGroupSpec([RESIDENT], HiSparseResidentSpec(block_size=BLOCK, page_size=PAGE)),
            KVCacheGroupSpec([HOT], HiSparseHotSpec(block_size=BLOCK, page_size=PAGE, blocks_per_request=2)),
        ],
        hisparse_host_num_blocks=HOST_BLOCKS,
        hisparse_host_block_stride=PAGE,
    )
    fields.update(overrides)
    return KVCacheConfig(**fields)  # type: ignore[arg-type, unused-ignore]


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> CpuHiSparseBackend:
    loaded_plugin()
    install(monkeypatch, hr)
    built = get_hisparse_backend()
    assert isinstance(built, CpuHiSparseBackend) and isinstance(built, VllmHiSparseBackend)
    return built


@pytest.fixture
def host_pool(backend: VllmHiSparseBackend) -> Iterator[torch.Tensor]:
    pool = torch.zeros(HOST_BLOCKS * PAGE, dtype=torch.int8)
    backend.pin_tensor(pool)
    yield pool
    backend.unpin_tensor(pool)


def kv_caches(slab: torch.Tensor, host_pool: torch.Tensor) -> dict[str, torch.Tensor]:
    """What vLLM hands ``prepare_kv_cache_views``: resident and hot names map to the one raw device backing
    (v1/worker/utils.py:584-589), host layers to views of the pinned pool (binding.py:103-124)."""
    return {RESIDENT: slab, HOT: slab, LAYER: host_pool.view(HOST_BLOCKS, BLOCK, ROW_BYTES)}


def spill(
    backend: VllmHiSparseBackend, slab: torch.Tensor, host_pool: torch.Tensor, block: int, host_block: int
) -> None:
    """The worker's device-to-host page spill (worker.py:615-619): raw addresses in CPU int64 tensors."""
    src = torch.tensor([slab.data_ptr() + block * PAGE], dtype=torch.int64)
    dst = torch.tensor([host_pool.data_ptr() + host_block * PAGE], dtype=torch.int64)
    backend.swap_blocks_batch(src, dst, torch.tensor([PAGE], dtype=torch.int64))


def test_vllm_config_is_accepted_and_its_device_slab_takes_spills(
    backend: VllmHiSparseBackend, host_pool: torch.Tensor
) -> None:
    config = vllm_config()
    backend.validate_kv_cache_config(config)
    slab = torch.randint(0, 256, (NUM_BLOCKS * PAGE,), dtype=torch.uint8)
    caches = kv_caches(slab, host_pool)
    before = dict(caches)
    backend.prepare_kv_cache_views(config, caches, {})
    assert caches == before and all(caches[k] is before[k] for k in caches), "vLLM's binder makes the views"
    spill(backend, slab, host_pool, block=5, host_block=2)
    assert torch.equal(host_pool[2 * PAGE:3 * PAGE].view(torch.uint8), slab[5 * PAGE:6 * PAGE])


def test_the_real_cache_replaces_the_profiling_cache_regions(
    backend: VllmHiSparseBackend, host_pool: torch.Tensor
) -> None:
    """init_hisparse_kv_cache runs for the profiling cache and then the real one (gpu/attn_utils.py:419-428)."""
    config = vllm_config()
    profiling = torch.zeros(NUM_BLOCKS * PAGE, dtype=torch.uint8)
    backend.prepare_kv_cache_views(config, kv_caches(profiling, host_pool), {})
    real = torch.full((NUM_BLOCKS * PAGE,), 7, dtype=torch.uint8)
    backend.prepare_kv_cache_views(config, kv_caches(real, host_pool), {})
    backend.prepare_kv_cache_views(config, kv_caches(real, host_pool), {})  # and again: still one region
    with pytest.raises(InvalidDescriptorError, match="descriptor 0"):
        spill(backend, profiling, host_pool, block=0, host_block=0)
    spill(backend, real, host_pool, block=1, host_block=0)
    assert host_pool[:PAGE].tolist() == [7] * PAGE


def test_a_device_layer_missing_from_kv_caches_is_named_and_changes_nothing(
    backend: VllmHiSparseBackend, host_pool: torch.Tensor
) -> None:
    config = vllm_config()
    slab = torch.full((NUM_BLOCKS * PAGE,), 3, dtype=torch.uint8)
    backend.prepare_kv_cache_views(config, kv_caches(slab, host_pool), {})
    caches = kv_caches(torch.zeros_like(slab), host_pool)
    del caches[HOT]
    with pytest.raises(InvalidArgumentError, match=rf"kv_caches\['{HOT}'\] must be a torch.Tensor"):
        backend.prepare_kv_cache_views(config, caches, {})
    spill(backend, slab, host_pool, block=0, host_block=1)  # the earlier slab is still known
    assert host_pool[PAGE:2 * PAGE].tolist() == [3] * PAGE


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"hisparse_host_num_blocks": 0}, InvalidArgumentError,
         "hisparse_host_num_blocks must be a positive int, got 0"),
        ({"hisparse_host_block_stride": -256}, InvalidArgumentError, "hisparse_host_block_stride must be a positive"),
        ({"num_blocks": 0}, InvalidArgumentError, "num_blocks must be a positive int, got 0"),
        ({"hisparse_shared_host_pool": True}, UnsupportedCapabilityError, "asks for a shared HiSparse host pool"),
    ],
)
def test_bad_vllm_configs_get_typed_errors_naming_the_value(
    backend: VllmHiSparseBackend, overrides: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        backend.validate_kv_cache_config(vllm_config(**overrides))


def test_an_fp8_flavour_the_device_cannot_hold_is_refused_before_allocation(backend: VllmHiSparseBackend) -> None:
    with pytest.raises(UnsupportedCapabilityError, match=r"holds torch.float8_e5m2, which backend 'cpu'"):
        backend.validate_kv_cache_config(vllm_config(dtype=torch.float8_e5m2))
    backend.validate_kv_cache_config(vllm_config(dtype=torch.float8_e4m3fn))


def test_vllms_release_pinned_state_unpins_newest_first_and_stops_on_our_error(
    backend: VllmHiSparseBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """release_pinned_state catches only RuntimeError (runtime.py:374): ours must be one."""
    first, second = torch.zeros(8192, dtype=torch.int8), torch.zeros(8192, dtype=torch.int8)
    backend.pin_tensor(first)
    backend.pin_tensor(second)
    never_pinned = torch.zeros(4096, dtype=torch.int8)
    with caplog.at_level(logging.WARNING):
        hr.release_pinned_state([first, never_pinned], None)  # newest first: never_pinned fails, first stays
    assert [r.getMessage() for r in caplog.records if "host unregister failed" in r.getMessage()] == [
        f"HiSparse: host unregister failed (unpin_tensor: tensor at {never_pinned.data_ptr():#x} (4096 bytes) was "
        "not pinned by backend 'cpu'); leaving 2 host-pool tensors pinned for kernel exit reclaim."]
    with pytest.raises(UnpinError, match="was not pinned") as caught:
        backend.unpin_tensor(never_pinned)
    assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, InvalidArgumentError)
    hr.release_pinned_state([first, second], None)
    for tensor in (first, second):
        with pytest.raises(UnpinError):
            backend.unpin_tensor(tensor)


def test_ipc_events_take_vllms_stream_calls_and_export_picklable_handles(backend: CpuHiSparseBackend) -> None:
    event = backend.create_ipc_event()
    stream = torch.Stream("cpu")
    assert isinstance(event, torch.Event)
    event.record(stream)  # worker.py:175-177
    stream.wait_event(event)  # worker.py:419, 913: reads the argument as a torch.Event
    event.synchronize()  # worker.py:528
    handle = pickle.loads(pickle.dumps(backend.export_event(event)))  # broadcast_object, worker.py:179
    assert handle == backend.export_event(event)
    # vLLM's non-writer ranks only call stream.wait_event, which never reaches a CPU event's wait: no shared pool.
    assert backend.supports_shared_host_pool is False
    assert backend.hal.supports_shared_host_pool is True
    with pytest.raises(InvalidArgumentError, match="expected an event from create_ipc_event, got Event"):
        backend.export_event(torch.Event("cpu"))


class _GpuLikeEvent:
    """A hisparse-hal GPU event's shape (vendors/gpu/events.py GpuIpcEvent): the torch event it wraps."""

    def __init__(self) -> None:
        self.torch_event = torch.Event("cpu")  # stands for the torch.cuda.Event a GPU backend wraps


class _GpuLikeHal:
    """Only what the adapter's event and shared-pool members read of a GPU backend."""

    device = torch.device("cuda", 0)

    def __init__(self, shared_host_pool: bool) -> None:
        self.supports_shared_host_pool = shared_host_pool
        self.exported: list[object] = []

    def create_ipc_event(self) -> _GpuLikeEvent:
        return _GpuLikeEvent()

    def export_event(self, event: object) -> bytes:
        if not isinstance(event, _GpuLikeEvent):
            raise InvalidArgumentError(f"export_event: expected an event from create_ipc_event, got {type(event)}")
        self.exported.append(event)
        return b"handle"

    def import_event(self, device: torch.device, handle: bytes) -> _GpuLikeEvent:
        return _GpuLikeEvent()


def _adapter_on(hal: _GpuLikeHal) -> CpuHiSparseBackend:
    adapter = CpuHiSparseBackend.__new__(CpuHiSparseBackend)  # not built: its hal is the GPU-shaped stand-in
    adapter.hal = hal  # type: ignore[assignment]
    adapter._events = {}
    adapter._events_lock = threading.Lock()
    return adapter


def test_gpu_events_reach_vllm_as_the_torch_event_they_wrap_and_export_as_ours() -> None:
    """torch.Stream.wait_event reads its argument as a torch.Event (worker.py:419), so vLLM gets the wrapped one."""
    hal = _GpuLikeHal(shared_host_pool=True)
    adapter = _adapter_on(hal)
    event = adapter.create_ipc_event()
    assert isinstance(event, torch.Event)
    assert adapter.export_event(event) == b"handle" and isinstance(hal.exported[0], _GpuLikeEvent)
    assert hal.exported[0].torch_event is event
    assert isinstance(adapter.import_event(torch.device("cuda", 1), b"handle"), torch.Event)
    with pytest.raises(InvalidArgumentError, match="expected an event from create_ipc_event"):
        adapter.export_event(torch.Event("cpu"))


@pytest.mark.parametrize("planned", [True, False])
def test_gpu_shared_host_pool_is_the_capability_plans(planned: bool) -> None:
    """CUDA: True; ROCm: the HIP version's plan (False on 7.2.x, 32-cycle IPC events, vLLM #57602)."""
    assert _adapter_on(_GpuLikeHal(shared_host_pool=planned)).supports_shared_host_pool is planned


def test_a_bare_namespace_config_is_accepted_as_vllms_own_backends_accept_it(
    backend: VllmHiSparseBackend, host_pool: torch.Tensor
) -> None:
    """vLLM's tests pass ``SimpleNamespace()`` as the kv_cache_config (tests/v1/worker/test_attn_utils.py:578-584);
    its base backend reads nothing (backend.py:36-49). A field the config does carry is still checked."""
    backend.validate_kv_cache_config(SimpleNamespace())
    caches: dict[str, Any] = {}
    backend.prepare_kv_cache_views(SimpleNamespace(), caches, {})
    assert caches == {}
    with pytest.raises(UnsupportedCapabilityError, match="asks for a shared HiSparse host pool"):
        backend.validate_kv_cache_config(SimpleNamespace(hisparse_shared_host_pool=True))
    with pytest.raises(InvalidArgumentError, match="num_blocks must be a positive int, got -1"):
        backend.prepare_kv_cache_views(SimpleNamespace(num_blocks=-1), caches, {})
