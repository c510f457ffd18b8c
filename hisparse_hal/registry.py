"""Backend selection: which registered backend this process uses, and why.

Invariants: probing never creates a device context (probes use NVML, amdsmi, sysfs, library presence
and ``torch.version``); a probe that raises is recorded with its traceback, never swallowed; there is
no silent fallback to the CPU device on a GPU build of torch.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

from . import probing
from .backend import HiSparseBackend
from .errors import BackendUnavailableError

# Discovery and probing live in .probing (which knows no backend class); their names stay public here.
from .probing import (
    ENTRY_POINT_GROUP,
    BackendSpec,
    Probe,
    ProbeResult,
    check_registered_backend,
    discover_specs,
    probe_backends,
    torch_gpu_build,
)
from .settings import name_setting

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
BACKEND_ENV = "HISPARSE_HAL_BACKEND"


@dataclasses.dataclass(frozen=True)
class Selection:
    """The outcome of selection: the chosen result (or None), why, and every probe result."""

    chosen: ProbeResult | None
    explanation: str
    results: tuple[ProbeResult, ...]



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
    requested = name if name is not None else name_setting(BACKEND_ENV)
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
        key = name if name is not None else (name_setting(BACKEND_ENV) or "")
        if key in _cache:
            return _cache[key]
        selection = select_backend(name)
        chosen = selection.chosen
        assert chosen is not None and chosen.spec is not None
        log.info("hisparse-hal backend %s", selection.explanation)
        backend_class = chosen.spec.load_class()
        if not (isinstance(backend_class, type) and issubclass(backend_class, HiSparseBackend)):
            raise BackendUnavailableError(
                f"backend {chosen.name!r}: {chosen.spec.backend_class!r} is not a HiSparseBackend subclass"
            )
        backend = backend_class.from_probe(chosen)
        _cache[key] = backend
        return backend


def reset_backend_cache() -> None:
    """Forget cached backends and the registered specs (tests, or after changing ``HISPARSE_HAL_BACKEND``)."""
    with _cache_lock:
        _cache.clear()
    probing.forget_specs()
