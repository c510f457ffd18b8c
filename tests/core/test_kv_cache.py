"""KV cache config validation and storage-sharing views (vendor-neutral part), and configs read by duck typing
as vLLM's base and CUDA backends read them (not at all): any object is accepted unless a field it carries is wrong."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from hisparse_hal.errors import InvalidArgumentError, UnsupportedCapabilityError
from hisparse_hal.kv_cache import KVCacheConfig, LayerSpec, validate_config
from hisparse_hal.kv_layout import KVCacheLayout, KVLayer, build_kv_views, describe_kv_cache
from hisparse_hal.vendors.cpu.backend import CpuBackend

ALL = frozenset({"bf16", "fp8_e4m3fn", "fp8_e4m3fnuz", "fp8_ds_mla"})
CPU = torch.device("cpu")
ONE_LAYER = (LayerSpec("l0"),)


def _config(fmt="bf16", row_width=64, layers=ONE_LAYER, num_blocks=4, block_size=8):
    return KVCacheConfig(fmt, num_blocks, block_size, row_width, tuple(layers))


def _describe(config: object) -> KVCacheLayout:
    return describe_kv_cache(config, kv_formats=ALL, shared_host_pool=False, where="cpu")


def build_views(config: object, kv_caches: dict[str, Any], device: torch.device) -> dict[str, torch.Tensor]:
    return build_kv_views(_describe(config), kv_caches, device)[0]


def test_ds_mla_row_must_be_656_bytes():
    validate_config(_config("fp8_ds_mla", 656), ALL, "cpu")
    with pytest.raises(InvalidArgumentError, match=r"'fp8_ds_mla' rows are 656 bytes .* got row_width 640 = 640 bytes"):
        validate_config(_config("fp8_ds_mla", 640), ALL, "cpu")


def test_format_the_device_cannot_hold_is_unsupported():
    with pytest.raises(
        UnsupportedCapabilityError, match=r"KV format 'fp8_e4m3fnuz' is not supported on cuda \(sm_90\)"
    ):
        validate_config(_config("fp8_e4m3fnuz"), frozenset({"bf16", "fp8_e4m3fn"}), "cuda (sm_90)")


def test_unknown_format_is_invalid():
    with pytest.raises(InvalidArgumentError, match=r"unknown KV format 'int4'"):
        validate_config(_config("int4"), ALL, "cpu")


@pytest.mark.parametrize("field", ["num_blocks", "block_size", "row_width"])
def test_non_positive_dimensions_are_rejected(field):
    kwargs = {"num_blocks": 4, "block_size": 8, "row_width": 64, field: 0}
    with pytest.raises(InvalidArgumentError, match=f"{field} must be a positive int, got 0"):
        validate_config(KVCacheConfig("bf16", layers=(LayerSpec("l0"),), **kwargs), ALL, "cpu")


def test_misaligned_layer_offset_is_rejected():
    with pytest.raises(
        InvalidArgumentError, match=r"layer 'l1' offset 100 must be >= 0 and a multiple of the 128-byte row"
    ):
        validate_config(_config(layers=(LayerSpec("l0"), LayerSpec("l1", 100))), ALL, "cpu")


def test_views_share_storage_and_layers_in_one_buffer_do_not_alias():
    config = _config(layers=(LayerSpec("l0", 0), LayerSpec("l1", 4 * 8 * 128)))
    buffer = torch.zeros(2 * config.layer_bytes, dtype=torch.uint8)
    views = build_views(config, {"l0": buffer, "l1": buffer}, CPU)
    assert views["l0"].shape == (4, 8, 64) and views["l0"].dtype == torch.bfloat16
    assert views["l0"].untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
    views["l1"].fill_(1.0)
    assert torch.all(views["l0"] == 0)
    assert views["l1"].data_ptr() - views["l0"].data_ptr() == config.layer_bytes


def test_overlapping_layers_in_one_buffer_are_rejected():
    config = _config(layers=(LayerSpec("l0", 0), LayerSpec("l1", 128)))
    buffer = torch.zeros(2 * config.layer_bytes, dtype=torch.uint8)
    with pytest.raises(InvalidArgumentError, match=r"layers 'l0' and 'l1' overlap by 3968 bytes"):
        build_views(config, {"l0": buffer, "l1": buffer}, CPU)


def test_layer_past_end_of_its_tensor_is_rejected():
    config = _config()
    with pytest.raises(
        InvalidArgumentError, match=r"layer 'l0' needs bytes \[0, 4096\) but kv_caches\['l0'\] holds 4000 bytes"
    ):
        build_views(config, {"l0": torch.zeros(4000, dtype=torch.uint8)}, CPU)


def test_missing_layer_is_rejected():
    with pytest.raises(InvalidArgumentError, match="layer 'l0' is not in kv_caches"):
        build_views(_config(), {}, CPU)


def _placement(**fields: Any) -> SimpleNamespace:
    return SimpleNamespace(**{"size": 1024, "layers": ["d0"], "layer_stride": 1024, "block_stride": 256, **fields})


@pytest.mark.parametrize(
    "config",
    [SimpleNamespace(), object(), {"format": "bf16"}, SimpleNamespace(num_blocks=4),
     SimpleNamespace(kv_cache_tensors=[], kv_cache_groups=[]), SimpleNamespace(kv_cache_tensors=None),
     SimpleNamespace(kv_cache_groups=[SimpleNamespace()]), SimpleNamespace(hisparse_shared_host_pool=False)],
    ids=["bare_namespace", "object", "dict", "num_blocks_only", "empty_lists", "none_tensors", "bare_group",
         "no_shared_pool"],
)
def test_any_config_vllms_backends_accept_is_accepted_and_prepares_nothing(config: object) -> None:
    backend = CpuBackend()
    slab = torch.arange(1024, dtype=torch.int32).view(torch.uint8)
    backend.prepare_kv_cache_views(_config(), {"l0": slab}, {})  # an earlier cache's region
    before = list(backend.regions)
    backend.validate_kv_cache_config(config)
    assert list(backend.regions) == before
    caches = {"x": slab}
    backend.prepare_kv_cache_views(config, caches, {})
    assert caches == {"x": slab} and len(backend.regions) == 0  # replaced by this config's (no) device slabs


@pytest.mark.parametrize(
    "config, message",
    [
        (SimpleNamespace(num_blocks=0), r"num_blocks must be a positive int, got 0"),
        (SimpleNamespace(num_blocks="4"), r"num_blocks must be a positive int, got '4'"),
        (SimpleNamespace(kv_cache_tensors="abc"), r"kv_cache_tensors must be a list, got str 'abc'"),
        (SimpleNamespace(kv_cache_groups=7), r"kv_cache_groups must be a list, got int 7"),
        (SimpleNamespace(kv_cache_tensors=[_placement(size=-1)]),
         r"kv_cache_tensors\[0\].size must be a positive int, got -1"),
        (SimpleNamespace(kv_cache_tensors=[_placement(layers="d0")]),
         r"kv_cache_tensors\[0\].layers must be a list of layer names, got 'd0'"),
        (SimpleNamespace(kv_cache_tensors=[_placement(offset=-8)]),
         r"kv_cache_tensors\[0\].offset must be an int >= 0, got -8"),
        (SimpleNamespace(hisparse_host_num_blocks=0), r"hisparse_host_num_blocks must be a positive int, got 0"),
        (SimpleNamespace(hisparse_shared_host_pool="yes"), r"hisparse_shared_host_pool must be a bool, got 'yes'"),
    ],
    ids=["zero_blocks", "str_blocks", "tensors_not_list", "groups_not_list", "bad_size", "layers_not_list",
         "negative_offset", "zero_host_blocks", "shared_pool_not_bool"],
)
def test_a_field_present_and_wrong_is_refused_by_name(config: object, message: str) -> None:
    backend = CpuBackend()
    with pytest.raises(InvalidArgumentError, match=message):
        backend.validate_kv_cache_config(config)
    with pytest.raises(InvalidArgumentError, match=message):
        backend.prepare_kv_cache_views(config, {}, {})
    assert len(backend.regions) == 0


def test_a_carried_device_layer_is_still_checked_against_kv_caches() -> None:
    config = SimpleNamespace(kv_cache_tensors=[_placement()])
    backend = CpuBackend()
    with pytest.raises(InvalidArgumentError, match=r"kv_caches\['d0'\] storage holds 512 bytes, but its placement"):
        backend.prepare_kv_cache_views(config, {"d0": torch.zeros(512, dtype=torch.uint8)}, {})
    assert len(backend.regions) == 0
    backend.prepare_kv_cache_views(config, {"d0": torch.zeros(1024, dtype=torch.uint8)}, {})
    assert len(backend.regions) == 1


def test_both_forms_are_described_once_in_one_form() -> None:
    ours = _describe(_config(layers=(LayerSpec("l0", 0), LayerSpec("l1", 4096))))
    assert ours == KVCacheLayout((KVLayer("l0", 0, 4096), KVLayer("l1", 4096, 4096)), torch.bfloat16, (4, 8, 64))
    placed = _describe(SimpleNamespace(
        kv_cache_tensors=[_placement(layers=["d0", "d1"]), _placement(layers=["h0"], host_resident=True, size=None)],
        hisparse_host_num_blocks=8,
    ))
    assert placed == KVCacheLayout((KVLayer("d0", 0, 1024, 0), KVLayer("d1", 0, 1024, 0)))


def test_one_builder_gives_a_region_per_viewed_layer_and_one_per_shared_storage() -> None:
    config = _config(layers=(LayerSpec("l0", 0), LayerSpec("l1", 4096)))
    buffer = torch.zeros(8192, dtype=torch.uint8)
    views, regions = build_kv_views(_describe(config), {"l0": buffer, "l1": buffer}, CPU)
    assert sorted(views) == ["l0", "l1"]
    assert [(r.start - buffer.data_ptr(), r.size, r.label) for r in regions] == [
        (0, 4096, "kv layer 'l0'"), (4096, 4096, "kv layer 'l1'")]
    placed = _describe(SimpleNamespace(kv_cache_tensors=[_placement(layers=["d0", "d1"])]))
    views, regions = build_kv_views(placed, {"d0": buffer[:1024], "d1": buffer[1024:]}, CPU)
    assert views == {}
    assert [(r.start, r.size, r.label) for r in regions] == [(buffer.data_ptr(), 8192, "KV slab of 'd0' +1 more")]


def test_a_device_placement_without_a_size_needs_no_bytes_and_its_storage_is_the_region() -> None:
    placed = _describe(SimpleNamespace(kv_cache_tensors=[_placement(size=None)]))
    assert placed == KVCacheLayout((KVLayer("d0", 0, 0, 0),))
    slab = torch.zeros(64, dtype=torch.uint8)
    _views, regions = build_kv_views(placed, {"d0": slab}, CPU)
    assert [(r.start, r.size) for r in regions] == [(slab.data_ptr(), 64)]
