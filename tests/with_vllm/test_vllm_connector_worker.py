"""vLLM 0.34.0's ``HiSparseConnectorWorker`` on hisparse-hal's CPU backend: page spills (``swap_blocks_batch``
from the registered device slab to the pinned host pool), tail restores, bad spills, decode-step invalidation
and shutdown (``unpin_tensor``), driven through its own ``initialize``/``start_step``/``finish_forward``.

The worker's caches are bound with vLLM's binders over a slab that ``prepare_kv_cache_views`` registered from a
vLLM ``KVCacheConfig``; its config objects carry only the fields the worker reads (worker.py:194-366).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterator
from typing import Any, cast

import pytest
import torch

from tests.with_vllm.cpu_standins import install
from tests.with_vllm.test_vllm_backend_contract import vllm_config
from tests.with_vllm.vllm_env import loaded_plugin, require_vllm

require_vllm()

from vllm.distributed.kv_transfer.kv_connector.v1.hisparse import worker as hw  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.connector import (  # noqa: E402
    HiSparseConnectorMetadata,
)
from vllm.v1.hisparse import runtime as hr  # noqa: E402
from vllm.v1.hisparse.backend import get_hisparse_backend  # noqa: E402
from vllm.v1.hisparse.types import (  # noqa: E402
    SparseKVOffloadCommand,
    SparseKVPageTransfer,
    SparseKVRowMirror,
)

from hisparse_hal.errors import InvalidDescriptorError, UnpinError  # noqa: E402

I32 = torch.int32
LAYERS, BLOCK, ROW_WIDTH, DTYPE = 2, 4, 32, torch.bfloat16  # 64-byte rows, the contract test's config
ROW_BYTES = ROW_WIDTH * DTYPE.itemsize
PAGE = BLOCK * ROW_BYTES
NUM_BLOCKS, HOST_BLOCKS, MAX_REQS, TOP_K = 8, 6, 4, 4
RESIDENT, HOT = "model.layers.0.self_attn.attn.hisparse_resident", "model.layers.0.self_attn.attn.hisparse_hot"


class Setup:
    """LAYERS runtimes of one index group over one device slab and one pinned host pool, and the worker."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(3)
        self.backend = get_hisparse_backend()
        # One slab holding every layer's page side by side; one pool holding every layer's host rows.
        self.slab = torch.randint(0, 256, (NUM_BLOCKS * LAYERS * PAGE,), dtype=torch.uint8, generator=gen)
        self.pool = torch.randint(-128, 128, (LAYERS * HOST_BLOCKS * PAGE,), dtype=torch.int8, generator=gen)
        self.backend.pin_tensor(self.pool)  # allocate_pinned_host_pool (runtime.py:223-228)
        self.host_kv = [self.pool[i * HOST_BLOCKS * PAGE:(i + 1) * HOST_BLOCKS * PAGE].view(DTYPE)
                        .view(HOST_BLOCKS, BLOCK, ROW_WIDTH) for i in range(LAYERS)]
        config = vllm_config()
        config.kv_cache_tensors[0].size = config.kv_cache_tensors[1].size = self.slab.numel()
        self.backend.prepare_kv_cache_views(config, {RESIDENT: self.slab, HOT: self.slab,
                                                     "model.layers.0.self_attn.attn": self.host_kv[0]}, {})
        resolved = hr.ResolvedHiSparseConfig(top_k=TOP_K, device_buffer_size=2 * TOP_K, max_union_rows=TOP_K,
                                             eager_host_mirror=False)
        leader = hr.HiSparseRuntime(resolved, MAX_REQS, ROW_WIDTH, DTYPE, "cpu", max_swap_rows=8)
        self.runtimes = [leader] + [hr.HiSparseRuntime(resolved, MAX_REQS, ROW_WIDTH, DTYPE, "cpu",
                                                       index_group=leader.index_group) for _ in range(LAYERS - 1)]
        self.handles = [hr.HiSparseCacheHandle(runtime) for runtime in self.runtimes]
        hot_table = torch.arange(1, 1 + MAX_REQS * 2, dtype=I32).view(MAX_REQS, 2)
        self.residency = torch.zeros((1, MAX_REQS, HOST_BLOCKS), dtype=I32)
        for layer, (runtime, handle) in enumerate(zip(self.runtimes, self.handles, strict=True)):
            binding: dict[str, Any] = dict(byte_offset=layer * PAGE, block_stride=LAYERS * PAGE, num_blocks=NUM_BLOCKS,
                           block_size=BLOCK)
            runtime.bind_hot_cache(self.slab, **binding, block_table=hot_table)
            handle.bind_cache(self.slab, **binding, block_table=self.residency[0],
                              slot_mapping=torch.zeros(16, dtype=torch.int64))
            handle.residency = self.residency
            runtime.resident_source_index = 0
            runtime.bind_source_cache(self.host_kv[layer], registered_host_pool=self.pool)
            handle.index_group_caches = self.handles
            handle.draft_layer = False
        hr.initialize_hisparse_runtime_buffers(self.handles, max_num_reqs=MAX_REQS)
        vllm_cfg = types.SimpleNamespace(
            scheduler_config=types.SimpleNamespace(max_num_batched_tokens=16, max_num_seqs=MAX_REQS),
            num_lookahead_tokens=0, instance_id="hisparse-hal-test")
        kv_config = types.SimpleNamespace(hisparse_host_num_blocks=HOST_BLOCKS)
        self.worker = hw.HiSparseConnectorWorker(cast(Any, vllm_cfg), cast(Any, kv_config))
        self.worker.initialize(self.handles, [f"layer{i}" for i in range(LAYERS)], MAX_REQS, HOST_BLOCKS,
                               torch.device("cpu"), [self.pool])

    def resident_page(self, layer: int, block: int) -> torch.Tensor:
        view = self.handles[layer].view
        assert view is not None
        return view.cache[block]


def metadata(transfers: list[SparseKVPageTransfer] | None = None) -> HiSparseConnectorMetadata:
    return HiSparseConnectorMetadata(
        command=SparseKVOffloadCommand(page_transfers=transfers or []), host_block_copies=(), source_block_ids=(),
        row_mirrors={}, all_context_pages_resident=False, residency_updates={})


@pytest.fixture
def setup(monkeypatch: pytest.MonkeyPatch) -> Iterator[Setup]:
    loaded_plugin()
    install(monkeypatch, hr, hw)
    built = Setup()
    yield built
    if built.worker._initialized:
        built.worker.shutdown()


def test_post_forward_spills_reach_the_host_pool_through_our_swap(setup: Setup) -> None:
    worker = setup.worker
    spills = [SparseKVPageTransfer(transfer_id=7, host_block_id=3, resident_block_ids=(5,)),
              SparseKVPageTransfer(transfer_id=8, host_block_id=0, resident_block_ids=(2,))]
    expected = {(layer, host): setup.resident_page(layer, block).clone()
                for layer in range(LAYERS) for host, block in ((3, 5), (0, 2))}
    worker.start_step(metadata(spills), torch.tensor([0, 1], dtype=I32), ["a", "b"], num_tokens=2)
    worker.finish_forward()
    assert worker.take_transfer_updates() == ([], [])  # spills run at the next step's start (worker.py:919-935)
    worker.start_step(metadata(), torch.tensor([0, 1], dtype=I32), ["a", "b"], num_tokens=2)
    for (layer, host), page in expected.items():
        assert torch.equal(setup.host_kv[layer][host].view(torch.uint8), page.view(torch.uint8)), (layer, host)
    assert worker.take_transfer_updates() == ([7, 8], [7, 8])
    worker.finish_forward()


def test_restores_copy_host_tails_into_resident_pages(setup: Setup) -> None:
    worker = setup.worker
    restore = SparseKVPageTransfer(transfer_id=9, host_block_id=4, resident_block_ids=(6,), restore=True)
    worker.start_step(metadata([restore]), torch.tensor([0], dtype=I32), ["a"], num_tokens=1)
    for layer in range(LAYERS):
        assert torch.equal(setup.resident_page(layer, 6), setup.host_kv[layer][4])
    assert worker.take_transfer_updates() == ([9], [9])
    worker.finish_forward()


def test_a_spill_outside_the_registered_regions_is_refused_before_copying(setup: Setup) -> None:
    pool_before = setup.pool.clone()
    outside = torch.zeros(PAGE, dtype=torch.uint8)
    with pytest.raises(InvalidDescriptorError, match="descriptor 0"):
        setup.backend.swap_blocks_batch(torch.tensor([outside.data_ptr()]), torch.tensor([setup.pool.data_ptr()]),
                                        torch.tensor([PAGE]))
    assert torch.equal(setup.pool, pool_before)


def test_a_forward_mirrors_written_rows_and_invalidates_their_hot_copies(setup: Setup) -> None:
    """start_step -> prepare_forward -> finish_forward: the written rows reach the host through
    swap_blocks_batch (worker.py:650-701) and HiSparseSlotInvalidator drops their stale hot copies (:889-894)."""
    worker = setup.worker
    group = setup.runtimes[0].index_group
    group.device_global_indices[2, :3] = torch.tensor([13, 9, 14], dtype=I32)
    group.device_global_indices[1, 0] = 13
    written = torch.tensor([13, 14], dtype=torch.int64)  # the host group's slot mapping, shared (binding.py:331)
    for handle in setup.handles:
        handle.mirror_slot_mapping = written
    # The forward writes resident rows 5*BLOCK+1 and +2 (the resident slot mapping, staged at start_step,
    # worker.py:475-504); the scheduler's envelope maps them to host rows 13 and 14.
    assert setup.handles[0].slot_mapping is not None
    setup.handles[0].slot_mapping[:2] = torch.tensor([5 * BLOCK + 1, 5 * BLOCK + 2])
    mirror = SparseKVRowMirror(source_starts=(5 * BLOCK + 1,), destination_start=13, num_rows=2)
    step = dataclasses.replace(metadata(), row_mirrors={"a": (mirror,)})
    worker.start_step(step, torch.tensor([2, 1], dtype=I32), ["a", "b"], num_tokens=2)
    # A two-token prefill chunk of request "a" (batch row 0, state row 2): not a decode batch, so mirrored now.
    attention = types.SimpleNamespace(num_actual_tokens=2, num_decode_tokens=0, max_query_len=2, num_reqs=1,
                                      req_id_per_token=torch.tensor([0, 0], dtype=I32))
    worker.prepare_forward({"layer0": attention})
    assert all(handle.host_mirror_required and not handle.decode_batch for handle in setup.handles)
    worker.finish_forward()
    assert group.device_global_indices[2, :3].tolist() == [-1, 9, -1]  # request 0's state row only
    assert int(group.device_global_indices[1, 0]) == 13
    for layer in range(LAYERS):
        host_rows = setup.host_kv[layer].view(-1, ROW_WIDTH)[13:15]
        assert torch.equal(host_rows, setup.resident_page(layer, 5)[1:3]), layer


def test_shutdown_unpins_through_the_backend_and_unbinds(setup: Setup) -> None:
    setup.worker.shutdown()
    with pytest.raises(UnpinError, match="was not pinned"):
        setup.backend.unpin_tensor(setup.pool)
    assert all(handle.view is None for handle in setup.handles)
