"""vLLM 0.34.0's ``init_hisparse_kv_cache`` on hisparse-hal's CPU backend: validate (binding.py:139), the host
pool pinned once through ``pin_tensor`` (runtime.py:223-228, kept across the profiling and the real cache),
vLLM's own allocation, ``prepare_kv_cache_views`` (binding.py:150), binding (``create_cache_ops``) and rollback.

Its config objects carry only what ``init_hisparse_kv_cache`` reads (binding.py:128-167); the attention layer is
a stand-in holding vLLM's own ``HiSparseCacheHandle``.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any, cast

import pytest
import torch

from tests.integrations.with_vllm.cpu_standins import install
from tests.integrations.with_vllm.test_vllm_backend_contract import (
    BLOCK,
    HOST_BLOCKS,
    LAYER,
    NUM_BLOCKS,
    PAGE,
    vllm_config,
)
from tests.integrations.with_vllm.vllm_env import loaded_plugin, require_vllm

require_vllm()

from vllm.v1.hisparse import binding as hb  # noqa: E402
from vllm.v1.hisparse import runtime as hr  # noqa: E402
from vllm.v1.hisparse.backend import get_hisparse_backend  # noqa: E402
from vllm.v1.kv_cache_interface import KVCacheLayout  # noqa: E402

from hisparse_hal.cache_ops.bound import CacheOps  # noqa: E402
from hisparse_hal.errors import InvalidArgumentError  # noqa: E402
from hisparse_hal.integrations.vllm_backend import CpuHiSparseBackend  # noqa: E402

I32 = torch.int32


class Engine:
    """One HiSparse MLA layer, vLLM's handle for it, and the worker-side objects init_hisparse_kv_cache takes."""

    def __init__(self) -> None:
        backend = get_hisparse_backend()
        assert isinstance(backend, CpuHiSparseBackend)
        self.backend = backend
        config = hr.ResolvedHiSparseConfig(top_k=4, device_buffer_size=8, max_union_rows=4)
        self.handle = hr.HiSparseCacheHandle(hr.HiSparseRuntime(config, 4, PAGE // BLOCK // 2, torch.bfloat16, "cpu"))
        self.handle.index_group_caches = [self.handle]
        layer = types.SimpleNamespace(hisparse_cache=self.handle, is_draft_layer=False,
                                      kv_sharing_target_layer_name=None)  # STAND-IN for the attention module
        self.forward_context: dict[str, Any] = {LAYER: layer}
        self.block_tables = types.SimpleNamespace(
            input_block_tables=[torch.zeros(4, HOST_BLOCKS, dtype=I32) for _ in range(3)],
            slot_mappings=[torch.zeros(16, dtype=torch.int64) for _ in range(3)])
        self.vllm_config = types.SimpleNamespace(
            cache_config=types.SimpleNamespace(get_resolved_kv_cache_layout=lambda: KVCacheLayout.BLHNC),
            scheduler_config=types.SimpleNamespace(max_num_seqs=4), instance_id="hisparse-hal-init-test")

    def init(self, **changes: Any) -> dict[str, torch.Tensor]:
        arguments: dict[str, Any] = dict(kv_cache_config=vllm_config(), device=torch.device("cpu"),
                                         kernel_block_sizes=[BLOCK] * 3, vllm_config=self.vllm_config,
                                         forward_context=self.forward_context, block_tables=self.block_tables)
        arguments.update(changes)
        return hb.init_hisparse_kv_cache(**cast(Any, arguments))

    def regions(self) -> list[str]:
        return sorted(region.kind for region in self.backend.hal.regions)


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    loaded_plugin()
    install(monkeypatch, hr)
    built = Engine()
    yield built
    pool = hr.get_hisparse_host_pool(cast(Any, built.vllm_config), vllm_config())
    hr.release_pinned_state(pool.pinned, pool.shared_region)
    hr.drop_hisparse_host_pool(cast(Any, built.vllm_config))


def test_profiling_then_real_cache_pin_the_pool_once_and_keep_one_device_slab(engine: Engine) -> None:
    profiling = engine.init()
    assert engine.regions() == ["device_cache", "pinned_host"]
    real = engine.init()
    assert engine.regions() == ["device_cache", "pinned_host"], "the profiling slab's region is replaced"
    assert len(engine.backend.hal.pinned_registrations()) == 1, "the host pool outlives the profiling cache"
    assert isinstance(engine.handle.runtime.cache_ops, CacheOps)  # create_cache_ops, runtime.py:781
    resident, host = real[f"{LAYER}.hisparse_resident"], real[LAYER]
    assert resident.shape == (NUM_BLOCKS, BLOCK, PAGE // BLOCK // 2) and host.shape[0] == HOST_BLOCKS
    # The worker's spill from the real resident cache into the pinned pool is accepted (worker.py:615-619).
    resident.view(torch.uint8)[3].fill_(0x5A)
    host_block = host.view(torch.uint8).view(HOST_BLOCKS, -1)[2]
    engine.backend.swap_blocks_batch(torch.tensor([resident[3].data_ptr()]), torch.tensor([host_block.data_ptr()]),
                                     torch.tensor([PAGE]))
    assert host_block.tolist() == [0x5A] * PAGE
    stale = profiling[f"{LAYER}.hisparse_resident"]  # still alive, so its bytes are not the real slab's
    assert stale.untyped_storage().data_ptr() != resident.untyped_storage().data_ptr()
    with pytest.raises(InvalidArgumentError, match="descriptor 0"):
        engine.backend.swap_blocks_batch(torch.tensor([stale[0].data_ptr()]),
                                         torch.tensor([host_block.data_ptr()]), torch.tensor([PAGE]))


def test_a_failed_init_releases_the_pool_through_unpin_tensor(engine: Engine) -> None:
    """binding.py:163-167: release_pinned_state, unbind, drop the pool."""
    broken = types.SimpleNamespace(input_block_tables=engine.block_tables.input_block_tables, slot_mappings=[])
    with pytest.raises(IndexError):
        engine.init(block_tables=broken)
    assert engine.backend.hal.pinned_registrations() == ()
    assert engine.handle.view is None
