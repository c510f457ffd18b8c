"""vLLM 0.34.0 general plugin: makes ``current_platform.get_hisparse_backend_cls()`` name a hisparse-hal backend.

Entry point ``vllm.general_plugins: hisparse_hal = hisparse_hal.integrations.vllm:register``. vLLM runs it in
every process before it builds its config (``engine/arg_utils.py:936-938``, ``v1/engine/core.py:147-149``,
``v1/worker/worker_base.py:303-305``); HiSparse's only selector is that platform method
(``vllm/v1/hisparse/backend.py:131-135``, ``config/vllm.py:1812-1814``). Where vLLM has no backend (ROCm and
every platform returning None) ours is selected; on NVIDIA vLLM's ``CUDAHiSparseBackend`` stays, unless
``HISPARSE_HAL_VLLM_BACKEND`` names one of ours.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import os
from collections.abc import Callable
from typing import Any, Literal

from hisparse_hal.errors import BackendUnavailableError

__all__ = ["BACKEND_ENV", "ENTRY_POINT", "VLLM_VERSION", "PluginStatus", "check", "register", "blockers"]

# Under vLLM's logger tree, so `vllm serve` prints these lines with its own (INFO by default).
logger = logging.getLogger("vllm.hisparse_hal")

#: Names a hisparse-hal backend vLLM must use (``cpu``, ``cuda``, ``rocm`` or ``auto``), also where vLLM has one.
BACKEND_ENV = "HISPARSE_HAL_VLLM_BACKEND"
ENTRY_POINT = "hisparse_hal.integrations.vllm:register"
VLLM_VERSION = "0.34.0"
_GROUP = "vllm.general_plugins"
_ADAPTER_MODULE = "hisparse_hal.integrations.vllm_backend"
_ADAPTER_CLASSES = {"auto": "AutoHiSparseBackend", "cpu": "CpuHiSparseBackend", "cuda": "CudaHiSparseBackend",
                    "rocm": "RocmHiSparseBackend"}
# Marks the platform class we patched and keeps vLLM's own method (for a second call and for tests).
_ORIGINAL = "_hisparse_hal_original_backend_cls"
# The last decision in this process, keyed by what it was made from, so a repeated call logs nothing new.
_decided: dict[tuple[str | None, type], PluginStatus] = {}

State = Literal["selected", "vllm-backend", "no-vllm", "unsupported-vllm"]


@dataclasses.dataclass(frozen=True)
class PluginStatus:
    """What the plugin did in this process.

    Attributes:
        state: ``selected`` (vLLM resolves one of our classes), ``vllm-backend`` (vLLM's own class stays),
            ``no-vllm`` (vLLM does not import), ``unsupported-vllm`` (another vLLM version: nothing done).
        reason: one sentence saying why.
        vllm_version: vLLM's version, None without vLLM.
        platform: vLLM's platform class name, None without vLLM.
        backend_cls: the qualname ``get_hisparse_backend_cls()`` now returns (None: HiSparse unsupported).
        blockers: what still keeps HiSparse from running correctly here that no backend can fix.
    """

    state: State
    reason: str
    vllm_version: str | None
    platform: str | None
    backend_cls: str | None
    blockers: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        """vLLM resolves one of our backend classes."""
        return self.state == "selected"

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "blockers": list(self.blockers), "active": self.active}


def adapter_qualname(name: str) -> str:
    """The qualname vLLM resolves for hisparse-hal backend ``name`` (``auto``: the registry's choice).

    Raises:
        BackendUnavailableError: ``name`` is not ``auto`` nor a registered hisparse-hal backend (named).
    """
    if name not in _ADAPTER_CLASSES:
        from hisparse_hal.probing import discover_specs

        registered = sorted(spec.name for spec in discover_specs())
        raise BackendUnavailableError(
            f"{BACKEND_ENV}={name!r} names no hisparse-hal backend vLLM can use; use one of "
            f"{sorted(_ADAPTER_CLASSES)} (registered backends: {registered})"
        )
    return f"{_ADAPTER_MODULE}.{_ADAPTER_CLASSES[name]}"


def _vllm_version() -> str | None:
    try:
        import vllm
    except ImportError:
        return None
    return str(getattr(vllm, "__version__", "unknown"))


def _platform_kind(platform: Any) -> str:
    """``rocm``, ``cuda``, ``cpu`` or ``none`` (no device: vLLM's ``UnspecifiedPlatform``)."""
    if platform.is_rocm():
        return "rocm"
    if platform.is_cuda():
        return "cuda"
    return "cpu" if platform.is_cpu() else "none"


def blockers(platform: Any) -> tuple[str, ...]:
    """What vLLM 0.34.0 itself gets wrong or refuses for HiSparse on ``platform``, whatever the backend.

    Each entry names the vLLM file; none can be fixed from a ``HiSparseBackend`` (design note §4, §7 item 11).
    """
    kind = _platform_kind(platform)
    found: list[str] = []
    if kind == "rocm":
        found.append(
            "ROCm's sparse-MLA attention (ROCMAiterMLASparseImpl.forward_mqa, "
            "vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py:1156-1230) never calls HiSparse's swap_in "
            "or stage_prefill_rows, so it would attend to device pages HiSparse left on the host (wrong output)"
        )
        found.append(
            "vllm/v1/hisparse/runtime.py:662-663 applies the CUDA kernel's shared-memory formula to every "
            "'cuda'-typed device, ROCm included: large device_buffer_size/max_union_rows are refused there"
        )
    if kind in ("cpu", "none"):
        found.append(
            f"vLLM's {type(platform).__name__} has no accelerator: HiSparse allocates with pin_memory=True "
            "(vllm/v1/hisparse/runtime.py:625-627, kv_connector/v1/hisparse/worker.py:293-297), builds "
            "torch.device(current_platform.device_type) (runtime.py:1285-1288) and uses "
            "torch.accelerator.current_stream() (runtime.py:820), and no CPU sparse-MLA attention routes "
            "through HiSparse; its runtime pieces run (as in tests), a model does not"
        )
    return tuple(found)


def _patch(platform_cls: type, qualname: str) -> None:
    """Make ``platform_cls.get_hisparse_backend_cls()`` return ``qualname``, keeping vLLM's method once."""
    if _ORIGINAL not in platform_cls.__dict__:
        setattr(platform_cls, _ORIGINAL, platform_cls.get_hisparse_backend_cls)  # type: ignore[attr-defined]

    def get_hisparse_backend_cls(cls: type) -> str:
        return qualname

    get_hisparse_backend_cls.__qualname__ = f"{platform_cls.__name__}.get_hisparse_backend_cls"
    platform_cls.get_hisparse_backend_cls = classmethod(get_hisparse_backend_cls)  # type: ignore[attr-defined]


def _vllm_choice(platform: Any) -> str | None:
    """What vLLM's own platform method returns, also after we patched it (vllm/platforms/cuda.py:273-275)."""
    method: Callable[[], str | None] = getattr(type(platform), _ORIGINAL, platform.get_hisparse_backend_cls)
    return method()


def register() -> PluginStatus:
    """vLLM's general-plugin hook: select a hisparse-hal backend where vLLM should use one.

    Decides from ``HISPARSE_HAL_VLLM_BACKEND`` (a backend name or ``auto``) when set; otherwise only where
    vLLM's platform names no backend: ROCm gets ``rocm``, any other such platform the registry's choice.
    Safe to call many times in a process (vLLM may): the same environment gives the same patch. Logs, at
    WARNING, what vLLM itself still gets wrong on this platform (:func:`blockers`).

    Returns:
        What was done, also logged at INFO on ``vllm.hisparse_hal``.

    Raises:
        BackendUnavailableError: ``HISPARSE_HAL_VLLM_BACKEND`` names no backend (before anything changes).
    """
    version = _vllm_version()
    if version is None:
        return PluginStatus("no-vllm", "vllm does not import", None, None, None)
    requested = os.environ.get(BACKEND_ENV, "").strip() or None
    target = adapter_qualname(requested) if requested is not None else None  # rejects a bad name first
    if version != VLLM_VERSION:
        status = PluginStatus("unsupported-vllm", f"hisparse-hal implements vLLM {VLLM_VERSION}'s HiSparse "
                              f"contract; vLLM {version} is installed, so nothing was changed", version, None, None)
        logger.warning("hisparse-hal: %s", status.reason)
        return status
    from vllm.platforms import current_platform

    platform_cls = type(current_platform)
    earlier = _decided.get((requested, platform_cls))
    if earlier is not None and current_platform.get_hisparse_backend_cls() == earlier.backend_cls:
        return earlier
    found = blockers(current_platform)
    vllm_choice = _vllm_choice(current_platform)
    if target is None and vllm_choice is not None:
        status = PluginStatus("vllm-backend", f"{platform_cls.__name__} has vLLM's own {vllm_choice}; set "
                              f"{BACKEND_ENV} to use hisparse-hal's", version, platform_cls.__name__, vllm_choice,
                              found)
        logger.info("hisparse-hal: leaving HiSparse to vLLM: %s", status.reason)
        _decided[(requested, platform_cls)] = status
        return status
    if target is None:
        target = adapter_qualname("rocm" if _platform_kind(current_platform) == "rocm" else "auto")
        why = f"{platform_cls.__name__} has no HiSparse backend of its own"
    else:
        why = f"{BACKEND_ENV}={requested}"
    _patch(platform_cls, target)
    status = PluginStatus("selected", why, version, platform_cls.__name__, target, found)
    logger.info("hisparse-hal: vLLM's HiSparse backend is %s (%s)", target, why)
    for blocker in found:
        logger.warning("hisparse-hal: HiSparse cannot run correctly here, and no backend can fix it: %s", blocker)
    _decided[(requested, platform_cls)] = status
    return status


def _entry_point_registered() -> bool:
    return any(ep.value == ENTRY_POINT for ep in importlib.metadata.entry_points(group=_GROUP))


def _cache_ops_owner(backend: Any) -> str:
    hal = getattr(backend, "hal", None)
    if hal is not None:
        return f"hisparse-hal {hal.name} backend, {hal.capabilities.cache_ops} implementation"
    return f"{type(backend).__module__}.{type(backend).__qualname__}.create_cache_ops"


def check() -> dict[str, Any]:
    """Load general plugins as every vLLM process does, then report whether vLLM's HiSparse could start.

    Returns:
        A JSON-ready dict: ``vllm_installed``, ``vllm_version``, ``entry_point_registered``, ``plugin``
        (:class:`PluginStatus`), ``backend_cls`` (what vLLM resolves), ``backend_error`` (building or
        checking it), ``cache_ops`` (whose implementation runs), ``blockers`` and ``hisparse_can_run``.
    """
    version = _vllm_version()
    report: dict[str, Any] = {"vllm_installed": version is not None, "vllm_version": version,
                              "entry_point_registered": _entry_point_registered()}
    empty: dict[str, Any] = {"backend_cls": None, "backend_error": None, "cache_ops": None, "blockers": [],
             "hisparse_can_run": False}
    if version is None:
        return {**report, "plugin": register().as_dict(), **empty}
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # runs our entry point where it is registered, as every vLLM process does
    status = register()  # idempotent: the status of that call (or of this one, where it was not run)
    report["plugin"] = status.as_dict()
    if status.state == "unsupported-vllm":
        return {**report, **empty, "blockers": [status.reason]}
    from vllm.platforms import current_platform
    from vllm.v1.hisparse.backend import get_hisparse_backend

    backend_cls = current_platform.get_hisparse_backend_cls()
    found = list(blockers(current_platform))
    error = owner = None
    try:
        backend = get_hisparse_backend()
        backend.check_available()
        owner = _cache_ops_owner(backend)
    except Exception as exc:  # noqa: BLE001 - reported: this is the question the check answers
        error = f"{type(exc).__name__}: {exc}"
    return {**report, "backend_cls": backend_cls, "backend_error": error, "cache_ops": owner, "blockers": found,
            "hisparse_can_run": backend_cls is not None and error is None and not found}
