"""KV caches described by tensor placements, as vLLM 0.34.0's ``KVCacheConfig`` does: validation and the
device slabs a backend must know as swap regions.

Read by attribute only, duck-typed as vLLM's base and CUDA backends read it (not at all): every field is optional,
and only a field that is present and wrong is refused. This package never imports vLLM. Invariant: nothing here
allocates, copies or keeps a tensor; a slab is one distinct device storage that holds at least one device-resident
layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .errors import InvalidArgumentError, UnsupportedCapabilityError

__all__ = ["DeviceSlab", "validate_placements", "device_slabs"]

_FP8 = {torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz}


@dataclasses.dataclass(frozen=True)
class DeviceSlab:
    """One device allocation backing device-resident KV layers (vLLM's resident and hot layers share one)."""

    start: int
    size: int
    layers: tuple[str, ...]

    @property
    def label(self) -> str:
        more = f" +{len(self.layers) - 1} more" if len(self.layers) > 1 else ""
        return f"KV slab of {self.layers[0]!r}{more}"


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


def validate_placements(
    config: Any, *, shared_host_pool: bool, supported_fp8: Iterable[torch.dtype], where: str
) -> None:
    """Check a placement config before anything is allocated or pinned (vLLM: ``binding.py:138-139``).

    Args:
        config: vLLM's ``KVCacheConfig``, or any object: only the fields it carries are read.
        shared_host_pool: whether the backend supports one host pool shared by the local TP ranks.
        supported_fp8: the fp8 dtypes the device can hold (other fp8 flavours would be misread).
        where: the backend, for messages.

    Raises:
        InvalidArgumentError: a non-positive ``num_blocks``, ``hisparse_host_num_blocks`` or
            ``hisparse_host_block_stride``; ``kv_cache_tensors`` or ``kv_cache_groups`` not a list; a placement
            with a bad size, stride, offset or layer list; host-resident placements of different sizes (vLLM
            allocates one host backing, ``binding.py:103``) or without ``hisparse_host_num_blocks``.
        UnsupportedCapabilityError: a shared host pool on a backend without one, or an fp8 flavour the
            device cannot hold.
    """
    if getattr(config, "num_blocks", None) is not None:
        _positive_int(config.num_blocks, "num_blocks")
    host_sizes: set[int] = set()
    for index, placement in enumerate(_sequence(config, "kv_cache_tensors")):
        _placement_layers(placement, index)
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
        if getattr(placement, "host_resident", False) and size is not None:
            host_sizes.add(size)
    if len(host_sizes) > 1:
        raise InvalidArgumentError(
            f"KV cache config: host-resident tensors have sizes {sorted(host_sizes)}; HiSparse allocates one "
            "host backing for all of them (vllm/v1/hisparse/binding.py:103)"
        )
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
    fp8_ok = set(supported_fp8)
    for group in _sequence(config, "kv_cache_groups"):
        dtype = getattr(getattr(group, "kv_cache_spec", None), "dtype", None)
        if dtype in _FP8 and dtype not in fp8_ok:
            raise UnsupportedCapabilityError(
                f"KV cache group {list(getattr(group, 'layer_names', ()))[:3]} holds {dtype}, which {where} "
                "cannot hold "
                f"(fp8 it holds: {sorted(str(d) for d in fp8_ok)}); reading one fp8 flavour as another "
                "corrupts values"
            )


def device_slabs(config: Any, kv_caches: Mapping[str, object], device: torch.device) -> tuple[DeviceSlab, ...]:
    """The distinct device storages behind the config's device-resident layers.

    vLLM maps resident and hot layer names to one shared raw byte backing (``v1/worker/utils.py:584-589``);
    other device layers map to typed views of their backing. Layers of host-resident placements are the
    pinned host pool, which ``pin_tensor`` registered already, and are skipped.

    Raises:
        InvalidArgumentError: a device-resident layer missing from ``kv_caches``, not a tensor, on another
            device, or whose storage is smaller than its placement's ``size``.
    """
    slabs: dict[int, tuple[int, list[str]]] = {}
    for index, placement in enumerate(_sequence(config, "kv_cache_tensors")):
        if getattr(placement, "host_resident", False):
            continue
        for name in _placement_layers(placement, index):
            tensor = kv_caches.get(name)
            if not isinstance(tensor, torch.Tensor):
                raise InvalidArgumentError(
                    f"kv_caches[{name!r}] must be a torch.Tensor (a device-resident layer of the KV cache "
                    f"config), got {type(tensor).__name__}"
                )
            if tensor.device != device:
                raise InvalidArgumentError(
                    f"kv_caches[{name!r}] is on {tensor.device}, but this backend's caches live on {device}"
                )
            storage = tensor.untyped_storage()
            if storage.nbytes() < getattr(placement, "size", 0):
                raise InvalidArgumentError(
                    f"kv_caches[{name!r}] storage holds {storage.nbytes()} bytes, but its placement "
                    f"(kv_cache_tensors[{index}]) needs {getattr(placement, 'size', 0)}"
                )
            start = storage.data_ptr()
            _size, names = slabs.setdefault(start, (storage.nbytes(), []))
            names.append(name)
    return tuple(DeviceSlab(start, size, tuple(names)) for start, (size, names) in sorted(slabs.items()))
