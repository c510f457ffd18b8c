"""What a backend can do, decided once after probing.

The core and the conformance suite branch on these values, never on vendor names. Each vendor decides
its version quirks in one pure function that returns a ``Capabilities``, with the reason for each forced
decision keyed by the field it set (code reads ``reasons["graph_capture"]``, never the wording of a note).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

import torch

__all__ = ["Capabilities", "KV_FORMATS", "CapabilityReasons"]

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
        reasons: why a field has its value where a version, architecture or choice forced it, with its
            source, keyed by the field's name (``"batch_copy"``, ``"graph_capture"``, ``"cache_ops"``, ...;
            ``"versions"`` for facts about the versions themselves). Plans build it with :class:`CapabilityReasons`.
        cache_ops: which implementation runs the four per-step cache ops (``resolve_residency``,
            ``gather_compact``, ``gather_plan``, ``invalidate_written_slots``): ``"triton"`` kernels,
            ``"torch"`` fixed-shape tensor code, or ``"host"`` (CPU device: gathers that copy only the misses)
            (:mod:`hisparse_hal.cache_ops.selection`; ``reasons["cache_ops"]`` says why).

    ``notes`` (a property) renders ``reasons`` for display, one ``"<field>: <reason>"`` line each; reports
    and JSON carry both.
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
    reasons: Mapping[str, str] = dataclasses.field(default_factory=dict)
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
        keys = {field.name for field in dataclasses.fields(self)} - {"reasons"}
        stray = sorted(set(self.reasons) - keys)
        if stray:
            raise InvalidArgumentError(
                f"capability reasons must be keyed by a Capabilities field; unknown keys {stray} "
                f"(fields: {sorted(keys)})"
            )
        object.__setattr__(self, "reasons", MappingProxyType(dict(self.reasons)))

    @property
    def notes(self) -> tuple[str, ...]:
        """``reasons`` for display: one ``"<field>: <reason>"`` line per field, in the order they were given."""
        return tuple(f"{field}: {reason}" for field, reason in self.reasons.items())

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready dictionary of every field (dtypes and sets as strings and sorted lists), plus
        ``notes``."""
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
        out["notes"] = list(self.notes)
        return out


class CapabilityReasons(dict[str, str]):
    """``Capabilities.reasons`` as a plan builds it: :meth:`add` appends a reason to a field's, in order.

    Example::

        reasons = CapabilityReasons()
        reasons.add("batch_copy", "no batch call before 7.1 (vLLM #41737)")
        reasons.add("batch_copy", "capped at 8192 descriptors")
        reasons["batch_copy"]  # 'no batch call before 7.1 (vLLM #41737); capped at 8192 descriptors'
    """

    def add(self, field: str, reason: str) -> None:
        """Record ``reason`` for capability ``field``, after any reason it already has (joined by ``"; "``)."""
        self[field] = f"{self[field]}; {reason}" if field in self else reason
