"""One description of a KV cache, whichever form its config came in, and the one way it becomes views and regions.

:func:`describe_kv_cache` is the entry: it reads this package's :class:`~hisparse_hal.kv_cache.KVCacheConfig`, or a
config described by tensor placements (vLLM 0.34.0's ``KVCacheConfig``, read by attribute; this package never imports
vLLM), checks it, and returns a :class:`KVCacheLayout`; :func:`build_kv_views` turns that into typed views and device
regions. Invariant: nothing here allocates, copies or keeps a tensor, and no two regions built share a byte.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .errors import InvalidArgumentError, UnsupportedCapabilityError
from .kv_cache import KV_FORMAT_SPECS, KVCacheConfig, validate_config
from .regions import Region

__all__ = ["KVLayer", "KVCacheLayout", "describe_kv_cache", "build_kv_views"]

_FP8 = {torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz}


@dataclasses.dataclass(frozen=True)
class KVLayer:
    """One device-resident layer: the ``kv_caches`` key, where its bytes start in that tensor, and how many it needs.

    ``placement`` is its index in vLLM's ``kv_cache_tensors`` (None for a layer of this package's config).
    """

    name: str
    offset_bytes: int
    nbytes: int
    placement: int | None = None


@dataclasses.dataclass(frozen=True)
class KVCacheLayout:
    """A checked KV cache: its device-resident layers, and the shape of the typed view each gets.

    With ``view_shape`` (this package's config), each layer becomes a ``view_dtype`` view of that shape and its own
    region. Without (a placement config), ``kv_caches`` stays as the engine built it and each distinct storage behind
    the layers becomes one region; host-resident layers are the pinned host pool and are not listed.
    """

    layers: tuple[KVLayer, ...]
    view_dtype: torch.dtype | None = None
    view_shape: tuple[int, int, int] | None = None


def describe_kv_cache(
    config: object, *, kv_formats: frozenset[str], shared_host_pool: bool, where: str
) -> KVCacheLayout:
    """Check a KV cache config before anything is allocated or pinned, and describe it in one form.

    Args:
        config: a :class:`~hisparse_hal.kv_cache.KVCacheConfig`, or any other object read as a placement config
            (vLLM 0.34.0's ``KVCacheConfig``, checked at ``vllm/v1/hisparse/binding.py:138-139``): only the fields it
            carries are read, and only a field that is present and wrong is refused.
        kv_formats: formats the device can hold (``Capabilities.kv_formats``); its fp8 ones bound a placement
            config's group dtypes.
        shared_host_pool: whether the backend supports one host pool shared by the local TP ranks.
        where: the backend, for messages.

    Raises:
        InvalidArgumentError: a malformed config (see :func:`hisparse_hal.kv_cache.validate_config`); for a
            placement config a non-positive ``num_blocks``, ``hisparse_host_num_blocks`` or
            ``hisparse_host_block_stride``, ``kv_cache_tensors`` or ``kv_cache_groups`` not a list, a placement with
            a bad size, stride, offset or layer list, host-resident placements of different sizes (vLLM allocates
            one host backing, ``binding.py:103``) or without ``hisparse_host_num_blocks``.
        UnsupportedCapabilityError: a format this device cannot hold, or a shared host pool it cannot provide.
    """
    if isinstance(config, KVCacheConfig):
        validate_config(config, kv_formats, where)
        layers = tuple(KVLayer(layer.name, layer.offset_bytes, config.layer_bytes) for layer in config.layers)
        return KVCacheLayout(layers, config.kv_format.dtype, (config.num_blocks, config.block_size, config.row_width))
    fp8 = {KV_FORMAT_SPECS[name].dtype for name in kv_formats if name.startswith("fp8_e")}
    return KVCacheLayout(_read_placements(config, shared_host_pool=shared_host_pool, supported_fp8=fp8, where=where))


def _positive_int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InvalidArgumentError(f"KV cache config: {what} must be a positive int, got {value!r}")
    return value


def _sequence(config: Any, field: str) -> list[Any]:
    """``config.<field>`` as a list ([] where absent or None)."""
    value = getattr(config, field, None)
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise InvalidArgumentError(f"KV cache config: {field} must be a list, got {type(value).__name__} {value!r}")
    return list(value)


def _placement_layers(placement: Any, index: int) -> tuple[str, ...]:
    layers = getattr(placement, "layers", ())
    if not isinstance(layers, (list, tuple)) or not all(isinstance(n, str) for n in layers):
        raise InvalidArgumentError(
            f"KV cache config: kv_cache_tensors[{index}].layers must be a list of layer names, got {layers!r}"
        )
    return tuple(layers)


def _read_placement(placement: Any, index: int) -> tuple[tuple[str, ...], int | None]:
    """One ``kv_cache_tensors`` entry, checked: its layer names and its ``size`` (None where absent)."""
    names = _placement_layers(placement, index)
    size = getattr(placement, "size", None)
    if size is not None:
        _positive_int(size, f"kv_cache_tensors[{index}].size")
    if getattr(placement, "block_stride", None) is not None:
        _positive_int(placement.block_stride, f"kv_cache_tensors[{index}].block_stride")
    for field in ("layer_stride", "offset"):
        value = getattr(placement, field, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidArgumentError(
                f"KV cache config: kv_cache_tensors[{index}].{field} must be an int >= 0, got {value!r}"
            )
    return names, size


def _read_placements(
    config: Any, *, shared_host_pool: bool, supported_fp8: Iterable[torch.dtype], where: str
) -> tuple[KVLayer, ...]:
    """A placement config's device-resident layers, its fields checked in the order vLLM's binder meets them."""
    if getattr(config, "num_blocks", None) is not None:
        _positive_int(config.num_blocks, "num_blocks")
    host_sizes: set[int] = set()
    layers: list[KVLayer] = []
    for index, placement in enumerate(_sequence(config, "kv_cache_tensors")):
        names, size = _read_placement(placement, index)
        if not getattr(placement, "host_resident", False):
            layers.extend(KVLayer(name, 0, 0 if size is None else size, index) for name in names)
        elif size is not None:
            host_sizes.add(size)
    if len(host_sizes) > 1:
        raise InvalidArgumentError(
            f"KV cache config: host-resident tensors have sizes {sorted(host_sizes)}; HiSparse allocates one "
            "host backing for all of them (vllm/v1/hisparse/binding.py:103)"
        )
    _check_host_pool(config, host_sizes, shared_host_pool, where)
    _check_group_dtypes(config, set(supported_fp8), where)
    return tuple(layers)


def _check_host_pool(config: Any, host_sizes: set[int], shared_host_pool: bool, where: str) -> None:
    host_blocks = getattr(config, "hisparse_host_num_blocks", None)
    if host_sizes or host_blocks is not None:
        _positive_int(host_blocks, "hisparse_host_num_blocks")
    stride = getattr(config, "hisparse_host_block_stride", None)
    if stride is not None:
        _positive_int(stride, "hisparse_host_block_stride")
    shared = getattr(config, "hisparse_shared_host_pool", False)
    if not isinstance(shared, bool):
        raise InvalidArgumentError(f"KV cache config: hisparse_shared_host_pool must be a bool, got {shared!r}")
    if shared and not shared_host_pool:
        raise UnsupportedCapabilityError(
            f"KV cache config asks for a shared HiSparse host pool, but {where} does not support one "
            "(supports_shared_host_pool is False); vLLM plans the pool from that attribute "
            "(vllm/v1/hisparse/runtime.py:295), so the config and the backend disagree"
        )


def _check_group_dtypes(config: Any, fp8_ok: set[torch.dtype], where: str) -> None:
    for group in _sequence(config, "kv_cache_groups"):
        dtype = getattr(getattr(group, "kv_cache_spec", None), "dtype", None)
        if dtype in _FP8 and dtype not in fp8_ok:
            raise UnsupportedCapabilityError(
                f"KV cache group {list(getattr(group, 'layer_names', ()))[:3]} holds {dtype}, which {where} "
                "cannot hold "
                f"(fp8 it holds: {sorted(str(d) for d in fp8_ok)}); reading one fp8 flavour as another "
                "corrupts values"
            )


def build_kv_views(
    layout: KVCacheLayout, kv_caches: Mapping[str, object], device: torch.device
) -> tuple[dict[str, torch.Tensor], list[Region]]:
    """The typed views and the device regions a described cache gives, sharing the caller's storage.

    Args:
        layout: from :func:`describe_kv_cache`.
        kv_caches: layer name to the tensor holding that layer, on ``device``.
        device: the backend's device.

    Returns:
        Layer name to ``[num_blocks, block_size, row_width]`` view (empty without ``view_shape``), and the regions:
        one per layer with a view; otherwise one per distinct storage (vLLM maps resident and hot layer names to one
        shared raw byte backing, ``v1/worker/utils.py:584-589``). Nothing is modified; the caller installs both.

    Raises:
        InvalidArgumentError: a layer missing from ``kv_caches``, not a tensor, on another device; a viewed layer
            not contiguous, running past its tensor's end or overlapping another; a storage smaller than its
            placement's ``size``.
    """
    if layout.view_dtype is None or layout.view_shape is None:
        return {}, _slab_regions(layout, kv_caches, device)
    views = {
        layer.name: _layer_view(layer, kv_caches, device, layout.view_dtype, layout.view_shape)
        for layer in layout.layers
    }
    regions = [
        Region(views[layer.name].data_ptr(), layer.nbytes, "device_cache", f"kv layer {layer.name!r}", device)
        for layer in layout.layers
    ]
    _refuse_overlap(regions, layout)
    return views, regions


def _device_tensor(kv_caches: Mapping[str, object], layer: KVLayer, device: torch.device, what: str) -> torch.Tensor:
    tensor = kv_caches.get(layer.name)
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(
            f"kv_caches[{layer.name!r}] must be a torch.Tensor{what}, got {type(tensor).__name__}"
        )
    if tensor.device != device:
        raise InvalidArgumentError(
            f"kv_caches[{layer.name!r}] is on {tensor.device}, but this backend's caches live on {device}"
        )
    return tensor


def _layer_view(
    layer: KVLayer, kv_caches: Mapping[str, object], device: torch.device, dtype: torch.dtype,
    shape: tuple[int, int, int],
) -> torch.Tensor:
    """``layer``'s bytes of its tensor as a ``dtype`` view of ``shape``."""
    if layer.name not in kv_caches:
        raise InvalidArgumentError(
            f"KV cache layer {layer.name!r} is not in kv_caches (keys: {sorted(kv_caches)[:8]})"
        )
    tensor = _device_tensor(kv_caches, layer, device, "")
    if not tensor.is_contiguous():
        raise InvalidArgumentError(f"kv_caches[{layer.name!r}] must be contiguous, got strides {tensor.stride()}")
    nbytes = tensor.numel() * tensor.element_size()
    end = layer.offset_bytes + layer.nbytes
    if end > nbytes:
        raise InvalidArgumentError(
            f"layer {layer.name!r} needs bytes [{layer.offset_bytes}, {end}) but "
            f"kv_caches[{layer.name!r}] holds {nbytes} bytes"
        )
    flat = tensor.reshape(-1).view(torch.uint8)
    return flat[layer.offset_bytes:end].view(dtype).view(*shape)


def _refuse_overlap(regions: list[Region], layout: KVCacheLayout) -> None:
    spans = sorted((r.start, r.end, layer.name) for r, layer in zip(regions, layout.layers, strict=True))
    for (_s0, e0, n0), (s1, _e1, n1) in itertools.pairwise(spans):
        if s1 < e0:
            raise InvalidArgumentError(
                f"KV cache layers {n0!r} and {n1!r} overlap by {e0 - s1} bytes; per-layer offsets "
                "must give each layer its own bytes"
            )


def _slab_regions(layout: KVCacheLayout, kv_caches: Mapping[str, object], device: torch.device) -> list[Region]:
    """One region per distinct storage behind the layers, labelled by the first layer it holds."""
    slabs: dict[int, tuple[int, list[str]]] = {}
    for layer in layout.layers:
        tensor = _device_tensor(kv_caches, layer, device, " (a device-resident layer of the KV cache config)")
        storage = tensor.untyped_storage()
        if storage.nbytes() < layer.nbytes:
            raise InvalidArgumentError(
                f"kv_caches[{layer.name!r}] storage holds {storage.nbytes()} bytes, but its placement "
                f"(kv_cache_tensors[{layer.placement}]) needs {layer.nbytes}"
            )
        _size, names = slabs.setdefault(storage.data_ptr(), (storage.nbytes(), []))
        names.append(layer.name)
    return [
        Region(start, size, "device_cache", _slab_label(names), device)
        for start, (size, names) in sorted(slabs.items())
    ]


def _slab_label(names: list[str]) -> str:
    more = f" +{len(names) - 1} more" if len(names) > 1 else ""
    return f"KV slab of {names[0]!r}{more}"
