"""The cache ops bound to one backend: what ``HiSparseBackend.create_cache_ops`` returns to vLLM 0.34.0.

Invariant: a :class:`CacheOps` runs the implementation its backend's ``capabilities.cache_ops`` names (chosen once
per device by :func:`.selection.implementation_for`) on the backend's device view of the pinned host cache, built
once per host tensor and pin generation (:class:`DeviceViews`), and hands each op to the backend, which runs it
now or records it into a capture. This module knows the backend only through :class:`BoundBackend`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import torch

from hisparse_hal.capabilities import Capabilities
from hisparse_hal.stats import new_stats_counter

from . import arguments
from .selection import implementation_entries
from .signatures import ARITY, method_signature, positional_arguments

__all__ = ["BoundBackend", "CacheOps", "DeviceViews"]

#: Per op: the shared argument check and its ``(required, total)`` argument counts, looked up once per call.
_CHECKS: dict[str, tuple[Callable[..., Any], int, int]] = {
    name: (getattr(arguments, f"check_{name}"), *ARITY[name]) for name in ARITY
}


class BoundBackend(Protocol):
    """What :class:`CacheOps` needs of its backend; :class:`hisparse_hal.backend.HiSparseBackend` provides it."""

    @property
    def device(self) -> torch.device: ...

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def stats_dtype(self) -> torch.dtype: ...

    @property
    def pin_generation(self) -> int: ...

    def device_view_of_host(self, host_tensor: torch.Tensor) -> torch.Tensor: ...

    def _enqueue_cache_op(self, name: str, run: Callable[[], None], check: Callable[[], None]) -> None: ...

    def swap_blocks_batch(self, src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor) -> None: ...

    def gather_resident_rows(self, source: torch.Tensor, destination: torch.Tensor, row_ids: torch.Tensor) -> None: ...

    def raise_gather_faults(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class CacheOps:
    """What ``create_cache_ops`` returns: the per-step operations bound to one backend and runtime.

    vLLM 0.34.0 calls four names on it, positionally (design note §2 B9-B11, B16):
    ``hisparse_resolve_residency`` (23 arguments), ``hisparse_gather_compact`` (5), ``hisparse_gather_plan`` (5)
    and ``hisparse_invalidate_written_slots`` (6), with the schemas of :mod:`hisparse_hal.cache_ops.library`.
    The un-prefixed names are the same methods. They run in the implementation ``capabilities.cache_ops``
    names, on the current stream; ``host_cache`` is passed as the backend's device view of the pinned
    host tensor (:meth:`~hisparse_hal.backend.HiSparseBackend.device_view_of_host`, built once per host tensor
    and pin generation), so every tensor the kernels see is on the backend's device. Nothing here reads a device
    value or allocates per call on the torch path's host side, so resolve and compact can be captured on a side
    stream; the Triton path keeps its scratch per ops object (one allocation per batch shape, reused at a fixed
    address).
    """

    backend: BoundBackend
    runtime: Any
    _views: DeviceViews = dataclasses.field(init=False, repr=False, compare=False)
    _entries: Any = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_views", DeviceViews(self.backend))  # frozen: set once, here
        object.__setattr__(self, "_entries", implementation_entries(self.implementation))

    @property
    def implementation(self) -> str:
        """``"triton"``, ``"torch"`` or ``"host"``: the implementation these ops run, ``backend.capabilities.cache_ops``
        (:func:`hisparse_hal.cache_ops.selection.implementation_for`'s choice for the backend's device, made when the
        backend was built)."""
        return self.backend.capabilities.cache_ops

    def _run(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Hand one cache op to the backend, which runs it now or records it into a capture. vLLM's positional
        call of the right length passes straight through; keywords are bound to vLLM's names, a wrong count
        is refused (:class:`~hisparse_hal.errors.CacheOpArityError`) before anything runs."""
        check, required, total = _CHECKS[name]
        if kwargs or not required <= len(args) <= total:
            args = positional_arguments(name, args, kwargs)
        if name != "invalidate_written_slots":
            args = (self._views.of(args[0]), *args[1:])
        entry = getattr(self._entries, name)
        self.backend._enqueue_cache_op(name, lambda: entry(*args), lambda: check(*args))

    def hisparse_resolve_residency(self, *args: Any, **kwargs: Any) -> None:
        """vLLM 0.34.0 ``hisparse_resolve_residency`` (23 arguments, the last 13 optional; vLLM passes all
        positionally): :func:`hisparse_hal.cache_ops.signatures.vllm_ops`'s ``resolve_residency``.

        Raises:
            CacheOpArityError: fewer than 10 or more than 23 arguments, or an unknown keyword (nothing ran).
            InvalidArgumentError: an argument vLLM's op would reject, or a host cache not pinned here.
            UnionOverflowError: a run's union exceeds ``max_union_rows`` (CPU device; a GPU asserts).
        """
        self._run("resolve_residency", args, kwargs)

    def hisparse_gather_compact(self, *args: Any, **kwargs: Any) -> None:
        """vLLM 0.34.0 ``hisparse_gather_compact`` (5 arguments).

        Raises:
            CacheOpArityError: not 5 arguments, or an unknown keyword (nothing ran).
            InvalidArgumentError: an argument vLLM's op would reject, or a host cache not pinned here.
        """
        self._run("gather_compact", args, kwargs)

    def hisparse_gather_plan(self, *args: Any, **kwargs: Any) -> None:
        """vLLM 0.34.0 ``hisparse_gather_plan`` (5 arguments).

        Raises:
            CacheOpArityError: not 5 arguments, or an unknown keyword (nothing ran).
            InvalidArgumentError: an argument vLLM's op would reject, or a host cache not pinned here.
        """
        self._run("gather_plan", args, kwargs)

    def hisparse_invalidate_written_slots(self, *args: Any, **kwargs: Any) -> None:
        """vLLM 0.34.0 ``hisparse_invalidate_written_slots`` (6 arguments).

        Raises:
            CacheOpArityError: not 6 arguments, or an unknown keyword (nothing ran).
            InvalidArgumentError: an argument vLLM's op would reject.
            UnknownTableError: an address names no registered table (CPU device; a GPU asserts).
        """
        self._run("invalidate_written_slots", args, kwargs)

    # inspect.signature and help() show vLLM's parameter names; the calls above bind nothing on vLLM's path.
    hisparse_resolve_residency.__signature__ = method_signature("resolve_residency")  # type: ignore[attr-defined]
    hisparse_gather_compact.__signature__ = method_signature("gather_compact")  # type: ignore[attr-defined]
    hisparse_gather_plan.__signature__ = method_signature("gather_plan")  # type: ignore[attr-defined]
    hisparse_invalidate_written_slots.__signature__ = method_signature(  # type: ignore[attr-defined]
        "invalidate_written_slots")

    resolve_residency = hisparse_resolve_residency
    gather_compact = hisparse_gather_compact
    gather_plan = hisparse_gather_plan
    invalidate_written_slots = hisparse_invalidate_written_slots

    def swap_blocks_batch(self, src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor) -> None:
        """See :meth:`hisparse_hal.backend.HiSparseBackend.swap_blocks_batch`."""
        self.backend.swap_blocks_batch(src, dst, sizes)

    def gather_resident_rows(self, source: torch.Tensor, destination: torch.Tensor, row_ids: torch.Tensor) -> None:
        """See :meth:`hisparse_hal.backend.HiSparseBackend.gather_resident_rows`."""
        self.backend.gather_resident_rows(source, destination, row_ids)

    def raise_gather_faults(self) -> None:
        """See :meth:`hisparse_hal.backend.HiSparseBackend.raise_gather_faults`."""
        self.backend.raise_gather_faults()

    def new_stats_counter(self) -> torch.Tensor:
        """A zeroed ``[hits, misses]`` counter of the backend's ``stats_dtype`` on its device."""
        return new_stats_counter(self.backend.device, self.backend.stats_dtype)


class DeviceViews:
    """The device views of pinned host tensors one :class:`CacheOps` hands its kernels, built once each.

    A view is kept per host tensor (its address, dtype, shape and strides) and the backend's
    :attr:`~hisparse_hal.backend.HiSparseBackend.pin_generation`, and rebuilt only after a pin or unpin: building one
    scans the registrations and, on a GPU, makes a tensor from ``__cuda_array_interface__`` (tens of microseconds per
    layer per step). A kept view keeps its host tensor alive until the first call after a pin or unpin.
    """

    #: Views kept at most (a host pool per layer: 61 on DeepSeek-V3.2); more empties the cache first.
    MAX_VIEWS = 256

    def __init__(self, backend: BoundBackend) -> None:
        self._backend = backend
        self._views: dict[tuple[Any, ...], torch.Tensor] = {}
        self._generation = -1

    def of(self, host_tensor: torch.Tensor) -> torch.Tensor:
        """The backend's :meth:`~hisparse_hal.backend.HiSparseBackend.device_view_of_host` of ``host_tensor``, from the
        cache when no pin or unpin happened since it was built.

        Raises:
            InvalidArgumentError, UnsupportedCapabilityError: as ``device_view_of_host`` (never cached).
        """
        if not isinstance(host_tensor, torch.Tensor):
            return self._backend.device_view_of_host(host_tensor)  # raises its typed error
        generation = self._backend.pin_generation  # read before building: a racing pin forces a rebuild
        if generation != self._generation:
            self._views, self._generation = {}, generation
        views = self._views
        key = (host_tensor.data_ptr(), host_tensor.dtype, tuple(host_tensor.shape), host_tensor.stride(),
               host_tensor.device)
        view = views.get(key)
        if view is None:
            view = self._backend.device_view_of_host(host_tensor)
            if len(views) >= self.MAX_VIEWS:
                views.clear()
            views[key] = view
        return view
