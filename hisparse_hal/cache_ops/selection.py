"""Which cache-ops implementation runs on a device: ``"triton"``, ``"torch"`` or ``"host"``, with the reason.

Decided from capability facts only (is triton importable, is the device a GPU, is triton's interpreter on),
never from a vendor name. ``HISPARSE_HAL_CACHE_OPS`` overrides the choice; forcing an implementation where it
cannot run is an error, not a silent fallback. The choice is made once per device, by :func:`implementation_for`,
and everything reads it there: a backend's ``capabilities.cache_ops`` (:func:`with_cache_ops`, at construction)
and the op library ``torch.ops.hisparse_hal.*`` (which vLLM's ``_C_cache_ops`` names forward to).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import threading
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Literal

import torch

from hisparse_hal.capabilities import Capabilities
from hisparse_hal.errors import InvalidArgumentError, UnsupportedCapabilityError

__all__ = [
    "CACHE_OPS_ENV",
    "IMPLEMENTATIONS",
    "CacheOpsChoice",
    "TritonFacts",
    "choose_cache_ops",
    "implementation_entries",
    "implementation_for",
    "implementation_module",
    "probe_triton",
    "reset_implementation_choice",
    "triton_device_types",
    "with_cache_ops",
]

logger = logging.getLogger(__name__)

#: Environment variable forcing the implementation: ``triton``, ``torch`` or ``host``.
CACHE_OPS_ENV = "HISPARSE_HAL_CACHE_OPS"
IMPLEMENTATIONS: tuple[str, ...] = ("triton", "torch", "host")

Implementation = Literal["triton", "torch", "host"]

# Why the CPU device gets ``host``: torch_impl keeps every shape fixed and reads no value back so a GPU can
# capture it, which makes its gathers rewrite all R x K planned rows. On host memory a read-back is free and
# the CPU backend's captures re-run the op, so host_impl counts the misses and copies only those rows.
_HOST_REASON = "device cpu is host memory: reading values back costs nothing, so the gathers copy only the misses"


@dataclasses.dataclass(frozen=True)
class TritonFacts:
    """What decides whether the Triton kernels can run here.

    Attributes:
        version: triton's version when it imports, else None.
        error: why it does not import (None when it does).
        interpreter: ``TRITON_INTERPRET=1``: kernels run on CPU tensors through triton's interpreter.
    """

    version: str | None
    error: str | None
    interpreter: bool


def probe_triton(environ: Mapping[str, str] | None = None) -> TritonFacts:
    """Import triton (creates no device context) and report whether it works here.

    Args:
        environ: the environment to read ``TRITON_INTERPRET`` from (``os.environ`` when None).
    """
    env = os.environ if environ is None else environ
    interpreter = env.get("TRITON_INTERPRET", "0").strip() == "1"
    try:
        triton = importlib.import_module("triton")
    except Exception as exc:  # noqa: BLE001 - any failure to import means "not usable", with the reason
        return TritonFacts(None, f"{type(exc).__name__}: {exc}", interpreter)
    return TritonFacts(str(getattr(triton, "__version__", "unknown")), None, interpreter)


_triton_types: frozenset[str] | None = None


def triton_device_types() -> frozenset[str]:
    """The torch device types Triton compiles the cache-op kernels for: those of the registered backend specs
    whose ``compiles_triton`` is set (read once per process; :func:`reset_implementation_choice` reads them again).
    """
    global _triton_types
    if _triton_types is None:
        from hisparse_hal.probing import device_types

        _triton_types = device_types(compiles_triton=True)
    return _triton_types


def choose_cache_ops(
    device: torch.device | str,
    facts: TritonFacts | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> tuple[Implementation, str]:
    """Pick the cache-ops implementation for tensors on ``device``.

    Triton when it imports and ``device`` is a GPU Triton compiles for (a device type whose backend spec sets
    ``compiles_triton``: :func:`triton_device_types`); ``host`` on the CPU device; torch otherwise (a GPU without
    triton). ``HISPARSE_HAL_CACHE_OPS=torch`` forces torch; ``=host`` forces host (CPU device only: it reads
    values back, which would sync a GPU and break its graph capture); ``=triton`` forces Triton, which on a CPU
    device needs ``TRITON_INTERPRET=1`` (tests and CI run the kernels that way).

    Args:
        device: where the ops' tensors live (for a GPU backend, its GPU, even when tests inject another).
        facts: triton's facts; probed with :func:`probe_triton` when None and needed.
        environ: the environment to read (``os.environ`` when None).

    Returns:
        ``(implementation, reason)``.

    Raises:
        InvalidArgumentError: ``HISPARSE_HAL_CACHE_OPS`` is not ``triton``, ``torch`` or ``host``.
        UnsupportedCapabilityError: ``triton`` is forced but triton does not import, or the device is not
            a GPU and the interpreter is off; ``host`` is forced on a GPU.
    """
    env = os.environ if environ is None else environ
    target = torch.device(device)
    forced = env.get(CACHE_OPS_ENV, "").strip().lower()
    if forced and forced not in IMPLEMENTATIONS:
        raise InvalidArgumentError(
            f"{CACHE_OPS_ENV} must be one of {list(IMPLEMENTATIONS)}, got {env.get(CACHE_OPS_ENV)!r}; "
            "unset it to choose by capability"
        )
    if forced == "torch":
        return "torch", f"{CACHE_OPS_ENV}=torch"
    if forced == "host":
        if target.type != "cpu":
            raise UnsupportedCapabilityError(
                f"{CACHE_OPS_ENV}=host on device {target}: the host implementation reads values back, which "
                "syncs a GPU and cannot be graph-captured; use torch or triton there"
            )
        return "host", f"{CACHE_OPS_ENV}=host"
    if forced != "triton" and target.type == "cpu":
        return "host", _HOST_REASON
    is_gpu = target.type in triton_device_types()  # after the CPU's answer: a CPU run reads no spec for it
    if forced != "triton" and not is_gpu:
        return "torch", f"device {target} is not a GPU; the Triton kernels compile for GPUs only"
    if facts is None:
        facts = probe_triton(env)
    if facts.version is None:
        if forced == "triton":
            raise UnsupportedCapabilityError(
                f"{CACHE_OPS_ENV}=triton, but triton does not import ({facts.error}); install "
                f"triton (pip install -e '.[triton]' in a hisparse-hal checkout) or unset {CACHE_OPS_ENV}"
            )
        return "torch", f"triton does not import ({facts.error})"
    if forced == "triton":
        if not is_gpu and not facts.interpreter:
            raise UnsupportedCapabilityError(
                f"{CACHE_OPS_ENV}=triton on device {target}: triton runs CPU tensors only through its "
                "interpreter; set TRITON_INTERPRET=1 or unset the override"
            )
        where = "a GPU" if is_gpu else "the CPU under TRITON_INTERPRET=1"
        return "triton", f"{CACHE_OPS_ENV}=triton; triton {facts.version} on {where}"
    return "triton", f"triton {facts.version} imports and device {target} is a GPU"


def implementation_module(name: str) -> ModuleType:
    """The module holding the four ops of implementation ``name`` (``triton_impl``, ``torch_impl``, ``host_impl``).

    Raises:
        InvalidArgumentError: ``name`` is not ``"triton"``, ``"torch"`` or ``"host"``.
    """
    if name not in IMPLEMENTATIONS:
        raise InvalidArgumentError(f"cache-ops implementation must be one of {list(IMPLEMENTATIONS)}, got {name!r}")
    return importlib.import_module(f"{__package__}.{name}_impl")


@dataclasses.dataclass(frozen=True)
class CacheOpsChoice:
    """The implementation chosen for one device, and why.

    Attributes:
        implementation: ``"triton"``, ``"torch"`` or ``"host"``.
        reason: one sentence: the override, or the capability fact that decided it.
        module: the module holding the implementation's four ops (:func:`implementation_module`).
    """

    implementation: Implementation
    reason: str
    module: ModuleType = dataclasses.field(repr=False, compare=False)


_choices: dict[torch.device, CacheOpsChoice] = {}
_choices_lock = threading.Lock()


def implementation_for(device: torch.device | str) -> CacheOpsChoice:
    """The cache-ops implementation for tensors on ``device``: the one place the choice is made and kept.

    Decided by :func:`choose_cache_ops` (reading ``HISPARSE_HAL_CACHE_OPS`` and probing triton) on the first
    call for a device, then memoised for the process: the choice depends on the device, the installed packages
    and the variable, never on tensor values. A backend's ``capabilities.cache_ops`` (:func:`with_cache_ops`)
    and the op library's dispatch both read it here, so they cannot disagree. A changed variable takes effect
    only after :func:`reset_implementation_choice`, and then for the op library and for backends built
    afterwards (a backend keeps the choice it was built with; ``registry.reset_backend_cache()`` drops it).

    Example::

        >>> implementation_for("cpu").implementation
        'host'

    Args:
        device: where the ops' tensors live (for a GPU backend, its GPU).

    Returns:
        The :class:`CacheOpsChoice`.

    Raises:
        InvalidArgumentError: ``HISPARSE_HAL_CACHE_OPS`` is not ``triton``, ``torch`` or ``host`` (never
            memoised: every call refuses it until it is fixed).
        UnsupportedCapabilityError: as :func:`choose_cache_ops` (never memoised either).
    """
    key = torch.device(device)
    with _choices_lock:
        chosen = _choices.get(key)
        if chosen is None:
            name, reason = choose_cache_ops(key)
            chosen = CacheOpsChoice(name, reason, implementation_module(name))
            _choices[key] = chosen
            logger.info("cache ops on %s: %s (%s)", key, name, reason)
        return chosen


def reset_implementation_choice() -> None:
    """Forget every memoised :func:`implementation_for` choice (tests, or after changing ``HISPARSE_HAL_CACHE_OPS``).

    The next op call and the next backend built choose afresh, from the registered specs read again; backends
    already built keep theirs.
    """
    from hisparse_hal.probing import forget_specs

    global _triton_types
    with _choices_lock:
        _choices.clear()
        _triton_types = None
    forget_specs()


def implementation_entries(name: str) -> Any:
    """The four vLLM-order entries of implementation ``name`` for one ops object (a ``signatures.VllmOps``).

    An implementation with per-caller state (Triton's scratch, kept at a fixed address for graph replay)
    provides ``entries()``, called here once per ops object; the others share their module functions.

    Raises:
        InvalidArgumentError: ``name`` is not ``"triton"``, ``"torch"`` or ``"host"``.
    """
    from .signatures import VllmOps

    module = implementation_module(name)
    factory = getattr(module, "entries", None)
    if factory is not None:
        return factory()
    return VllmOps(module.resolve_residency, module.gather_compact, module.gather_plan,
                   module.invalidate_written_slots)


def with_cache_ops(
    capabilities: Capabilities,
    device: torch.device | str,
    facts: TritonFacts | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> Capabilities:
    """``capabilities`` with ``cache_ops`` chosen for ``device`` and ``reasons["cache_ops"]`` saying why.

    The choice is :func:`implementation_for`'s (memoised, shared with the op library). Only tests pass
    ``facts`` or ``environ``: the choice is then made from them by :func:`choose_cache_ops` and not memoised.

    Raises:
        InvalidArgumentError, UnsupportedCapabilityError: as :func:`choose_cache_ops`.
    """
    if facts is None and environ is None:
        memoised = implementation_for(device)
        choice, reason = memoised.implementation, memoised.reason
    else:
        choice, reason = choose_cache_ops(device, facts, environ=environ)
    reasons = {**capabilities.reasons, "cache_ops": f"{choice} ({reason})"}
    return dataclasses.replace(capabilities, cache_ops=choice, reasons=reasons)
