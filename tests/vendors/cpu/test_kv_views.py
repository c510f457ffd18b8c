"""KV cache config validation and views through the CPU reference device."""

from __future__ import annotations

import itertools

import pytest
import torch

from hisparse_hal import KVCacheConfig, LayerSpec
from hisparse_hal.errors import InvalidArgumentError, InvalidDescriptorError
from hisparse_hal.vendors.cpu.backend import CpuBackend

DTYPES = {"bf16": torch.bfloat16, "fp8_e4m3fn": torch.float8_e4m3fn, "fp8_e4m3fnuz": torch.float8_e4m3fnuz,
          "fp8_ds_mla": torch.uint8}


@pytest.fixture
def backend() -> CpuBackend:
    return CpuBackend()


def _mla(layers=("l0", "l1"), offsets=None, num_blocks=4, block_size=2, row_width=656) -> KVCacheConfig:
    offsets = offsets or [i * num_blocks * block_size * row_width for i in range(len(layers))]
    return KVCacheConfig("fp8_ds_mla", num_blocks, block_size, row_width,
                         tuple(LayerSpec(name, off) for name, off in zip(layers, offsets, strict=True)))


@pytest.mark.parametrize("fmt", sorted(DTYPES))
def test_every_format_is_accepted_and_viewed_with_its_dtype(backend, fmt):
    width = 656 if fmt == "fp8_ds_mla" else 64
    config = KVCacheConfig(fmt, 4, 2, width, (LayerSpec("layer"),))
    backend.validate_kv_cache_config(config)
    storage = torch.zeros(config.layer_bytes, dtype=torch.uint8)
    kv_caches = {"layer": storage}
    backend.prepare_kv_cache_views(config, kv_caches, forward_context={})
    view = kv_caches["layer"]
    assert view.dtype == DTYPES[fmt] and view.shape == (4, 2, width)
    assert view.untyped_storage().data_ptr() == storage.untyped_storage().data_ptr()


def test_views_of_layers_sharing_one_allocation_share_storage_and_never_overlap(backend):
    config = _mla(layers=("l0", "l1", "l2"))
    shared = torch.zeros(3 * config.layer_bytes, dtype=torch.uint8)
    kv_caches = {name: shared for name in ("l0", "l1", "l2")}
    forward_context = {"untouched": True}
    backend.prepare_kv_cache_views(config, kv_caches, forward_context)
    spans = []
    for name in ("l0", "l1", "l2"):
        view = kv_caches[name]
        assert view.untyped_storage().data_ptr() == shared.untyped_storage().data_ptr()
        spans.append((view.data_ptr(), view.data_ptr() + config.layer_bytes))
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    kv_caches["l1"].fill_(7)  # writing one layer leaves the others alone
    assert kv_caches["l0"].eq(0).all() and kv_caches["l2"].eq(0).all()
    assert forward_context == {"untouched": True}


def test_overlapping_layer_offsets_are_rejected_and_nothing_changes(backend):
    config = _mla(offsets=[0, 656 * 4])  # the second layer starts inside the first
    shared = torch.zeros(3 * config.layer_bytes, dtype=torch.uint8)
    kv_caches = {"l0": shared, "l1": shared}
    with pytest.raises(InvalidArgumentError, match=r"KV cache layers 'l0' and 'l1' overlap by \d+ bytes"):
        backend.prepare_kv_cache_views(config, kv_caches, {})
    assert kv_caches["l0"] is shared and kv_caches["l1"] is shared and len(backend.regions) == 0


def test_fp8_ds_mla_needs_656_byte_rows(backend):
    backend.validate_kv_cache_config(_mla(row_width=656))
    with pytest.raises(InvalidArgumentError, match=r"'fp8_ds_mla' rows are 656 bytes .* got row_width 640 = 640 bytes"):
        backend.validate_kv_cache_config(_mla(row_width=640))


@pytest.mark.parametrize(
    "config, message",
    [
        (KVCacheConfig("fp16", 4, 2, 64, (LayerSpec("l"),)), r"unknown KV format 'fp16'; known formats are"),
        (KVCacheConfig("bf16", 0, 2, 64, (LayerSpec("l"),)), r"num_blocks must be a positive int, got 0"),
        (KVCacheConfig("bf16", 4, 2, 64, ()), r"has no layers"),
        (KVCacheConfig("bf16", 4, 2, 64, (LayerSpec("l"), LayerSpec("l", 4096))), r"'l' appears twice"),
        (
            KVCacheConfig("bf16", 4, 2, 64, (LayerSpec("l", 3),)),
            r"offset 3 must be >= 0 and a multiple of the 128-byte row",
        ),
    ],
    ids=["unknown_format", "zero_blocks", "no_layers", "duplicate_layer", "misaligned_offset"],
)
def test_bad_configs_are_rejected(backend, config, message):
    with pytest.raises(InvalidArgumentError, match=message):
        backend.validate_kv_cache_config(config)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda c: {}, r"layer 'l0' is not in kv_caches"),
        (
            lambda c: {"l0": torch.zeros(c.layer_bytes - 1, dtype=torch.uint8)},
            r"needs bytes \[0, 5248\) but kv_caches\['l0'\] holds 5247",
        ),
        (
            lambda c: {"l0": torch.zeros(c.layer_bytes, dtype=torch.uint8, device="meta")},
            r"is on meta, but this backend's caches live on cpu",
        ),
        (lambda c: {"l0": torch.zeros(2, c.layer_bytes, dtype=torch.uint8)[:, ::2]}, r"must be contiguous"),
        (lambda c: {"l0": bytearray(c.layer_bytes)}, r"must be a torch.Tensor, got bytearray"),
    ],
    ids=["missing", "too_small", "wrong_device", "non_contiguous", "not_a_tensor"],
)
def test_bad_caches_are_rejected_and_left_in_place(backend, make, message):
    config = _mla(layers=("l0",))
    kv_caches = make(config)
    before = dict(kv_caches)
    with pytest.raises(InvalidArgumentError, match=message):
        backend.prepare_kv_cache_views(config, kv_caches, {})
    assert kv_caches == before and len(backend.regions) == 0


def test_swaps_into_a_prepared_cache_are_accepted_and_outside_it_rejected(backend):
    config = _mla(layers=("l0",))
    storage = torch.zeros(2 * config.layer_bytes, dtype=torch.uint8)  # the layer uses the first half
    kv_caches = {"l0": storage}
    backend.prepare_kv_cache_views(config, kv_caches, {})
    pool = torch.arange(656, dtype=torch.int32).to(torch.uint8)
    backend.pin_tensor(pool)
    view = kv_caches["l0"]
    backend.swap_blocks_batch(
        torch.tensor([pool.data_ptr()]), torch.tensor([view[3, 1].data_ptr()]), torch.tensor([656])
    )
    assert torch.equal(view[3, 1], pool)
    outside = storage.data_ptr() + config.layer_bytes
    with pytest.raises(
        InvalidDescriptorError, match=r"descriptor 0: destination range .* is not inside any known region"
    ):
        backend.swap_blocks_batch(torch.tensor([pool.data_ptr()]), torch.tensor([outside]), torch.tensor([656]))
    assert storage[config.layer_bytes:].eq(0).all()
    backend.unpin_tensor(pool)


def test_preparing_again_replaces_the_cache_regions(backend):
    config = _mla(layers=("l0",))
    first, second = (
        torch.zeros(config.layer_bytes, dtype=torch.uint8),
        torch.zeros(config.layer_bytes, dtype=torch.uint8),
    )
    backend.prepare_kv_cache_views(config, {"l0": first}, {})
    backend.prepare_kv_cache_views(config, {"l0": second}, {})
    (region,) = backend.regions
    assert region.start == second.data_ptr() and region.kind == "device_cache"
