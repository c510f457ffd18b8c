"""KV cache config and views: formats accepted exactly as the device's architecture allows, 656-byte
``fp8_ds_mla`` rows, typed views that share the caller's storage, per-layer offsets that never alias,
and a failed preparation that changes nothing. Under vLLM's contract the hooks get vLLM's ``KVCacheConfig`` (the
suite's view translates) and only what vLLM's default no-op hooks also do is required (backend.py:36-49)."""

from __future__ import annotations

import pytest
import torch

from hisparse_hal.capabilities import KV_FORMATS
from hisparse_hal.conformance.arenas import park_cache_regions, pinned_host_pool, random_bytes, synchronize
from hisparse_hal.errors import InvalidArgumentError, InvalidDescriptorError, UnsupportedCapabilityError
from hisparse_hal.kv_cache import KV_FORMAT_SPECS, KVCacheConfig, LayerSpec

#: This tier (read by conformance/tiers.py, without importing this module): its area, its place in the
#: run and its title in the reports.
AREA = "config"
ORDER = 60
TITLE = "KV config and views"

DS_MLA_ROW = 656


def _width(fmt: str) -> int:
    spec = KV_FORMAT_SPECS[fmt]
    return DS_MLA_ROW if spec.fixed_row_bytes else 64


def _config(
    fmt: str, layers: tuple[LayerSpec, ...], num_blocks: int = 6, block_size: int = 4, width: int | None = None
) -> KVCacheConfig:
    return KVCacheConfig(fmt, num_blocks, block_size, _width(fmt) if width is None else width, layers)


def _allocation(nbytes: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    return random_bytes(nbytes, seed).to(device)


@pytest.fixture
def parked(backend):
    """Cache regions made by the test are replaced by the suite's parking cache afterwards."""
    yield
    park_cache_regions(backend)


def _supported_format(capabilities) -> str:
    for fmt in ("bf16", "fp8_e4m3fn", "fp8_e4m3fnuz", "fp8_ds_mla"):
        if fmt in capabilities.kv_formats:
            return fmt
    pytest.skip("capability kv_formats is empty: the backend holds no KV cache format")


def _accepts_swaps_at(backend, address: int, size: int = 16) -> bool:
    """Whether a swap from ``[address, address + size)`` into a pinned pool is accepted (and done)."""
    with pinned_host_pool(backend, 4096, label="probe pool") as pool:
        try:
            backend.swap_blocks_batch(torch.tensor([address]), torch.tensor([pool.address]), torch.tensor([size]))
        except InvalidDescriptorError:
            return False
        synchronize(backend.device)
        return True


# ------------------------------------------------------------------------------------------ formats
@pytest.mark.hal_extension  # hisparse-hal's typed views and regions; vLLM's binder makes views (binding.py:103-124)
@pytest.mark.parametrize("fmt", sorted(KV_FORMATS))
def test_kv_format_is_accepted_exactly_when_declared(backend, capabilities, parked, fmt):
    layers = (LayerSpec("layer.0", 0),)
    config = _config(fmt, layers)
    allocation = _allocation(config.layer_bytes, backend.device)
    kv_caches = {"layer.0": allocation}
    if fmt in capabilities.kv_formats:
        backend.validate_kv_cache_config(config)
        backend.prepare_kv_cache_views(config, kv_caches, {})
        view = kv_caches["layer.0"]
        assert view.dtype == KV_FORMAT_SPECS[fmt].dtype
        assert tuple(view.shape) == (config.num_blocks, config.block_size, config.row_width)
    else:
        with pytest.raises(UnsupportedCapabilityError, match=rf"{fmt}.*not supported"):
            backend.validate_kv_cache_config(config)
        with pytest.raises(UnsupportedCapabilityError, match=rf"{fmt}.*not supported"):
            backend.prepare_kv_cache_views(config, kv_caches, {})
        assert kv_caches["layer.0"] is allocation, "a rejected config must leave kv_caches untouched"


@pytest.mark.hal_extension  # a refusal vLLM's default validate/prepare do not make (backend.py:36-49)
def test_an_unknown_kv_format_is_rejected(backend):
    config = KVCacheConfig("fp4_e2m1", 4, 4, 64, (LayerSpec("layer.0"),))
    with pytest.raises(InvalidArgumentError, match=r"unknown KV format 'fp4_e2m1'"):
        backend.validate_kv_cache_config(config)


def test_fp8_flavours_are_not_both_declared_without_reason(capabilities):
    """gfx942 holds fnuz fp8, NVIDIA and gfx950 hold OCP fp8 (vendor-facts.md #16); a GPU declaring both
    would let one be reinterpreted as the other. The CPU device moves bytes only, so it may hold both."""
    both = {"fp8_e4m3fn", "fp8_e4m3fnuz"} <= capabilities.kv_formats
    if both and capabilities.versions.get("arch"):
        pytest.fail(f"architecture {capabilities.versions['arch']!r} declares both fp8_e4m3fn and fp8_e4m3fnuz")


@pytest.mark.hal_extension  # a refusal vLLM's default validate/prepare do not make (backend.py:36-49)
def test_fp8_ds_mla_rows_are_656_bytes(backend, capabilities):
    if "fp8_ds_mla" not in capabilities.kv_formats:
        pytest.skip("capability kv_formats lacks fp8_ds_mla")
    layers = (LayerSpec("layer.0"),)
    backend.validate_kv_cache_config(_config("fp8_ds_mla", layers, width=DS_MLA_ROW))
    for width in (655, 657, 328, 512):
        with pytest.raises(InvalidArgumentError, match=rf"656 bytes.*row_width {width}"):
            backend.validate_kv_cache_config(_config("fp8_ds_mla", layers, width=width))


@pytest.mark.hal_extension  # a refusal vLLM's default validate/prepare do not make (backend.py:36-49)
@pytest.mark.parametrize(
    "field,value", [("num_blocks", 0), ("block_size", -1), ("row_width", 0)],
)
def test_a_non_positive_dimension_is_rejected(backend, capabilities, field, value):
    fmt = _supported_format(capabilities)
    kwargs = {"num_blocks": 4, "block_size": 4, "width": _width(fmt)}
    kwargs["width" if field == "row_width" else field] = value
    if fmt == "fp8_ds_mla" and field == "row_width":
        pytest.skip("fp8_ds_mla rows have a fixed width")
    with pytest.raises(InvalidArgumentError, match=rf"{field} must be a positive int, got {value}"):
        backend.validate_kv_cache_config(_config(fmt, (LayerSpec("layer.0"),), **kwargs))


# ------------------------------------------------------------------------------------------ views
@pytest.mark.hal_extension  # hisparse-hal's typed views and regions; vLLM's binder makes views (binding.py:103-124)
def test_views_share_storage_with_the_caches(backend, capabilities, parked):
    for fmt in sorted(capabilities.kv_formats):
        layers = (LayerSpec("layer.a", 0), LayerSpec("layer.b", 0))
        config = _config(fmt, layers)
        a = _allocation(config.layer_bytes, backend.device, 1)
        b = _allocation(config.layer_bytes, backend.device, 2)
        kv_caches = {"layer.a": a, "layer.b": b}
        backend.prepare_kv_cache_views(config, kv_caches, {})
        for name, original in (("layer.a", a), ("layer.b", b)):
            view = kv_caches[name]
            assert view.untyped_storage().data_ptr() == original.untyped_storage().data_ptr(), (
                f"{fmt} view of {name} copied its storage"
            )
            assert view.data_ptr() == original.data_ptr()
            stamp = random_bytes(config.row_bytes, 3).to(backend.device)
            view.view(torch.uint8).reshape(-1)[: config.row_bytes].copy_(stamp)
            synchronize(backend.device)
            assert torch.equal(original[: config.row_bytes].to("cpu"), stamp.to("cpu")), (
                f"a write through the {fmt} view of {name} is not seen by the cache"
            )


@pytest.mark.hal_extension  # hisparse-hal's typed views and regions; vLLM's binder makes views (binding.py:103-124)
def test_per_layer_offsets_never_alias(backend, capabilities, parked):
    fmt = _supported_format(capabilities)
    config0 = _config(fmt, (LayerSpec("x"),))
    gap = config0.row_bytes * 3
    layers = tuple(LayerSpec(f"layer.{i}", i * (config0.layer_bytes + gap)) for i in range(4))
    config = _config(fmt, layers)
    allocation = torch.zeros(4 * (config.layer_bytes + gap), dtype=torch.uint8, device=backend.device)
    kv_caches = {layer.name: allocation for layer in layers}
    backend.prepare_kv_cache_views(config, kv_caches, {})
    for i, layer in enumerate(layers):
        kv_caches[layer.name].view(torch.uint8).fill_(i + 1)
    synchronize(backend.device)
    image = allocation.to("cpu")
    for i, layer in enumerate(layers):
        own = image[layer.offset_bytes : layer.offset_bytes + config.layer_bytes]
        assert bool((own == i + 1).all()), f"{layer.name} bytes were overwritten by another layer"
        tail = image[layer.offset_bytes + config.layer_bytes : layer.offset_bytes + config.layer_bytes + gap]
        assert bool((tail == 0).all()), f"the gap after {layer.name} was written: its view runs past layer_bytes"


@pytest.mark.hal_extension  # hisparse-hal's typed views and regions; vLLM's binder makes views (binding.py:103-124)
def test_views_become_swap_regions_and_replace_earlier_ones(backend, capabilities, parked):
    fmt = _supported_format(capabilities)
    config = _config(fmt, (LayerSpec("layer.0"),))
    first = _allocation(config.layer_bytes, backend.device, 4)
    backend.prepare_kv_cache_views(config, {"layer.0": first}, {})
    assert _accepts_swaps_at(backend, first.data_ptr()), "a prepared layer must be a swap region"
    assert _accepts_swaps_at(backend, first.data_ptr() + config.layer_bytes - 16)
    assert not _accepts_swaps_at(backend, first.data_ptr() + config.layer_bytes - 8), (
        "a swap may not run past the layer"
    )
    second = _allocation(config.layer_bytes, backend.device, 5)
    backend.prepare_kv_cache_views(config, {"layer.0": second}, {})
    assert _accepts_swaps_at(backend, second.data_ptr())
    assert not _accepts_swaps_at(backend, first.data_ptr()), "the regions of an earlier preparation must be replaced"


def test_prepare_leaves_forward_context_untouched(backend, capabilities, parked):
    fmt = _supported_format(capabilities)
    config = _config(fmt, (LayerSpec("layer.0"),))
    sentinel = object()
    forward_context = {"layer.0": sentinel, "step": 7}
    backend.prepare_kv_cache_views(
        config, {"layer.0": _allocation(config.layer_bytes, backend.device)}, forward_context
    )
    assert forward_context == {"layer.0": sentinel, "step": 7}


# ------------------------------------------------------------------------------------------ bad configs
def _bad_layouts(config0: KVCacheConfig):
    row, size = config0.row_bytes, config0.layer_bytes
    return {
        "overlapping_offsets": ((LayerSpec("a", 0), LayerSpec("b", size - row)), 2 * size, r"'a' and 'b' overlap by"),
        "misaligned_offset": ((LayerSpec("a", 0), LayerSpec("b", size + 1)), 3 * size, r"offset .*multiple of"),
        "negative_offset": ((LayerSpec("a", -row),), 2 * size, r"offset -\d+ must be >= 0"),
        "past_the_end": ((LayerSpec("a", 0), LayerSpec("b", size)), 2 * size - row, r"'b' needs bytes .* holds"),
        "duplicate_names": ((LayerSpec("a", 0), LayerSpec("a", size)), 2 * size, r"'a' appears twice"),
    }


@pytest.mark.hal_extension  # a refusal vLLM's default validate/prepare do not make (backend.py:36-49)
@pytest.mark.parametrize(
    "layout", ["overlapping_offsets", "misaligned_offset", "negative_offset", "past_the_end", "duplicate_names"]
)
def test_a_bad_layer_layout_is_rejected_and_changes_nothing(backend, capabilities, parked, layout):
    fmt = _supported_format(capabilities)
    config0 = _config(fmt, (LayerSpec("x"),))
    layers, nbytes, match = _bad_layouts(config0)[layout]
    good = _allocation(config0.layer_bytes, backend.device, 6)
    backend.prepare_kv_cache_views(config0, {"x": good}, {})
    allocation = _allocation(nbytes, backend.device, 7)
    kv_caches = {layer.name: allocation for layer in layers}
    snapshot = dict(kv_caches)
    with pytest.raises(InvalidArgumentError, match=match):
        backend.prepare_kv_cache_views(_config(fmt, layers), kv_caches, {})
    assert kv_caches == snapshot and all(kv_caches[k] is snapshot[k] for k in kv_caches), "kv_caches changed"
    assert _accepts_swaps_at(backend, good.data_ptr()), "a failed preparation dropped the earlier regions"
    assert not _accepts_swaps_at(backend, allocation.data_ptr()), "a failed preparation left a region behind"


@pytest.mark.hal_extension  # a refusal vLLM's default validate/prepare do not make (backend.py:36-49)
def test_a_missing_layer_is_rejected(backend, capabilities, parked):
    fmt = _supported_format(capabilities)
    config = _config(fmt, (LayerSpec("layer.0"), LayerSpec("layer.1")))
    with pytest.raises(InvalidArgumentError, match=r"'layer.1' is not in kv_caches"):
        backend.prepare_kv_cache_views(config, {"layer.0": _allocation(config.layer_bytes, backend.device)}, {})


@pytest.mark.hal_extension  # a refusal vLLM's default validate/prepare do not make (backend.py:36-49)
def test_a_cache_on_another_device_is_rejected(backend, capabilities, parked):
    fmt = _supported_format(capabilities)
    config = _config(fmt, (LayerSpec("layer.0"),))
    elsewhere = torch.empty(config.layer_bytes, dtype=torch.uint8, device="meta")
    with pytest.raises(InvalidArgumentError, match=r"is on meta"):
        backend.prepare_kv_cache_views(config, {"layer.0": elsewhere}, {})


@pytest.mark.hal_extension  # a refusal vLLM's default validate/prepare do not make (backend.py:36-49)
def test_a_non_contiguous_cache_is_rejected(backend, capabilities, parked):
    fmt = _supported_format(capabilities)
    config = _config(fmt, (LayerSpec("layer.0"),))
    strided = _allocation(config.layer_bytes * 2, backend.device)[::2]
    with pytest.raises(InvalidArgumentError, match=r"contiguous"):
        backend.prepare_kv_cache_views(config, {"layer.0": strided}, {})
