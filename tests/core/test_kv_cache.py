"""KV cache config validation and storage-sharing views (vendor-neutral part)."""

from __future__ import annotations

import pytest
import torch

from hisparse_hal.errors import InvalidArgumentError, UnsupportedCapabilityError
from hisparse_hal.kv_cache import KVCacheConfig, LayerSpec, build_views, validate_config

ALL = frozenset({"bf16", "fp8_e4m3fn", "fp8_e4m3fnuz", "fp8_ds_mla"})
CPU = torch.device("cpu")
ONE_LAYER = (LayerSpec("l0"),)


def _config(fmt="bf16", row_width=64, layers=ONE_LAYER, num_blocks=4, block_size=8):
    return KVCacheConfig(fmt, num_blocks, block_size, row_width, tuple(layers))


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
