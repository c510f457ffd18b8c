"""vLLM 0.34.0's engine pieces end to end on hisparse-hal's CPU backend: a DeepSeek-V3.2-shaped model config written
here (two layers), engine-core KV planning, KV-cache initialisation through our backend, vLLM's ``Scheduler`` with
its ``HiSparseConnector`` planning spills that the connector worker executes through ``swap_blocks_batch``, then
speculative verification steps (one draft per request, accepted and rejected in turn, so rejected positions are
written again) at top-k 2048 through ``HiSparseCacheHandle.swap_in``, in bf16 and fp8_ds_mla, and shutdown unpinning.

Every step is checked against this file's own model of the bytes: token ``t`` of request ``r`` in layer ``l`` holds
``_row_bytes(l, r, t)`` of its latest write; after each step every written token's host row, every resident page the
worker's residency table names, every row attention reads, and both ends of every swap descriptor must agree with
it. The GPU pool is sized so that no request is preempted and vLLM keeps every context page resident: attention
reads resident pages here; host-row loads into the hot buffer are covered at the runtime level by
test_vllm_hisparse_runtime.py. What stands in for a GPU model runner, model or drafter is marked STAND-IN.
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integrations.with_vllm.cpu_standins import install
from tests.integrations.with_vllm.vllm_env import loaded_plugin, require_vllm

require_vllm()

from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.hisparse import worker as hw  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.connector import HiSparseConnector  # noqa: E402
from vllm.model_executor.layers.attention.mla_attention import get_kv_quant_mode  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseBackend  # noqa: E402
from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerBackend  # noqa: E402
from vllm.v1.attention.backends.utils import resolve_kv_cache_layout  # noqa: E402
from vllm.v1.core import kv_cache_planning as planning  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    generate_scheduler_kv_cache_config,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.hisparse import binding as hb  # noqa: E402
from vllm.v1.hisparse import runtime as hr  # noqa: E402
from vllm.v1.hisparse.backend import get_hisparse_backend  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    HiSparseHotSpec,
    HiSparseResidentSpec,
    MLAAttentionSpec,
    SparseCacheRole,
)
from vllm.v1.outputs import DraftTokenIds, KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

I32, I64 = torch.int32, torch.int64
LAYERS, BLOCK, TOP_K, MAX_MODEL_LEN, MAX_SEQS = 2, 64, 2048, 4096, 4
GPU_BLOCKS, HOST_POOL_GIB = 1100, 0.05  # room for every request's hot buffer: no preemption
PROMPTS = {"r0": 2600, "r1": 2300, "r2": 2200}  # longer than top-k: attention selects among host rows
DECODE_STEPS = 4  # verification steps: drafts accepted, rejected, accepted, rejected

#: DeepSeek-V3.2's published attention shape (MLA 512 + 64, indexer 64 heads x 128, top-k 2048), two layers.
DEEPSEEK_V32 = {
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": LAYERS,
    "num_attention_heads": 128, "num_key_value_heads": 128, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "index_topk": TOP_K, "index_head_dim": 128,
    "index_n_heads": 64, "first_k_dense_replace": 1, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "topk_method": "noaux_tc", "norm_topk_prob": True, "max_position_embeddings": 163840, "rms_norm_eps": 1e-6,
    "rope_theta": 10000, "vocab_size": 129280, "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
}
#: cache dtype -> (row width in elements, element dtype): MLA's 576 values, or fp8_ds_mla's 656-byte rows
#: (vllm/v1/attention/backend.py:1017-1018).
ROWS = {"auto": (576, torch.bfloat16), "fp8_ds_mla": (656, torch.uint8)}


def _row_bytes(layer: int, request: int, tokens: torch.Tensor, row_bytes: int, version: int = 0) -> torch.Tensor:
    """The model's bytes for ``tokens`` of one request and layer: ``[len(tokens), row_bytes]`` uint8."""
    column = torch.arange(row_bytes, dtype=I64)
    mixed = tokens.to(I64)[:, None] * 131 + column[None, :] * 7 + layer * 29 + request * 53 + version * 97
    return (mixed % 251).to(torch.uint8)


def _vllm_config(model_dir: Path, cache_dtype: str) -> VllmConfig:
    model = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN,
                        dtype="bfloat16")
    return VllmConfig(
        model_config=model, device_config=DeviceConfig(device="cpu"),
        cache_config=CacheConfig(block_size=BLOCK, cache_dtype=cache_dtype, num_gpu_blocks_override=GPU_BLOCKS),
        scheduler_config=SchedulerConfig(max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False,
                                         max_num_seqs=MAX_SEQS, max_num_batched_tokens=MAX_MODEL_LEN,
                                         disable_hybrid_kv_cache_manager=False),
        kv_transfer_config=KVTransferConfig(kv_connector="HiSparseConnector", kv_role="kv_both",
                                            kv_connector_extra_config={"host_pool_gib": HOST_POOL_GIB}),
        speculative_config=SpeculativeConfig(model="ngram", num_speculative_tokens=1))


def _layer_specs(cache_dtype: str) -> dict[str, Any]:
    """STAND-IN for the model's attention layers' ``get_kv_cache_spec`` (mla_attention.py:1571-1598,
    deepseek_v2.py:658-665): the specs DeepSeek-V3.2's MLA and indexer layers report, without building the model."""
    width, dtype = ROWS[cache_dtype]
    specs: dict[str, Any] = {}
    for layer in range(LAYERS):
        specs[f"model.layers.{layer}.self_attn.attn"] = MLAAttentionSpec(
            block_size=BLOCK, num_kv_heads=1, max_tp_shards=1, head_size=576, dtype=dtype,
            cache_dtype_str=cache_dtype, kv_quant_mode=get_kv_quant_mode(cache_dtype),
            state_content_bytes=width if cache_dtype == "fp8_ds_mla" else None, is_index_group_leader=True)
        specs[f"model.layers.{layer}.self_attn.indexer.k_cache"] = MLAAttentionSpec(
            block_size=BLOCK, num_kv_heads=1, max_tp_shards=1, head_size=132, dtype=torch.uint8,
            cache_role=SparseCacheRole.INDEXER)
    return specs


class Engine:
    """vLLM's engine core (planning, Scheduler with HiSparseConnector) and one worker (KV init, connector worker),
    with a model runner stand-in that keeps the block tables and writes each scheduled token's KV rows."""

    def __init__(self, model_dir: Path, cache_dtype: str) -> None:
        self.cache_dtype = cache_dtype
        self.width, self.dtype = ROWS[cache_dtype]
        self.row_bytes = self.width * self.dtype.itemsize
        self.config = config = _vllm_config(model_dir, cache_dtype)
        self.backend = get_hisparse_backend()
        # Engine core: the worker's specs with HiSparse's derived resident/hot specs (binding.py:45-80), the
        # layout, the planning and the scheduler's config (vllm/v1/engine/core.py:300-400).
        raw = _layer_specs(cache_dtype)
        # STAND-IN for the layers themselves: only their attention backend classes are read (binding.py:62).
        backends = {name: types.SimpleNamespace(get_attn_backend=lambda name=name: (
            DeepseekV32IndexerBackend if "indexer" in name else FlashMLASparseBackend)) for name in raw}
        specs = [hb.resolve_hisparse_specs(config, raw, backends)]
        resolve_kv_cache_layout(config, [["BLHNC"]], list(specs[0].values()))  # STAND-IN: the workers' layouts
        groups = planning.get_global_kv_cache_groups(config, specs)
        (self.kv_config,) = planning.get_kv_cache_configs(config, specs, [2**30], groups)
        scheduler_config = generate_scheduler_kv_cache_config([self.kv_config])
        config.cache_config.num_gpu_blocks = scheduler_config.num_blocks
        block_size, hash_block_size = resolve_kv_cache_block_sizes(scheduler_config, config)
        for kv_config in (self.kv_config, scheduler_config):
            kv_config.hash_block_size = hash_block_size
        self.groups = self.kv_config.kv_cache_groups
        (self.source_group,) = self.kv_config.host_group_ids
        self.resident_groups = [g for g, group in enumerate(self.groups)
                                if isinstance(group.kv_cache_spec, HiSparseResidentSpec)]
        assert len(self.resident_groups) == LAYERS
        assert sum(isinstance(group.kv_cache_spec, HiSparseHotSpec) for group in self.groups) == LAYERS
        # Worker: one HiSparse handle per MLA layer, as the index group builds it (index_group.py:186-205).
        forward_context = config.compilation_config.static_forward_context
        self.handles = []
        for layer in range(LAYERS):
            handle = hr.create_hisparse_cache_handle(config, TOP_K, is_index_group_leader=True, row_width=self.width,
                                                     kv_dtype=self.dtype, device="cpu")
            assert handle is not None
            handle.index_group_caches = [handle]
            self.handles.append(handle)
            forward_context[f"model.layers.{layer}.self_attn.attn"] = types.SimpleNamespace(  # STAND-IN: the layer
                hisparse_cache=handle, is_draft_layer=False, kv_sharing_target_layer_name=None)
        max_pages = 2 * MAX_MODEL_LEN // BLOCK  # the hot group needs device_buffer_size / BLOCK columns
        # STAND-IN for the GPU model runner's BlockTables (vllm/v1/worker/gpu/block_table.py): per group, the
        # batch's block table and this step's slot mapping.
        self.block_tables = types.SimpleNamespace(
            input_block_tables=[torch.zeros(MAX_SEQS, max_pages, dtype=I32) for _ in self.groups],
            slot_mappings=[torch.full((MAX_MODEL_LEN,), -1, dtype=I64) for _ in self.groups])
        self.kv_caches = hb.init_hisparse_kv_cache(self.kv_config, torch.device("cpu"), [BLOCK] * len(self.groups),
                                                   config, forward_context, self.block_tables)
        self.connector = HiSparseConnector(config, KVConnectorRole.WORKER, self.kv_config)
        self.connector.register_kv_caches(self.kv_caches)
        self.scheduler = Scheduler(vllm_config=config, kv_cache_config=scheduler_config,
                                   structured_output_manager=StructuredOutputManager(config),
                                   block_size=block_size, hash_block_size=hash_block_size)
        self.versions: dict[str, torch.Tensor] = {}  # per request: how many times each position was written
        self.block_ids: dict[str, list[list[int]]] = {}
        self.computed: dict[str, int] = {}
        self.accept = True  # whether the drafter's token is accepted this step
        self.last_owners = torch.zeros(0, dtype=I64)  # the batch row of each query row in the last step

    # -- the model's view ----------------------------------------------------------------------------------------
    def expected(self, layer: int, request: int, tokens: torch.Tensor) -> torch.Tensor:
        """The bytes the model says ``tokens`` of ``request`` hold in ``layer`` (their latest write)."""
        versions = self.versions[f"r{request}"][tokens]
        rows = _row_bytes(layer, request, tokens, self.row_bytes)
        for version in versions.unique().tolist():
            if version > 1:
                hit = versions == version
                rows[hit] = _row_bytes(layer, request, tokens[hit], self.row_bytes, version - 1)
        return rows

    def host_rows(self, layer: int) -> torch.Tensor:
        return self.kv_caches[f"model.layers.{layer}.self_attn.attn"].view(torch.uint8).reshape(-1, self.row_bytes)

    def resident_rows(self, layer: int) -> torch.Tensor:
        view = self.handles[layer].view
        assert view is not None
        return view.cache.view(torch.uint8).reshape(-1, self.row_bytes)

    def bytes_at(self, address: int, size: int) -> bytes:
        """The ``size`` bytes at ``address`` in one layer's host pool or resident cache (a descriptor's span)."""
        for layer in range(LAYERS):
            for rows in (self.host_rows(layer), self.resident_rows(layer)):
                offset = address - rows.data_ptr()
                if 0 <= offset and offset + size <= rows.numel():
                    return rows.reshape(-1)[offset:offset + size].numpy().tobytes()
        raise AssertionError(f"descriptor address {address:#x} is in no host pool or resident cache")

    def host_row_of(self, request: str, tokens: torch.Tensor) -> torch.Tensor:
        table = torch.tensor(self.block_ids[request][self.source_group], dtype=I64)
        return table[tokens // BLOCK] * BLOCK + tokens % BLOCK

    # -- one engine step ---------------------------------------------------------------------------------------
    def step(self, topk_per_request: dict[str, torch.Tensor] | None = None) -> Any:
        """schedule -> worker (start_load_kv, the forward's KV writes, swap_in, finish_forward) -> update."""
        out = self.scheduler.schedule()
        for new in out.scheduled_new_reqs:
            assert new.req_id not in self.block_ids, "preempted and resumed: this test sizes the cache to avoid it"
            self.block_ids[new.req_id] = [list(ids) for ids in new.block_ids]
            self.computed[new.req_id] = new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        for req_id, new_ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
            if new_ids is not None:
                for group, ids in enumerate(new_ids):
                    self.block_ids[req_id][group].extend(ids)
        batch = list(out.num_scheduled_tokens)
        states = torch.tensor([int(req_id[1:]) for req_id in batch], dtype=I32)  # STAND-IN: input batch rows
        positions, owners = self._fill_tables(batch, out.num_scheduled_tokens)
        decode = bool(batch) and all(req_id in out.scheduled_spec_decode_tokens for req_id in batch)  # verification
        attention = types.SimpleNamespace(  # STAND-IN for the sparse-MLA attention metadata HiSparse reads
            num_actual_tokens=len(positions), num_reqs=len(batch), req_id_per_token=owners.to(I32),
            max_query_len=max(out.num_scheduled_tokens.values(), default=0),
            num_decode_tokens=len(positions) if decode else 0)
        self.connector.bind_connector_metadata(out.kv_connector_metadata)
        self.connector.start_load_kv(types.SimpleNamespace(), request_state_indices=states, request_ids=batch,
                                     num_tokens=len(positions),
                                     attn_metadata={f"model.layers.{i}.self_attn.attn": attention
                                                    for i in range(LAYERS)} if batch else None)
        self._write_kv(batch, positions, owners)
        results = None
        self.last_owners = owners
        if topk_per_request is not None and decode:
            results = self._attend(batch, owners, attention, topk_per_request)
        self.connector.finish_forward()
        worker_meta = self.connector.build_connector_worker_meta()
        self.connector.clear_connector_metadata()
        sampled: list[list[int]] = []
        for req_id in batch:
            request = self.scheduler.requests[req_id]
            end = self.computed[req_id] + out.num_scheduled_tokens[req_id]
            drafts = len(out.scheduled_spec_decode_tokens.get(req_id, ()))
            if end < request.num_prompt_tokens:
                sampled.append([])
            elif drafts and self.accept:
                sampled.append([9, 7])  # the draft (9) accepted, and the bonus token
            else:
                sampled.append([7])  # any draft rejected: its position is written again next step
        output = ModelRunnerOutput(req_ids=batch, sampled_token_ids=sampled,
                                   kv_connector_output=KVConnectorOutput(kv_connector_worker_meta=worker_meta))
        self.scheduler.update_from_output(out, output)
        for req_id in batch:
            self.computed[req_id] = self.scheduler.requests[req_id].num_computed_tokens
        running = [req_id for req_id, tokens in zip(batch, sampled, strict=True) if tokens]
        assert all(req_id in self.scheduler.requests for req_id in running), "max_tokens leaves room for every step"
        self.scheduler.update_draft_token_ids(DraftTokenIds(running, [[9]] * len(running)))  # STAND-IN: drafter
        return out, results

    def _fill_tables(self, batch: list[str], scheduled: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor]:
        positions, owners = [], []
        for row, req_id in enumerate(batch):
            start = self.computed[req_id]
            positions.append(torch.arange(start, start + scheduled[req_id]))
            owners.append(torch.full((scheduled[req_id],), row, dtype=I64))
            scheduler_view = self.scheduler.kv_cache_manager.get_block_ids(req_id)
            assert [list(ids) for ids in scheduler_view] == self.block_ids[req_id], req_id
            for group, ids in enumerate(self.block_ids[req_id]):
                table = self.block_tables.input_block_tables[group]
                table[row].zero_()
                table[row, :len(ids)] = torch.tensor(ids, dtype=I32)
        flat_positions = torch.cat(positions) if positions else torch.zeros(0, dtype=I64)
        flat_owners = torch.cat(owners) if owners else torch.zeros(0, dtype=I64)
        for group, mapping in enumerate(self.block_tables.slot_mappings):
            table = self.block_tables.input_block_tables[group].to(I64)
            mapping.fill_(-1)
            if table.count_nonzero() == 0:
                continue
            blocks = table[flat_owners, flat_positions // BLOCK]
            mapping[:len(flat_positions)] = torch.where(blocks > 0, blocks * BLOCK + flat_positions % BLOCK, -1)
        return flat_positions, flat_owners

    def _write_kv(self, batch: list[str], positions: torch.Tensor, owners: torch.Tensor) -> None:
        """STAND-IN for the attention layers' KV-cache write: each scheduled token's row into the resident cache
        at the resident group's slot mapping (what vLLM's sparse-MLA forward writes)."""
        for row, req_id in enumerate(batch):
            versions = self.versions.setdefault(req_id, torch.zeros(MAX_MODEL_LEN + 8, dtype=I64))
            versions[positions[owners == row]] += 1  # a rejected speculative position is written again later
        for layer, group in enumerate(self.resident_groups):
            slots = self.block_tables.slot_mappings[group][:len(positions)]
            for row, req_id in enumerate(batch):
                mine = (owners == row) & (slots >= 0)
                self.resident_rows(layer)[slots[mine]] = self.expected(layer, int(req_id[1:]), positions[mine])

    def _attend(self, batch: list[str], owners: torch.Tensor, attention: Any,
                topk_per_request: dict[str, torch.Tensor]) -> list[Any]:
        """STAND-IN for the sparse-MLA attention backend's call (index_group.py:255-262): the indexer's top-k
        tokens per query row, resolved by every layer's ``swap_in``."""
        self.handles[0].prepare_group_for_batch(attention)
        logical = torch.stack([topk_per_request[batch[int(row)]] for row in owners]).to(I32)
        source = self.block_tables.input_block_tables[self.source_group]
        results = []
        for layer, handle in enumerate(self.handles):
            results.append(handle.swap_in(owners.to(I32), source, logical, block_size=BLOCK,
                                          num_valid_rows=torch.tensor([len(owners)], dtype=I32),
                                          return_valid_counts=layer == 0))
        return results

    # -- checks ------------------------------------------------------------------------------------------------
    def check_rows(self) -> tuple[int, int]:
        """Every token a step has written holds its bytes in its host row (the connector mirrors and spills it
        there) and, where the worker's residency table names a resident page for its request and page, in that
        page too (what attention reads). Returns how many (token, layer) rows were checked in each place."""
        residency = self.handles[0].residency
        assert residency is not None
        resident_count = host_count = 0
        for req_id, computed in self.computed.items():
            tokens = torch.arange(computed)
            state = int(req_id[1:])
            for layer in range(LAYERS):
                expected = self.expected(layer, state, tokens)
                blocks = residency[layer, state, tokens // BLOCK].to(I64)
                on_device = blocks > 0
                device_rows = blocks[on_device] * BLOCK + tokens[on_device] % BLOCK
                assert torch.equal(self.resident_rows(layer)[device_rows], expected[on_device]), \
                    (self.cache_dtype, req_id, layer, "resident")
                assert torch.equal(self.host_rows(layer)[self.host_row_of(req_id, tokens)], expected), \
                    (self.cache_dtype, req_id, layer, "host")
                resident_count += int(on_device.sum())
                host_count += len(tokens)
        return resident_count, host_count

    def check_attention(self, batch: list[str], results: list[Any], topk_per_request: dict[str, torch.Tensor]) -> int:
        """Every top-k token's row, where attention reads it after ``swap_in``, holds that token's bytes."""
        checked = 0
        for layer, handle in enumerate(self.handles):
            indices = results[layer][0] if layer == 0 else results[layer]
            rows = handle.runtime.hot.attention_cache.view(torch.uint8).reshape(-1, self.row_bytes)
            for row, owner in enumerate(self.last_owners.tolist()):  # one query row per scheduled token
                req_id = batch[owner]
                tokens = topk_per_request[req_id]
                valid = tokens >= 0
                held = rows[indices[row][valid].to(I64)]
                assert torch.equal(held, self.expected(layer, int(req_id[1:]), tokens[valid])), \
                    (self.cache_dtype, layer, req_id, row)
                assert (indices[row][~valid] == -1).all()
                checked += int(valid.sum())
        return checked


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("deepseek-v32-small")
    (directory / "config.json").write_text(json.dumps(DEEPSEEK_V32))
    return directory


@pytest.fixture(params=["auto", "fp8_ds_mla"], ids=["bf16", "fp8_ds_mla"])
def engine(request: pytest.FixtureRequest, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    loaded_plugin()
    install(monkeypatch, hr, hw)
    # STAND-IN: vLLM's GPU platforms say they support the hybrid KV cache manager, which HiSparse requires
    # (vllm/config/vllm.py:2153-2155); this CPU process runs vLLM's UnspecifiedPlatform, which says no.
    monkeypatch.setattr(current_platform, "support_hybrid_kv_cache", lambda: True)
    monkeypatch.setattr(hr, "_HOST_POOLS", {}, raising=False)
    built = Engine(model_dir, request.param)
    yield built
    if built.connector.connector_worker is not None and built.connector.connector_worker._initialized:
        built.connector.shutdown()
    hr.drop_hisparse_host_pool(built.config)


def test_engine_prefill_spills_and_decode_steps_keep_every_row_where_vllm_reads_it(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = engine.backend.swap_blocks_batch
    calls: list[int] = []

    def counted(src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor) -> None:
        """Runs our swap, then checks each descriptor's destination bytes equal its source's."""
        calls.append(len(sizes))
        spy(src, dst, sizes)
        for source, destination, size in zip(src.tolist(), dst.tolist(), sizes.tolist(), strict=True):
            assert engine.bytes_at(destination, size) == engine.bytes_at(source, size)

    monkeypatch.setattr(engine.backend, "swap_blocks_batch", counted)  # the backend instance is per process
    gen = torch.Generator().manual_seed(5)
    for req_id, length in PROMPTS.items():
        engine.scheduler.add_request(Request(req_id, list(range(length)), SamplingParams(max_tokens=4 * DECODE_STEPS),
                                             None))
    spills = 0
    while any(engine.computed.get(r, 0) < n for r, n in PROMPTS.items()):
        out, _ = engine.step()
        command = out.kv_connector_metadata.command
        spills += len(command.page_transfers) if command is not None else 0
        assert sum(engine.check_rows()) > 0
    assert spills > 0 and calls, "the scheduler planned spills and the worker ran them through swap_blocks_batch"
    decoded = 0
    for _ in range(4 * DECODE_STEPS):  # steps with nothing scheduled let the worker report finished spills
        topk = {}
        for req_id in PROMPTS:
            computed = engine.computed[req_id]
            chosen = torch.randperm(computed, generator=gen)[:TOP_K - 8]
            rewritten = (engine.versions[req_id][:computed] > 1).nonzero().flatten()
            chosen[:len(rewritten)] = rewritten  # rows written twice are read: attention must see the new bytes
            topk[req_id] = torch.cat([chosen, torch.full((8,), -1, dtype=I64)])
        engine.accept = decoded % 2 == 0
        out, results = engine.step(topk)
        assert sum(engine.check_rows()) > 0
        if results is None:
            continue
        batch = list(out.num_scheduled_tokens)
        assert engine.check_attention(batch, results, topk) == LAYERS * len(engine.last_owners) * (TOP_K - 8)
        assert len(engine.last_owners) == 2 * len(batch), "each request verifies one draft: two query rows"
        decoded += 1
        if decoded == DECODE_STEPS:
            break
    assert decoded == DECODE_STEPS
    rewrites = sum(int((versions > 1).sum()) for versions in engine.versions.values())
    # Step 2's rejected drafts were written again in step 3 and read in step 4 (step 4's are not rewritten yet).
    assert rewrites == len(PROMPTS), rewrites
    engine.connector.shutdown()
    assert engine.backend.hal.pinned_registrations() == ()
    # The host pool's registration is gone. The device slab's stays: vLLM 0.34.0 makes no backend call when it
    # drops its KV caches; our backend replaces it at the next prepare_kv_cache_views (binding.py:150).
    assert sorted(region.kind for region in engine.backend.hal.regions) == ["device_cache"]
