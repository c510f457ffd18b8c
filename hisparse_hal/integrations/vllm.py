"""vLLM general plugin: defines vLLM 0.33.0's four ``torch.ops._C_cache_ops.hisparse_*`` ops where vLLM has none.

Entry point ``vllm.general_plugins: hisparse_hal = hisparse_hal.integrations.vllm:register``. The ops forward to
``torch.ops.hisparse_hal.*`` (one implementation choice per device); vLLM's own compiled kernels always win.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import logging
import os
from collections.abc import Callable
from typing import Any, Literal

import torch

from hisparse_hal.cache_ops import library, selection

__all__ = ["DISABLE_ENV", "ENTRY_POINT", "NAMESPACE", "PluginStatus", "check", "register", "vllm_schema"]

# Under vLLM's logger tree, so `vllm serve` prints these lines with its own (INFO by default).
logger = logging.getLogger("vllm.hisparse_hal")

#: ``HISPARSE_HAL_VLLM_OPS=off`` (or ``0``/``false``/``no``) keeps the plugin from defining anything.
DISABLE_ENV = "HISPARSE_HAL_VLLM_OPS"
NAMESPACE = "_C_cache_ops"
ENTRY_POINT = "hisparse_hal.integrations.vllm:register"
_GROUP = "vllm.general_plugins"
# The refusal in vLLM 0.33.0's vllm/config/vllm.py (VllmConfig.__post_init__) for any platform but CUDA.
_CONFIG_GATE = "HiSparse currently requires NVIDIA CUDA"

State = Literal["defined", "vllm-kernels", "disabled", "no-vllm", "failed"]

# The fragment holding our _C_cache_ops definitions; module-global because dropping it deregisters them.
_library: torch.library.Library | None = globals().get("_library")
_defined_status: PluginStatus | None = globals().get("_defined_status")


@dataclasses.dataclass(frozen=True)
class PluginStatus:
    """What the plugin did (or would find) in this process.

    Attributes:
        state: ``defined`` (ours run), ``vllm-kernels`` (vLLM's compiled ops exist; ours left undefined),
            ``disabled`` (``HISPARSE_HAL_VLLM_OPS=off``), ``no-vllm`` (vLLM does not import), ``failed``.
        reason: one sentence saying why.
        vllm_version: vLLM's version, None without vLLM.
        owners: each ``_C_cache_ops`` op name -> ``hisparse-hal``, ``vllm`` (anyone else) or ``absent``.
        implementations: device -> the implementation our ops run there and why (empty unless ``defined``).
    """

    state: State
    reason: str
    vllm_version: str | None
    owners: dict[str, str]
    implementations: dict[str, str]

    @property
    def active(self) -> bool:
        """Our definitions are the ones vLLM calls."""
        return self.state == "defined"

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "active": self.active}


def vllm_schema(name: str) -> str:
    """vLLM 0.34.0's schema of op ``name`` (``resolve_residency``, ...): ours, which has no extras.

    Raises:
        KeyError: ``name`` is not one of the four ops.
    """
    arguments = library.SCHEMAS[name]
    if ", *," in arguments:
        arguments = arguments.split(", *,")[0] + ") -> ()"
    return library.VLLM_OP_NAMES[name] + arguments


def _disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").strip().lower() in ("off", "0", "false", "no")


def _vllm_version() -> str | None:
    try:
        import vllm
    except ImportError:
        return None
    return str(getattr(vllm, "__version__", "unknown"))


def _owner(op: str) -> str:
    """``hisparse-hal`` when this module's file registered ``_C_cache_ops::op``, ``vllm`` for anyone else."""
    if not hasattr(getattr(torch.ops, NAMESPACE), op):
        return "absent"
    dump = torch._C._dispatch_dump(f"{NAMESPACE}::{op}")
    return "hisparse-hal" if os.path.abspath(__file__) in dump else "vllm"


def _owners() -> dict[str, str]:
    return {op: _owner(op) for op in library.VLLM_OP_NAMES.values()}


def _implementations() -> dict[str, str]:
    """Per device, what ``torch.ops.hisparse_hal`` runs (the same ``selection`` its kernels use)."""
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    plan: dict[str, str] = {}
    for device in devices:
        try:
            choice, why = selection.choose_cache_ops(device)
            plan[str(device)] = f"{choice} ({why})"
        except Exception as exc:  # noqa: BLE001 - a bad HISPARSE_HAL_CACHE_OPS is reported, not raised here
            plan[str(device)] = f"error ({type(exc).__name__}: {exc})"
    return plan


def _load_vllm_kernels() -> str:
    """Have vLLM register its compiled ops first (``current_platform.import_kernels()``); returns the platform."""
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    return type(current_platform).__name__


def _forward(name: str) -> Callable[..., None]:
    target = getattr(getattr(torch.ops, library.NAMESPACE), name).default

    def kernel(*args: Any) -> None:
        target(*args)

    kernel.__name__ = f"{library.VLLM_OP_NAMES[name]}_to_hisparse_hal"
    return kernel


def _fake(*args: Any) -> None:
    return None


def _define() -> torch.library.Library:
    """All four ops or none: a failure drops the half-built fragment before re-raising."""
    fragment = torch.library.Library(NAMESPACE, "FRAGMENT")
    register_fake = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract  # torch < 2.4
    try:
        for name, op in library.VLLM_OP_NAMES.items():
            fragment.define(vllm_schema(name))
            fragment.impl(op, _forward(name), "CPU")
            fragment.impl(op, _forward(name), "CUDA")  # HIP builds of torch dispatch through CUDA too
            register_fake(f"{NAMESPACE}::{op}", _fake, lib=fragment)
    except Exception:
        fragment._destroy()
        raise
    return fragment


def register() -> PluginStatus:
    """vLLM's general-plugin hook: define the four HiSparse ops unless vLLM already has them.

    vLLM calls it in every process, maybe several times; a repeated call changes nothing. Order: vLLM's
    kernel extension is loaded first (``current_platform.import_kernels()``), so a compiled ``_C_cache_ops``
    library registers before we look and never collides with ours. If any of the four exists then, all four
    are left alone. Never raises: a failure is logged and reported as ``failed`` with nothing defined.

    Returns:
        What was done, also logged at INFO on ``vllm.hisparse_hal``.
    """
    global _library, _defined_status
    version = _vllm_version()
    if _library is not None and _defined_status is not None:
        logger.debug("hisparse-hal: _C_cache_ops.hisparse_* already defined in this process")
        return _defined_status
    if _disabled():
        status = PluginStatus("disabled", f"{DISABLE_ENV}={os.environ[DISABLE_ENV]}", version, _owners(), {})
        logger.info("hisparse-hal: not defining _C_cache_ops.hisparse_* (%s)", status.reason)
        return status
    if version is None:
        status = PluginStatus("no-vllm", "vllm does not import", None, _owners(), {})
        logger.debug("hisparse-hal: %s; nothing to do", status.reason)
        return status
    try:
        platform = _load_vllm_kernels()
    except Exception as exc:  # noqa: BLE001 - vLLM logs its own kernel import failures; we still decide
        platform = f"unknown ({type(exc).__name__}: {exc})"
    owners = _owners()
    present = sorted(op for op, owner in owners.items() if owner != "absent")
    if present and all(owners[op] == "hisparse-hal" for op in present):  # another copy of this module ran
        return PluginStatus("defined", "defined by hisparse-hal earlier in this process", version, owners,
                            _implementations())
    if present:
        status = PluginStatus("vllm-kernels", f"vLLM {version} on {platform} registered {', '.join(present)}; "
                              "vLLM's compiled kernels run", version, owners, {})
        logger.info("hisparse-hal: leaving _C_cache_ops alone: %s", status.reason)
        return status
    try:
        _library = _define()
    except Exception as exc:  # noqa: BLE001 - a plugin must not take vLLM's startup down with it
        logger.exception("hisparse-hal: defining _C_cache_ops.hisparse_* failed; none defined")
        return PluginStatus("failed", f"{type(exc).__name__}: {exc}", version, _owners(), {})
    implementations = _implementations()
    status = PluginStatus("defined", f"vLLM {version} on {platform} has no compiled HiSparse ops", version,
                          _owners(), implementations)
    _defined_status = status
    logger.info("hisparse-hal: defined _C_cache_ops.%s as forwards to torch.ops.%s (%s); per device: %s",
                ", ".join(library.VLLM_OP_NAMES.values()), library.NAMESPACE, status.reason,
                "; ".join(f"{device}: {impl}" for device, impl in implementations.items()))
    return status


def _entry_point_registered() -> bool:
    return any(ep.value == ENTRY_POINT for ep in importlib.metadata.entry_points(group=_GROUP))


def _config_refusal() -> str | None:
    """vLLM's config refusal for this platform, when its source still has the NVIDIA-only gate."""
    spec = importlib.util.find_spec("vllm.config.vllm")
    if spec is None or spec.origin is None:
        return None
    with open(spec.origin, encoding="utf-8") as source:
        gated = _CONFIG_GATE in source.read()
    from vllm.platforms import current_platform

    if gated and not current_platform.is_cuda():
        return f"vLLM's config refuses HiSparse on {type(current_platform).__name__}: {_CONFIG_GATE!r}"
    return None


def check() -> dict[str, Any]:
    """Load the plugin as vLLM would in this process and report whether vLLM's HiSparse could start.

    Returns:
        A JSON-ready dict: ``vllm_installed``, ``vllm_version``, ``entry_point_registered``, ``plugin`` (the
        :class:`PluginStatus`), ``hisparse_ops`` (vLLM's own ``_has_hisparse_ops()``), ``config_refusal``
        and ``hisparse_can_run``.
    """
    version = _vllm_version()
    report: dict[str, Any] = {"vllm_installed": version is not None, "vllm_version": version,
                              "entry_point_registered": _entry_point_registered()}
    if version is None:
        report["plugin"] = register().as_dict()
        return {**report, "hisparse_ops": False, "config_refusal": None, "hisparse_can_run": False}
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # runs our entry point where it is registered, as every vLLM process does
    report["plugin"] = register().as_dict()  # the status of that call (or of this one, where it was not)
    from vllm.v1.hisparse.runtime import _has_hisparse_ops

    has_ops = bool(_has_hisparse_ops())
    refusal = _config_refusal()
    return {**report, "hisparse_ops": has_ops, "config_refusal": refusal,
            "hisparse_can_run": has_ops and refusal is None}
