"""Backend specs, entry-point discovery and probing: what is registered, and what each probe says.

Invariants: probing never creates a device context (probes use NVML, amdsmi, sysfs, library presence
and ``torch.version``); a probe that raises is recorded with its traceback, never swallowed. This module
knows no backend class: selection and construction live in :mod:`hisparse_hal.registry`.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import logging
import traceback
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from .errors import BackendUnavailableError

__all__ = [
    "ENTRY_POINT_GROUP",
    "Probe",
    "BackendSpec",
    "ProbeResult",
    "discover_specs",
    "run_probe",
    "probe_backends",
    "torch_gpu_build",
    "check_registered_backend",
    "registered_specs",
    "device_types",
]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "hisparse_hal.backends"


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
        device_type: the torch device type its tensors live on (``torch.device(device_type)``); the core
            asks it, never a vendor name, which device a backend's cache ops and ``hisparse-hal info`` use.
        torch_build: ``"<name> <version>"`` when the running torch is this vendor's build, else None; read
            from ``torch.version`` only (no device context). Selection refuses a silent CPU fallback on such a build.
        compiles_triton: Triton compiles the cache-op kernels for tensors of ``device_type`` (a GPU), so the
            cache ops choose Triton there when it imports.
        environment: the ``HISPARSE_HAL_*`` variables the vendor reads, ``(name, what it sets)`` pairs, so
            ``environment_check`` knows them.
        check_environment: checks those variables' values (raises ``InvalidArgumentError`` naming the
            variable); None when there is nothing to check.
        sweep_shared_files: removes the shared-memory files of this vendor's exited processes and returns
            their paths (``hisparse-hal`` runs it after an interrupt); None when it leaves none.
    """

    name: str
    priority: int
    probe: Callable[[], Probe]
    backend_class: str
    fallback_only: bool = False
    device_type: str = "cpu"
    torch_build: Callable[[], str | None] = dataclasses.field(default=lambda: None, compare=False)
    compiles_triton: bool = False
    environment: tuple[tuple[str, str], ...] = ()
    check_environment: Callable[[Mapping[str, str]], None] | None = dataclasses.field(default=None, compare=False)
    sweep_shared_files: Callable[[], list[str]] | None = dataclasses.field(default=None, compare=False)

    def load_class(self) -> type[Any]:
        """Import and return the backend class (checked to be a backend by the registry)."""
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


def torch_gpu_build() -> str | None:
    """The running torch's vendor build as the registered spec that owns it names it (``"<name> <version>"``,
    e.g. CUDA's or ROCm's), else None (a CPU build). Asks each spec's ``torch_build``; touches no device.

    A ``torch_build`` that raises answers for its spec as an unknown build naming the error, never None: a broken
    vendor hook must not let selection fall back to the CPU device silently."""
    for spec in registered_specs():
        try:
            build = spec.torch_build()
        except Exception as exc:  # noqa: BLE001 - a vendor's hook: named in the answer
            return f"unknown ({spec.name!r} spec's torch_build raised {type(exc).__name__}: {exc})"
        if build:
            return build
    return None


def registered_specs() -> list[BackendSpec]:
    """Every spec of ``hisparse_hal.backends`` that loads (sorted by name); entry points that fail are left out
    here (:func:`discover_specs` reports them)."""
    return [spec for spec in known_specs() if isinstance(spec, BackendSpec)]


_known: list[BackendSpec | ProbeResult] | None = None


def known_specs() -> list[BackendSpec | ProbeResult]:
    """:func:`discover_specs`, read once per process: the core asks the specs often (selection, the environment
    check, the cache-ops choice, the sweep), and a conformance run scans the entry points once per process.
    :func:`forget_specs` (``registry.reset_backend_cache``) makes the next call read them again."""
    global _known
    if _known is None:
        _known = discover_specs()
    return _known


def forget_specs() -> None:
    """Read the entry points again on the next :func:`known_specs` (tests that register a backend)."""
    global _known
    _known = None


def device_types(*, compiles_triton: bool = False) -> frozenset[str]:
    """The torch device types the registered backends run on (only those Triton compiles for, when asked).

    Args:
        compiles_triton: keep only the specs whose ``compiles_triton`` is set.

    Returns:
        A set of ``torch.device`` type names.
    """
    return frozenset(spec.device_type for spec in registered_specs() if spec.compiles_triton or not compiles_triton)


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


def run_probe(spec: BackendSpec) -> ProbeResult:
    """Run one spec's probe; a probe that raises becomes an unavailable result carrying its traceback."""
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
    results = [item if isinstance(item, ProbeResult) else run_probe(item) for item in known_specs()]
    return sorted(results, key=lambda r: (-r.priority, r.name))


def check_registered_backend(name: str) -> None:
    """Raise ``BackendUnavailableError`` if ``name`` is registered and its probe says unavailable."""
    for item in known_specs():
        if isinstance(item, BackendSpec) and item.name == name:
            result = run_probe(item)
            if not result.available:
                raise BackendUnavailableError(f"backend {name!r} is unavailable: {result.reason}")
            return
