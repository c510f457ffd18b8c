"""vLLM 0.34.0 general plugin: decides what ``current_platform.get_hisparse_backend_cls()`` does, so that installing
hisparse-hal never makes vLLM's HiSparse less safe than vLLM alone.

Entry point ``vllm.general_plugins: hisparse_hal = hisparse_hal.integrations.vllm:register``; the rules are in
:func:`decide`, the report of ``hisparse-hal vllm-check`` in :func:`check`.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import importlib.util
import logging
import os
from collections.abc import Callable
from typing import Any, Literal

from hisparse_hal.errors import BackendUnavailableError, HalError, InvalidArgumentError, UnsupportedCapabilityError
from hisparse_hal.settings import name_setting

__all__ = [
    "BACKEND_ENV",
    "ROCM_ROUTES_ENV",
    "ENTRY_POINT",
    "VLLM_VERSION",
    "PluginStatus",
    "Decision",
    "adapter_qualname",
    "attention_routes_through_hisparse",
    "blockers",
    "check",
    "decide",
    "error_report",
    "register",
    "requested_backend",
    "rocm_override",
]

# Under vLLM's logger tree, so `vllm serve` prints these lines with its own (INFO by default).
logger = logging.getLogger("vllm.hisparse_hal")

#: Names a hisparse-hal backend vLLM must use (``cpu``, ``cuda``, ``rocm`` or ``auto``), also where vLLM has one.
BACKEND_ENV = "HISPARSE_HAL_VLLM_BACKEND"
#: ``1``: the operator vouches that this vLLM's ROCm sparse-MLA attention routes through HiSparse (a patched vLLM).
ROCM_ROUTES_ENV = "HISPARSE_HAL_VLLM_ROCM_ATTENTION_ROUTES_HISPARSE"
ENTRY_POINT = "hisparse_hal.integrations.vllm:register"
VLLM_VERSION = "0.34.0"
_GROUP = "vllm.general_plugins"
_ADAPTER_MODULE = "hisparse_hal.integrations.vllm_backend"
# Our names: the adapter class vLLM builds for each built-in backend (public qualnames, vllm_backend.ADAPTERS). A
# backend registered by another distribution is reached through "auto" and HISPARSE_HAL_BACKEND=<its name>.
_ADAPTER_CLASSES = {"auto": "AutoHiSparseBackend", "cpu": "CpuHiSparseBackend", "cuda": "CudaHiSparseBackend",
                    "rocm": "RocmHiSparseBackend"}
#: The module vLLM selects for sparse MLA on ROCm (vllm/platforms/rocm.py:543-544).
ROCM_ATTENTION_MODULE = "vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse"
ROCM_ATTENTION_FILE = "vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py"
# What vLLM's CUDA sparse-MLA attention uses to route through HiSparse (flashmla_sparse.py:36, :875, :911;
# flashinfer_mla_sparse_sm120.py:18, :136, :168): the HiSparse index group, its swap-in (the group's
# convert_logical_to_physical_topk calls HiSparse's swap_in, index_group.py:222-262) and a prefill staging
# entry point (index_group.py:264 stage_prefill_rows, :309 gather_fp8_prefill).
_HISPARSE_GROUP = "HiSparseMLAIndexGroup"
_SWAP_IN = "convert_logical_to_physical_topk"
_PREFILL_STAGING = ("stage_prefill_rows", "gather_fp8_prefill")
# The sparse-MLA base impl whose forward_mqa routes through HiSparse (sparse_mla_attention.py:683, :809).
_COMMON_IMPL = "SparseMLACommonImpl"
_FORWARD = "forward_mqa"
# Marks the platform class we patched and keeps its own entry (or _INHERITED) to restore it.
_ORIGINAL = "_hisparse_hal_original_backend_cls"
_INHERITED = "inherited"
_METHOD = "get_hisparse_backend_cls"
# The last decision per (setting, override, platform class) and the method it installed, so a repeated call logs
# nothing new.
_decided: dict[tuple[str | None, bool, type], tuple[PluginStatus, object]] = {}

State = Literal["selected", "refused", "vllm-backend", "vllm-refuses", "no-vllm", "unsupported-vllm", "error"]
# vLLM's vocabulary, not a backend name: its platform kinds, read through Platform.is_rocm/is_cuda/is_cpu/
# is_unspecified (vllm/platforms/interface.py:196-226, PlatformEnum at :71-78).
Kind = Literal["cuda", "rocm", "cpu", "none", "other"]


@dataclasses.dataclass(frozen=True)
class PluginStatus:
    """What the plugin did in this process.

    Attributes:
        state: ``selected`` (vLLM resolves one of our classes, and it builds here), ``refused`` (vLLM's class
            resolution raises our typed error), ``vllm-backend`` (vLLM's own class stays), ``vllm-refuses``
            (nothing changed: vLLM's own "does not support HiSparse" refusal stays), ``no-vllm``,
            ``unsupported-vllm`` (another vLLM version: nothing done), ``error`` (a bad setting; nothing done).
        reason: one sentence saying why.
        vllm_version: vLLM's version, None without vLLM.
        platform: vLLM's platform class name, None without vLLM.
        backend_cls: the qualname ``get_hisparse_backend_cls()`` now returns (None: none, or it raises).
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
        """vLLM resolves one of our backend classes, and that class can be built here."""
        return self.state == "selected"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields, ``active`` included."""
        return {**dataclasses.asdict(self), "blockers": list(self.blockers), "active": self.active}


@dataclasses.dataclass(frozen=True)
class Decision:
    """What :func:`register` makes ``get_hisparse_backend_cls()`` do: return ``target`` (a qualname), raise
    ``refusal``, or stay vLLM's own (both None)."""

    state: State
    reason: str
    target: str | None = None
    refusal: HalError | None = None


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


def requested_backend(environ: Any = None) -> str | None:
    """``HISPARSE_HAL_VLLM_BACKEND``, checked (None: unset or blank).

    Raises:
        BackendUnavailableError: it names no backend vLLM can use (see :func:`adapter_qualname`).
    """
    value = name_setting(BACKEND_ENV, environ)
    if value is not None:
        adapter_qualname(value)
    return value


def rocm_override(environ: Any = None) -> bool:
    """Whether ``HISPARSE_HAL_VLLM_ROCM_ATTENTION_ROUTES_HISPARSE`` is ``1`` (unset, blank or ``0``: no).

    Raises:
        InvalidArgumentError: any other value (named).
    """
    value = (os.environ if environ is None else environ).get(ROCM_ROUTES_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise InvalidArgumentError(f"{ROCM_ROUTES_ENV} must be 1 (this vLLM's ROCm sparse-MLA attention routes "
                                   f"through HiSparse) or 0, got {value!r}")
    return value == "1"


def attention_routes_through_hisparse(module: str = ROCM_ATTENTION_MODULE) -> bool:
    """Whether attention module ``module`` routes through HiSparse as vLLM's CUDA sparse-MLA paths do.

    Read from its source, without importing it (ROCm's needs aiter). It routes when it calls HiSparse itself
    (names ``HiSparseMLAIndexGroup``, its swap-in ``convert_logical_to_physical_topk`` and a prefill staging
    entry point, ``stage_prefill_rows`` or ``gather_fp8_prefill``: flashmla_sparse.py:36, :875, :911), or when an
    impl class of it keeps ``SparseMLACommonImpl.forward_mqa``, which does (sparse_mla_attention.py:809-935), by not
    overriding it or by calling ``super().forward_mqa``. Comments and strings do not count. False where the module
    is absent.
    """
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return False
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=spec.origin)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.name.rsplit(".", 1)[-1])
    explicit = {_HISPARSE_GROUP, _SWAP_IN} <= names and any(name in names for name in _PREFILL_STAGING)
    return explicit or any(_keeps_common_forward(node) for node in ast.walk(tree) if isinstance(node, ast.ClassDef))


def _keeps_common_forward(cls: ast.ClassDef) -> bool:
    """A ``SparseMLACommonImpl`` subclass whose ``forward_mqa`` is the common one, or calls it through super()."""
    bases = {ast.unparse(base.value if isinstance(base, ast.Subscript) else base) for base in cls.bases}
    if _COMMON_IMPL not in bases:
        return False
    forward = next((node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == _FORWARD), None)
    if forward is None:
        return True
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == _FORWARD
               and isinstance(node.func.value, ast.Call) and ast.unparse(node.func.value.func) == "super"
               for node in ast.walk(forward))


def _vllm_version() -> str | None:
    try:
        import vllm
    except ImportError:
        return None
    return str(getattr(vllm, "__version__", "unknown"))


def _platform_kind(platform: Any) -> Kind:
    """``rocm``, ``cuda``, ``cpu``, ``none`` (vLLM's ``UnspecifiedPlatform``: no device) or ``other``."""
    if platform.is_rocm():
        return "rocm"
    if platform.is_cuda():
        return "cuda"
    if platform.is_cpu():
        return "cpu"
    return "none" if platform.is_unspecified() else "other"


_NO_ATTENTION_PATH = (
    "no sparse-MLA attention of vLLM 0.34.0 on {name} routes through HiSparse (only the CUDA ones do, "
    "vllm/v1/attention/backends/mla/flashmla_sparse.py:875-913), so a model cannot run; HiSparse's runtime "
    "pieces run (as in tests)"
)
_HOST_ONLY = (
    "HiSparse allocates with pin_memory=True (vllm/v1/hisparse/runtime.py:625-627, "
    "kv_connector/v1/hisparse/worker.py:293-297) and uses torch.accelerator.current_stream() (runtime.py:820)"
)


def blockers(platform: Any) -> tuple[str, ...]:
    """What vLLM 0.34.0 itself refuses or gets wrong for HiSparse on ``platform``, whatever the backend, the one a
    user meets first listed first. Each entry names the vLLM file; none can be fixed from a ``HiSparseBackend``."""
    kind, name = _platform_kind(platform), type(platform).__name__
    if kind == "rocm":
        return (
            "vllm/v1/hisparse/runtime.py:662-663 applies the CUDA kernel's shared-memory formula to every "
            "'cuda'-typed device, ROCm included: large device_buffer_size/max_union_rows are refused there",
        )
    if kind == "cpu":
        return (
            "a sparse model's attention is refused by CpuPlatform.get_attn_backend_cls "
            "(vllm/platforms/cpu.py:154-155, 'Sparse Attention is not supported on CPU.')",
            "vLLM on an x86 CPU without Triton stops at vllm/platforms/cpu.py:242-243",
            _NO_ATTENTION_PATH.format(name=name), _HOST_ONLY,
        )
    if kind == "none":
        return (
            f"vLLM's {name} has no device type: its DeviceConfig stops at vllm/config/device.py:44-50 ('Failed "
            "to infer device type'); torch.device(current_platform.device_type) at "
            "vllm/v1/hisparse/runtime.py:1285-1288 fails the same way",
            _NO_ATTENTION_PATH.format(name=name), _HOST_ONLY,
        )
    if kind == "other":
        return (_NO_ATTENTION_PATH.format(name=name),)
    return ()


def _rocm_refusal(requested: str | None) -> UnsupportedCapabilityError:
    setting = f" ({BACKEND_ENV}={requested} does not lift it)" if requested else ""
    return UnsupportedCapabilityError(
        f"hisparse-hal refuses HiSparse on ROCm{setting}: vLLM's ROCm sparse-MLA attention, {ROCM_ATTENTION_FILE} "
        "(chosen at vllm/platforms/rocm.py:543-544), replaces SparseMLACommonImpl.forward_mqa with its own "
        "(:1156-1229), which never calls HiSparse's swap-in (HiSparseMLAIndexGroup.convert_logical_to_physical_topk) "
        "or prefill staging (stage_prefill_rows) as the CUDA paths do (sparse_mla_attention.py:809-935, "
        "flashmla_sparse.py:875-913), so it would read KV pages HiSparse left on the host: wrong output. "
        f"Lifted by a vLLM whose {ROCM_ATTENTION_FILE} routes through HiSparse (detected from its code), or by "
        f"{ROCM_ROUTES_ENV}=1 for a vLLM patched to do so"
    )


def _unbuildable(name: str) -> str | None:
    """Why hisparse-hal backend ``name`` (``auto``: the registry's choice) cannot be built here; None if it can."""
    from hisparse_hal.registry import select_backend

    try:
        select_backend(None if name == "auto" else name)
    except BackendUnavailableError as exc:
        return str(exc).split("\n", 1)[0]
    return None


def decide(
    kind: Kind,
    platform: str,
    vllm_choice: str | None,
    requested: str | None,
    rocm_routes: tuple[bool, str],
    unbuildable: Callable[[str], str | None] = _unbuildable,
) -> Decision:
    """The plugin's rules, from what it reads (pure apart from ``unbuildable``).

    1. ROCm, unless its sparse-MLA attention routes through HiSparse (``rocm_routes``): refused, whatever
       ``HISPARSE_HAL_VLLM_BACKEND`` says (vLLM alone refuses too, less precisely).
    2. Nothing requested: vLLM's own class stays (CUDA), or vLLM's own refusal (CPU, no device, other
       platforms without a sparse-attention path through HiSparse). ROCm that routes: hisparse-hal's ``rocm``.
    3. A named backend (or ROCm's ``rocm``) that cannot be built here: refused, one line naming the value.
    4. Otherwise selected.

    Args:
        kind, platform: vLLM's platform (see ``_platform_kind``) and its class name.
        vllm_choice: what vLLM's own method returns.
        requested: ``HISPARSE_HAL_VLLM_BACKEND`` (checked), None when unset.
        rocm_routes: whether ROCm's sparse-MLA attention routes through HiSparse, and how that was found.
        unbuildable: why a backend name cannot be built here (None: it can).
    """
    routes, how = rocm_routes
    if kind == "rocm" and not routes:
        return Decision("refused", f"{platform}: {how}; {ROCM_ATTENTION_FILE} does not route through HiSparse",
                        refusal=_rocm_refusal(requested))
    if requested is None and vllm_choice is not None:
        return Decision("vllm-backend", f"{platform} has vLLM's own {vllm_choice}; set {BACKEND_ENV} to use "
                        "hisparse-hal's")
    if requested is None and kind != "rocm":
        return Decision("vllm-refuses", f"{platform} has no sparse-attention path through HiSparse and "
                        f"{BACKEND_ENV} is unset, so vLLM's own refusal stays")
    name = requested or "rocm"  # vLLM's ROCm platform that routes: our backend of the same name (see _ADAPTER_CLASSES)
    why = f"{BACKEND_ENV}={requested}" if requested else f"{platform}: {how}"
    why_not = unbuildable(name)
    if why_not is not None:
        return Decision("refused", f"{why}, but that backend cannot be built here", refusal=BackendUnavailableError(
            f"hisparse-hal cannot build the HiSparse backend vLLM asked for ({why}): {why_not}"))
    if kind in ("cpu", "none", "other"):
        why += f"; a model cannot run on {platform} (see blockers), only HiSparse's runtime pieces"
    return Decision("selected", why, target=adapter_qualname(name))


def _original_entry(platform_cls: type) -> object:
    """The platform class's own ``get_hisparse_backend_cls`` entry before we patched it (or ``_INHERITED``)."""
    if _ORIGINAL in platform_cls.__dict__:
        return platform_cls.__dict__[_ORIGINAL]
    return platform_cls.__dict__.get(_METHOD, _INHERITED)


def _vllm_choice(platform_cls: type) -> str | None:
    """What vLLM's own platform method returns, also after we patched it (vllm/platforms/cuda.py:273-275)."""
    entry: Any = _original_entry(platform_cls)
    method: Callable[[], str | None]
    if entry is _INHERITED:
        method = getattr(super(platform_cls, platform_cls), _METHOD)  # the next class in the MRO (vLLM's base)
    else:
        method = entry.__get__(None, platform_cls)
    return method()


def _install(platform_cls: type, decision: Decision) -> object:
    """Make ``platform_cls.get_hisparse_backend_cls`` do what ``decision`` says; returns the installed entry."""
    original = _original_entry(platform_cls)
    if decision.target is None and decision.refusal is None:
        if original is _INHERITED:
            if _METHOD in platform_cls.__dict__:
                delattr(platform_cls, _METHOD)
        else:
            setattr(platform_cls, _METHOD, original)
        if _ORIGINAL in platform_cls.__dict__:
            delattr(platform_cls, _ORIGINAL)
        return platform_cls.__dict__.get(_METHOD)
    setattr(platform_cls, _ORIGINAL, original)
    target, refusal = decision.target, decision.refusal

    def get_hisparse_backend_cls(cls: type) -> str | None:
        if refusal is not None:
            raise refusal
        return target

    get_hisparse_backend_cls.__qualname__ = f"{platform_cls.__name__}.{_METHOD}"
    entry: classmethod[Any, Any, str | None] = classmethod(get_hisparse_backend_cls)
    setattr(platform_cls, _METHOD, entry)
    return entry


def _rocm_routes(override: bool) -> tuple[bool, str]:
    if override:
        return True, f"{ROCM_ROUTES_ENV}=1"
    if attention_routes_through_hisparse(ROCM_ATTENTION_MODULE):
        return True, f"the installed {ROCM_ATTENTION_FILE} routes through HiSparse"
    return False, f"the installed {ROCM_ATTENTION_FILE} never calls HiSparse's swap-in or prefill staging"


def register() -> PluginStatus:
    """vLLM's general-plugin hook: apply :func:`decide` to ``current_platform``'s class.

    Safe to call many times in a process (vLLM may): the same settings give the same patch and log nothing new.
    Logs the outcome at INFO (a refusal, or a selection where a model cannot run, at WARNING, with the blockers).

    Raises:
        BackendUnavailableError: ``HISPARSE_HAL_VLLM_BACKEND`` names no backend (before anything changes).
        InvalidArgumentError: ``HISPARSE_HAL_VLLM_ROCM_ATTENTION_ROUTES_HISPARSE`` is not 0 or 1.
    """
    version = _vllm_version()
    if version is None:
        return PluginStatus("no-vllm", "vllm does not import", None, None, None)
    requested, override = requested_backend(), rocm_override()  # bad settings fail first
    if version != VLLM_VERSION:
        status = PluginStatus("unsupported-vllm", f"hisparse-hal implements vLLM {VLLM_VERSION}'s HiSparse "
                              f"contract; vLLM {version} is installed, so nothing was changed", version, None, None)
        logger.warning("hisparse-hal: %s", status.reason)
        return status
    from vllm.platforms import current_platform

    platform_cls = type(current_platform)
    earlier = _decided.get((requested, override, platform_cls))
    if earlier is not None and platform_cls.__dict__.get(_METHOD) is earlier[1]:
        return earlier[0]
    kind = _platform_kind(current_platform)
    routes = _rocm_routes(override) if kind == "rocm" else (False, "not ROCm")
    decision = decide(kind, platform_cls.__name__, _vllm_choice(platform_cls), requested, routes)
    entry = _install(platform_cls, decision)
    backend_cls = decision.target if decision.refusal is None else None
    if decision.state == "vllm-backend":
        backend_cls = _vllm_choice(platform_cls)
    status = PluginStatus(decision.state, decision.reason, version, platform_cls.__name__, backend_cls,
                          blockers(current_platform))
    _log(status, decision)
    _decided[(requested, override, platform_cls)] = (status, entry)
    return status


def _log(status: PluginStatus, decision: Decision) -> None:
    if decision.refusal is not None:
        logger.warning("hisparse-hal: vLLM's HiSparse will be refused: %s", decision.refusal)
        return
    logger.info("hisparse-hal: %s: %s", status.state, status.reason)
    if status.state == "selected":
        for blocker in status.blockers:
            logger.warning("hisparse-hal: HiSparse cannot run correctly here, and no backend can fix it: %s", blocker)


def _entry_point_registered() -> bool:
    return any(ep.value == ENTRY_POINT for ep in importlib.metadata.entry_points(group=_GROUP))


def _cache_ops_owner(backend: Any) -> str:
    hal = getattr(backend, "hal", None)
    if hal is not None:
        return f"hisparse-hal {hal.name} backend, {hal.capabilities.cache_ops} implementation"
    return f"{type(backend).__module__}.{type(backend).__qualname__}.create_cache_ops"


def _device_mismatch(backend: Any, platform: Any) -> list[str]:
    """A hisparse-hal backend on another device than the one vLLM's platform allocates KV caches on."""
    hal = getattr(backend, "hal", None)
    if hal is None or not platform.device_type or hal.device.type == platform.device_type:
        return []
    return [f"hisparse-hal's {hal.name} backend works on {hal.device.type} tensors, but vLLM's "
            f"{type(platform).__name__} allocates KV caches on {platform.device_type!r} "
            "(vllm/v1/hisparse/runtime.py:1285-1288): its KV-cache views are refused"]


def _empty(version: str | None) -> dict[str, Any]:
    return {"vllm_installed": version is not None, "vllm_version": version,
            "entry_point_registered": _entry_point_registered(), "backend_cls": None, "backend_error": None,
            "cache_ops": None, "blockers": [], "hisparse_can_run": False, "error": None}


def error_report(exc: BaseException) -> dict[str, Any]:
    """The ``vllm-check`` report of a bad setting or another failure before vLLM's backend could be resolved."""
    version = _vllm_version()
    error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    status = PluginStatus("error", error, version, None, None)
    return {**_empty(version), "plugin": status.as_dict(), "error": error}


def check() -> dict[str, Any]:
    """Load general plugins as every vLLM process does, then report whether vLLM's HiSparse could start.

    Returns:
        A JSON-ready dict: ``vllm_installed``, ``vllm_version``, ``entry_point_registered``, ``plugin``
        (:class:`PluginStatus`), ``backend_cls`` (what vLLM resolves), ``backend_error`` (resolving, building
        or checking it), ``cache_ops`` (whose implementation runs), ``blockers``, ``hisparse_can_run`` and
        ``error`` (a bad setting: then the rest is empty).
    """
    version = _vllm_version()
    if version is None:
        return {**_empty(version), "plugin": register().as_dict(),
                "blockers": [f"vLLM is not installed in this Python: hisparse-hal implements vLLM {VLLM_VERSION}'s "
                             f"HiSparse contract (pip install --no-deps vllm=={VLLM_VERSION}; ci/vllm-tests.sh shows "
                             "the rest on a CPU machine)"]}
    try:
        from vllm.plugins import load_general_plugins

        load_general_plugins()  # runs our entry point where it is registered, as every vLLM process does
        status = register()  # idempotent: the status of that call (or of this one, where it was not run)
    except HalError as exc:
        return error_report(exc)
    report = {**_empty(version), "plugin": status.as_dict()}
    if status.state == "unsupported-vllm":
        return {**report, "blockers": [status.reason]}
    from vllm.platforms import current_platform
    from vllm.v1.hisparse.backend import get_hisparse_backend

    found = list(blockers(current_platform))
    backend_cls = owner = error = None
    try:
        backend_cls = current_platform.get_hisparse_backend_cls()
        backend = get_hisparse_backend()
        backend.check_available()
        owner = _cache_ops_owner(backend)
        found += _device_mismatch(backend, current_platform)
    except Exception as exc:  # noqa: BLE001 - reported: this is the question the check answers
        error = f"{type(exc).__name__}: {exc}".split("\n\n", 1)[0]
    return {**report, "backend_cls": backend_cls, "backend_error": error, "cache_ops": owner, "blockers": found,
            "hisparse_can_run": backend_cls is not None and error is None and not found}
