"""What a backend can do, decided once after probing.

The core and the conformance suite branch on these values, never on vendor names. Each vendor decides
its version quirks in one pure function that returns a ``Capabilities``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

import torch

__all__ = ["Capabilities", "KV_FORMATS"]

#: Every KV cache format name hisparse-hal knows (see :mod:`hisparse_hal.kv_cache`).
KV_FORMATS = frozenset({"bf16", "fp8_e4m3fn", "fp8_e4m3fnuz", "fp8_ds_mla"})


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """Capabilities of one backend on one device.

    Attributes:
        batch_copy: ``"native"`` when swaps go to the vendor's batch-copy call, ``"loop"`` when they are
            issued one copy at a time.
        max_batch_descriptors: the most descriptors one batch call may carry, or None for no cap. Swaps
            larger than this are chunked transparently.
        ipc_events: events can be exported to and imported by another process.
        ipc_event_max_cycles: a known limit on record/wait cycles of one IPC event, or None.
        shared_host_pool: one pinned host pool may be shared by all local tensor-parallel ranks.
        graph_capture: ``capture()`` works and captured operations replay.
        host_pointer_alias: kernels on this device may not address registered host memory by its host
            address. Every registration then records the device address kernels must use
            (``HostRegistration.device_alias``, per chunk in ``HostChunk.device_alias`` and
            ``Region.device_alias``); it may equal the host address on some systems. False: the host
            address is valid on the device and the records carry no alias. Runtime copies take host
            addresses either way. ROCm: always True (``hipHostGetDevicePointer``); CUDA: True where the
            device attribute ``CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM`` is 0; CPU device: False.
        kv_formats: KV cache formats this device can hold.
        stats_dtype: dtype of the 2-element (hits, misses) device counter.
        versions: runtime versions (and other facts) that decided the values above.
        copy_attributes: the batch call accepts per-copy attributes (source access order, location hints).
        batch_copy_accelerated: the vendor's batch call is faster than the vendor's own per-copy loop; when
            False the runtime loops internally, and the batch call only saves per-call host overhead.
        notes: one sentence per decision that a version or architecture forced, with its source.
        cache_ops: which implementation runs the four per-step cache ops (``resolve_residency``,
            ``gather_compact``, ``gather_plan``, ``invalidate_written_slots``): ``"triton"`` kernels,
            ``"torch"`` fixed-shape tensor code, or ``"host"`` (CPU device: gathers that copy only the misses)
            (:mod:`hisparse_hal.cache_ops.selection`; a note says why).
    """

    batch_copy: Literal["native", "loop"]
    max_batch_descriptors: int | None
    ipc_events: bool
    ipc_event_max_cycles: int | None
    shared_host_pool: bool
    graph_capture: bool
    host_pointer_alias: bool
    kv_formats: frozenset[str]
    stats_dtype: torch.dtype = torch.uint64
    versions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    copy_attributes: bool = False
    batch_copy_accelerated: bool = True
    notes: tuple[str, ...] = ()
    cache_ops: Literal["triton", "torch", "host"] = "torch"

    def __post_init__(self) -> None:
        from .errors import InvalidArgumentError

        if self.batch_copy not in ("native", "loop"):
            raise InvalidArgumentError(
                f"batch_copy must be 'native' or 'loop', got {self.batch_copy!r}"
            )
        if self.max_batch_descriptors is not None and self.max_batch_descriptors < 1:
            raise InvalidArgumentError(
                f"max_batch_descriptors must be None or >= 1, got {self.max_batch_descriptors!r}"
            )
        if self.cache_ops not in ("triton", "torch", "host"):
            raise InvalidArgumentError(
                f"cache_ops must be 'triton', 'torch' or 'host', got {self.cache_ops!r}"
            )
        unknown = set(self.kv_formats) - KV_FORMATS
        if unknown:
            raise InvalidArgumentError(
                f"unknown KV formats {sorted(unknown)}; known formats are {sorted(KV_FORMATS)}"
            )
        object.__setattr__(self, "kv_formats", frozenset(self.kv_formats))
        object.__setattr__(self, "versions", MappingProxyType(dict(self.versions)))
        object.__setattr__(self, "notes", tuple(self.notes))

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready dictionary of every field (dtypes and sets as strings and sorted lists)."""
        out: dict[str, object] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, torch.dtype):
                value = str(value).removeprefix("torch.")
            elif isinstance(value, frozenset):
                value = sorted(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[field.name] = value
        return out
