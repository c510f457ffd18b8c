"""Every ``HISPARSE_HAL_*`` environment variable the package reads, checked at once before a command starts, so
a mistyped value fails by name in a second instead of surfacing later as a failing test or a traceback.

Invariant: each value is checked by the same parser that reads it where it is used; this module adds none.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from .errors import InvalidArgumentError

__all__ = ["KNOWN_VARIABLES", "check_environment", "known_variables", "unknown_variables"]

#: Every variable the core (or its test suite) reads, and what it sets; each backend spec adds its own
#: (``BackendSpec.environment``, see :func:`known_variables`).
KNOWN_VARIABLES: dict[str, str] = {
    "HISPARSE_HAL_BACKEND": "the backend get_backend() returns (a registered name)",
    "HISPARSE_HAL_CACHE_OPS": "the cache-ops implementation: triton, torch or host",
    "HISPARSE_HAL_EVENT_TIMEOUT_S": "the bound of IPC event waits, in seconds",
    "HISPARSE_HAL_PIN_CHUNK_BYTES": "the largest single host registration, in bytes",
    "HISPARSE_HAL_VLLM_BACKEND": "the hisparse-hal backend vLLM 0.34.0 must use: auto, cpu, cuda or rocm",
    "HISPARSE_HAL_VLLM_ROCM_ATTENTION_ROUTES_HISPARSE": "1: the ROCm sparse-MLA attention routes through HiSparse",
    "HISPARSE_HAL_DEBUG": "1 shows the traceback of a command's error",
    "HISPARSE_HAL_TRITON_SEQUENCES": "generated sequences the project's Triton tests run",
}
_SWITCH = ("", "on", "off", "1", "0", "true", "false", "yes", "no")


def _cache_ops(environ: Mapping[str, str]) -> None:
    from .cache_ops.selection import CACHE_OPS_ENV, IMPLEMENTATIONS
    from .settings import name_setting

    value = name_setting(CACHE_OPS_ENV, environ)
    if value and value not in IMPLEMENTATIONS:
        raise InvalidArgumentError(f"{CACHE_OPS_ENV} must be one of {list(IMPLEMENTATIONS)}, got "
                                   f"{environ[CACHE_OPS_ENV]!r}; unset it to choose by capability")


def _event_timeout(environ: Mapping[str, str]) -> None:
    from .settings import event_timeout_s

    event_timeout_s(environ)


def _pin_chunk(environ: Mapping[str, str]) -> None:
    from .host_registration import default_chunk_bytes

    default_chunk_bytes(environ)


def _backend_variables(environ: Mapping[str, str]) -> None:
    """Each registered backend's own variables, checked by its spec (``BackendSpec.check_environment``)."""
    from .probing import registered_specs

    for spec in registered_specs():
        if spec.check_environment is not None:
            spec.check_environment(environ)


def _vllm_backend(environ: Mapping[str, str]) -> None:
    from .integrations.vllm import requested_backend, rocm_override

    requested_backend(environ)
    rocm_override(environ)


def _switch(name: str) -> Callable[[Mapping[str, str]], None]:
    def check(environ: Mapping[str, str]) -> None:
        value = environ.get(name, "").strip().lower()
        if value not in _SWITCH:
            raise InvalidArgumentError(f"{name} must be one of {[v for v in _SWITCH if v]}, got {environ[name]!r}")
    return check


_CHECKS: tuple[Callable[[Mapping[str, str]], None], ...] = (
    _cache_ops, _event_timeout, _pin_chunk, _backend_variables,
    _vllm_backend, _switch("HISPARSE_HAL_DEBUG"),
)


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Check the value of every known ``HISPARSE_HAL_*`` variable that is set (``HISPARSE_HAL_BACKEND`` is checked
    by the registry, which knows the registered names).

    Raises:
        InvalidArgumentError: the first bad value, with the variable's name and what it accepts.
        BackendUnavailableError: ``HISPARSE_HAL_VLLM_BACKEND`` names no backend vLLM can use.
    """
    env = os.environ if environ is None else environ
    for check in _CHECKS:
        check(env)


def known_variables() -> dict[str, str]:
    """Every variable the package reads: :data:`KNOWN_VARIABLES` and each registered backend's
    ``BackendSpec.environment``, name -> what it sets."""
    from .probing import registered_specs

    known = dict(KNOWN_VARIABLES)
    for spec in registered_specs():
        known.update(spec.environment)
    return known


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """``HISPARSE_HAL_*`` variables that are set but that nothing reads (a typo, most likely)."""
    env = os.environ if environ is None else environ
    known = known_variables()
    return sorted(name for name in env if name.startswith("HISPARSE_HAL_") and name not in known)
