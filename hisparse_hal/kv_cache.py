"""This package's vendor-neutral form of a paged KV cache config, its formats and its validation.

A backend reads it through :func:`hisparse_hal.kv_layout.describe_kv_cache`, which also reads vLLM's placement
form; :func:`hisparse_hal.kv_layout.build_kv_views` makes the views. Invariant: nothing here touches a tensor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from .errors import InvalidArgumentError, UnsupportedCapabilityError

__all__ = ["KVFormat", "KV_FORMAT_SPECS", "LayerSpec", "KVCacheConfig", "validate_config"]

#: Bytes of one ``fp8_ds_mla`` row: 512 B e4m3 NoPE + 16 B fp32 scales + 128 B bf16 RoPE (vLLM runtime.py).
FP8_DS_MLA_ROW_BYTES = 512 + 16 + 128


@dataclasses.dataclass(frozen=True)
class KVFormat:
    """A KV payload format: the dtype views are typed as, and a fixed row size in bytes if any."""

    name: str
    dtype: torch.dtype
    fixed_row_bytes: int | None = None
    description: str = ""


KV_FORMAT_SPECS: Mapping[str, KVFormat] = {
    "bf16": KVFormat("bf16", torch.bfloat16, None, "bfloat16 rows"),
    "fp8_e4m3fn": KVFormat(
        "fp8_e4m3fn", torch.float8_e4m3fn, None, "OCP fp8 e4m3 (max 448): NVIDIA, AMD gfx950"
    ),
    "fp8_e4m3fnuz": KVFormat(
        "fp8_e4m3fnuz", torch.float8_e4m3fnuz, None, "fnuz fp8 e4m3 (max 224): AMD gfx942"
    ),
    "fp8_ds_mla": KVFormat(
        "fp8_ds_mla",
        torch.uint8,
        FP8_DS_MLA_ROW_BYTES,
        "656-byte MLA rows: 512 B e4m3 NoPE + 16 B fp32 scales + 128 B bf16 RoPE",
    ),
}


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """One attention layer's cache: the ``kv_caches`` key and its byte offset into that tensor."""

    name: str
    offset_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class KVCacheConfig:
    """A paged KV cache: ``num_blocks`` blocks of ``block_size`` rows of ``row_width`` elements.

    Several layers may share one allocation (the same ``kv_caches`` tensor) at different
    ``offset_bytes``; each layer occupies ``layer_bytes`` from its offset.
    """

    format: str
    num_blocks: int
    block_size: int
    row_width: int
    layers: tuple[LayerSpec, ...]

    @property
    def kv_format(self) -> KVFormat:
        """The :class:`KVFormat` named by ``format``."""
        return KV_FORMAT_SPECS[self.format]

    @property
    def row_bytes(self) -> int:
        """Bytes per row."""
        return self.row_width * torch.empty((), dtype=self.kv_format.dtype).element_size()

    @property
    def block_bytes(self) -> int:
        """Bytes per block."""
        return self.block_size * self.row_bytes

    @property
    def layer_bytes(self) -> int:
        """Bytes per layer."""
        return self.num_blocks * self.block_bytes


def validate_config(config: object, supported_formats: frozenset[str], where: str) -> KVCacheConfig:
    """Check a KV cache description before anything is allocated or pinned.

    Args:
        config: the :class:`KVCacheConfig` to check.
        supported_formats: formats the device can hold (``Capabilities.kv_formats``).
        where: the backend and architecture, for messages (``"cuda sm_90"``).

    Returns:
        ``config``, typed.

    Raises:
        InvalidArgumentError: a non-positive dimension, an unknown format, a wrong ``fp8_ds_mla`` row
            size, duplicate layer names, or negative or misaligned layer offsets. Overlap between
            layers depends on which layers share an allocation;
            :func:`hisparse_hal.kv_layout.build_kv_views` checks it.
        UnsupportedCapabilityError: a known format this device cannot hold.
    """
    if not isinstance(config, KVCacheConfig):
        raise InvalidArgumentError(
            f"expected a hisparse_hal.kv_cache.KVCacheConfig, or a config with tensor placements (vLLM 0.34.0's "
            f"KVCacheConfig: num_blocks, kv_cache_tensors, kv_cache_groups), got {type(config).__name__}"
        )
    if config.format not in KV_FORMAT_SPECS:
        raise InvalidArgumentError(
            f"unknown KV format {config.format!r}; known formats are {sorted(KV_FORMAT_SPECS)}"
        )
    if config.format not in supported_formats:
        raise UnsupportedCapabilityError(
            f"KV format {config.format!r} is not supported on {where}; supported: "
            f"{sorted(supported_formats)}. Reinterpreting one fp8 flavour as another corrupts values"
        )
    for field in ("num_blocks", "block_size", "row_width"):
        value = getattr(config, field)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InvalidArgumentError(f"KV cache {field} must be a positive int, got {value!r}")
    fixed = config.kv_format.fixed_row_bytes
    if fixed is not None and config.row_bytes != fixed:
        raise InvalidArgumentError(
            f"KV format {config.format!r} rows are {fixed} bytes "
            f"({config.kv_format.description}), got row_width {config.row_width} "
            f"= {config.row_bytes} bytes"
        )
    if not config.layers:
        raise InvalidArgumentError("KV cache config has no layers")
    seen: set[str] = set()
    for layer in config.layers:
        if layer.name in seen:
            raise InvalidArgumentError(f"KV cache layer name {layer.name!r} appears twice")
        seen.add(layer.name)
        if layer.offset_bytes < 0 or layer.offset_bytes % config.row_bytes:
            raise InvalidArgumentError(
                f"layer {layer.name!r} offset {layer.offset_bytes} must be >= 0 and a multiple of "
                f"the {config.row_bytes}-byte row"
            )
    return config

