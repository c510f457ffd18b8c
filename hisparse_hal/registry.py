"""Backend specs, entry-point discovery, probing and selection.

Invariants: probing never creates a device context (probes use NVML, amdsmi, sysfs, library presence
and ``torch.version``); a probe that raises is recorded with its traceback, never swallowed; there is
no silent fallback to the CPU device on a GPU build of torch.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import logging
import os
import threading
import traceback
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .errors import BackendUnavailableError

if TYPE_CHECKING:
    from .backend import HiSparseBackend

__all__ = [
    "ENTRY_POINT_GROUP",
    "BACKEND_ENV",
    "Probe",
    "BackendSpec",
    "ProbeResult",
    "Selection",
    "discover_specs",
    "probe_backends",
    "select_backend",
    "get_backend",
    "reset_backend_cache",
    "format_probe_table",
    "torch_gpu_build",
    "check_registered_backend",
]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "hisparse_hal.backends"
BACKEND_ENV = "HISPARSE_HAL_BACKEND"


@dataclasses.dataclass(frozen=True)
class Probe:
    """What a probe returns: availability, a one-sentence reason, and the facts it read."""

    available: bool
    reason: str
    facts: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class BackendSpec:
    """A registered backend: a cheap probe and the qualified name of the class to load when chosen.

    Attributes:
        name: registry name.
        priority: higher wins among available backends.
        probe: returns a :class:`Probe`; must not create a device context.
        backend_class: ``"module:Class"``, imported only when the backend is chosen.
        fallback_only: chosen automatically only when torch has no GPU build (the CPU device).
    """

    name: str
    priority: int
    probe: Callable[[], Probe]
    backend_class: str
    fallback_only: bool = False

    def load_class(self) -> type[HiSparseBackend]:
        """Import and return the backend class."""
        module_name, _, attr = self.backend_class.partition(":")
        return getattr(importlib.import_module(module_name), attr)


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """The outcome of probing one backend, as ``probe_backends()`` reports it."""

    name: str
    priority: int
    available: bool
    reason: str
    facts: Mapping[str, Any]
    error: str | None = None
    spec: BackendSpec | None = dataclasses.field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form: name, available, reason, priority, facts, error."""
        return {
            "name": self.name,
            "available": self.available,
            "reason": self.reason,
            "priority": self.priority,
            "facts": dict(self.facts),
            "error": self.error,
        }


@dataclasses.dataclass(frozen=True)
class Selection:
    """The outcome of selection: the chosen result (or None), why, and every probe result."""

    chosen: ProbeResult | None
    explanation: str
    results: tuple[ProbeResult, ...]


def torch_gpu_build() -> str | None:
    """``"cuda <ver>"`` or ``"hip <ver>"`` when torch is a GPU build, else None. Touches no device."""
    import torch

    if getattr(torch.version, "hip", None):
        return f"hip {torch.version.hip}"
    if getattr(torch.version, "cuda", None):
        return f"cuda {torch.version.cuda}"
    return None


def discover_specs() -> list[BackendSpec | ProbeResult]:
    """Load every entry point of ``hisparse_hal.backends``.

    Returns specs, and for an entry point that fails to load (or is not a ``BackendSpec``) an
    unavailable ``ProbeResult`` carrying the traceback. Sorted by name.
    """
    found: dict[str, BackendSpec | ProbeResult] = {}
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            spec = entry.load()
            if callable(spec) and not isinstance(spec, BackendSpec):
                spec = spec()
            if not isinstance(spec, BackendSpec):
                raise TypeError(f"entry point {entry.value!r} gave {type(spec).__name__}, not a BackendSpec")
        except Exception as exc:  # noqa: BLE001 - recorded, never swallowed
            found.setdefault(
                entry.name,
                ProbeResult(entry.name, 0, False, f"entry point {entry.value!r} failed to load: {exc}", {},
                            traceback.format_exc()),
            )
            continue
        if spec.name in found:
            log.warning("backend name %r registered twice; keeping the first (%s)", spec.name, entry.value)
            continue
        found[spec.name] = spec
    return [found[name] for name in sorted(found)]


def _run_probe(spec: BackendSpec) -> ProbeResult:
    try:
        probe = spec.probe()
        reason = probe.reason.strip() or ("available" if probe.available else "unavailable (probe gave no reason)")
        return ProbeResult(spec.name, spec.priority, bool(probe.available), reason,
                           MappingProxyType(dict(probe.facts)), None, spec)
    except Exception as exc:  # noqa: BLE001 - recorded with its traceback
        return ProbeResult(spec.name, spec.priority, False, f"probe raised {type(exc).__name__}: {exc}", {},
                           traceback.format_exc(), spec)


def probe_backends() -> list[ProbeResult]:
    """Probe every registered backend (highest priority first). Creates no device context."""
    results = [item if isinstance(item, ProbeResult) else _run_probe(item) for item in discover_specs()]
    return sorted(results, key=lambda r: (-r.priority, r.name))


def format_probe_table(results: list[ProbeResult] | tuple[ProbeResult, ...], chosen: str | None = None) -> str:
    """A plain-text table of probe results, marking the chosen backend."""
    lines = [f"{'':2}{'backend':<10} {'prio':>4}  {'available':<9}  reason"]
    for r in results:
        mark = "*" if r.name == chosen else " "
        lines.append(f"{mark:2}{r.name:<10} {r.priority:>4}  {'yes' if r.available else 'no':<9}  {r.reason}")
        if r.error:
            last = r.error.strip().splitlines()[-1]
            lines.append(f"{'':18}probe error: {last}")
    return "\n".join(lines)


def select_backend(name: str | None = None, results: list[ProbeResult] | None = None) -> Selection:
    """Decide which backend to use, without constructing it.

    Args:
        name: a backend name (strict); None reads ``HISPARSE_HAL_BACKEND``, then selects automatically.
        results: probe results to select from (probed now when None).

    Raises:
        BackendUnavailableError: an unknown or unavailable name; no available backend; a tie between
            the highest-priority candidates; a GPU build of torch whose vendor probe failed. The
            message includes the probe table.
    """
    results = probe_backends() if results is None else results
    requested = name if name is not None else (os.environ.get(BACKEND_ENV) or None)
    table = format_probe_table(results)
    if requested is not None:
        source = "requested" if name is not None else f"{BACKEND_ENV}={requested!r}"
        match = next((r for r in results if r.name == requested), None)
        if match is None:
            raise BackendUnavailableError(
                f"unknown backend {requested!r} ({source}); registered: {[r.name for r in results]}", table
            )
        if not match.available:
            raise BackendUnavailableError(f"backend {requested!r} ({source}) is unavailable: {match.reason}", table)
        return Selection(match, f"{match.name}: {source}; {match.reason}", tuple(results))

    gpu_build = torch_gpu_build()
    candidates = [r for r in results if r.available and not (r.spec and r.spec.fallback_only and gpu_build)]
    if not candidates:
        if gpu_build:
            raise BackendUnavailableError(
                f"torch is a GPU build ({gpu_build}) but no GPU backend is available; hisparse-hal does "
                f"not fall back to the CPU device silently. Fix the probe failure below, or set "
                f"{BACKEND_ENV}=cpu to run on the CPU reference device on purpose",
                table,
            )
        raise BackendUnavailableError("no backend is available", table)
    best = max(r.priority for r in candidates)
    top = [r for r in candidates if r.priority == best]
    if len(top) > 1:
        raise BackendUnavailableError(
            f"backends {[r.name for r in top]} are all available with priority {best}; "
            f"set {BACKEND_ENV} to choose one",
            table,
        )
    chosen = top[0]
    why = f"{chosen.name}: highest-priority available backend; {chosen.reason}"
    if chosen.spec and chosen.spec.fallback_only:
        why = f"{chosen.name}: torch has no GPU build, so the CPU reference device is used; {chosen.reason}"
    return Selection(chosen, why, tuple(results))


_cache: dict[str, HiSparseBackend] = {}
_cache_lock = threading.Lock()


def get_backend(name: str | None = None) -> HiSparseBackend:
    """The backend for this process (constructed once per name, then cached).

    Args:
        name: a backend name (strict); None reads ``HISPARSE_HAL_BACKEND``, then selects automatically.

    Raises:
        BackendUnavailableError: as :func:`select_backend`.
    """
    with _cache_lock:
        key = name if name is not None else (os.environ.get(BACKEND_ENV) or "")
        if key in _cache:
            return _cache[key]
        selection = select_backend(name)
        chosen = selection.chosen
        assert chosen is not None and chosen.spec is not None
        log.info("hisparse-hal backend %s", selection.explanation)
        backend = chosen.spec.load_class().from_probe(chosen)
        _cache[key] = backend
        return backend


def reset_backend_cache() -> None:
    """Forget cached backends (tests, or after changing ``HISPARSE_HAL_BACKEND``)."""
    with _cache_lock:
        _cache.clear()


def check_registered_backend(name: str) -> None:
    """Raise ``BackendUnavailableError`` if ``name`` is registered and its probe says unavailable."""
    for item in discover_specs():
        if isinstance(item, BackendSpec) and item.name == name:
            result = _run_probe(item)
            if not result.available:
                raise BackendUnavailableError(f"backend {name!r} is unavailable: {result.reason}")
            return
