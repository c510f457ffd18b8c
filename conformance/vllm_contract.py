"""The suite's view of any class implementing vLLM 0.34.0's ``HiSparseBackend`` (``vllm/v1/hisparse/backend.py:20-79``).

Invariant: the class is resolved by qualname and called with no arguments once per process, as vLLM builds it
(``backend.py:131-140``); the view forwards exactly vLLM's 14 members, handing the config hooks vLLM's own
``KVCacheConfig`` (binding.py:139, 150; :func:`as_vllm_config`), and derives ``capabilities`` from what the class
exposes and from probing calls, never from hisparse-hal's own ``Capabilities`` of whatever the class wraps.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import types
from collections.abc import Iterator
from typing import Any

import torch

from hisparse_hal.capabilities import KV_FORMATS, Capabilities
from hisparse_hal.errors import InvalidArgumentError, UnsupportedCapabilityError

__all__ = ["VLLM_MEMBERS", "VLLM_OP_NAMES", "VllmOpNames", "VLLM_ATTRIBUTES", "VLLM_METHOD_PARAMETERS",
           "VllmContractView", "StreamEvent", "accelerator_device", "check_vllm_class", "load_vllm_class",
           "suite_runtime", "view_of", "as_vllm_config"]

VLLM_VERSION = "0.34.0"
#: vLLM 0.34.0's two class attributes (backend.py:21-22).
VLLM_ATTRIBUTES: tuple[str, ...] = ("supports_shared_host_pool", "stats_dtype")
#: vLLM 0.34.0's twelve methods and their parameter counts after ``self`` (backend.py:24-79, line of each ``def``).
VLLM_METHOD_PARAMETERS: dict[str, tuple[int, int]] = {
    "check_available": (0, 24),
    "pin_tensor": (1, 27),
    "unpin_tensor": (1, 30),
    "create_cache_ops": (1, 33),
    "validate_kv_cache_config": (1, 36),
    "prepare_kv_cache_views": (3, 39),
    "create_ipc_event": (0, 51),
    "export_event": (1, 55),
    "import_event": (2, 58),
    "gather_resident_rows": (3, 61),
    "is_current_stream_capturing": (0, 72),
    "swap_blocks_batch": (3, 75),
}
#: The 14 members vLLM 0.34.0's ``HiSparseBackend`` defines, in its order.
VLLM_MEMBERS: tuple[str, ...] = VLLM_ATTRIBUTES + tuple(VLLM_METHOD_PARAMETERS)


def _vllm_base() -> type:
    """vLLM's ``HiSparseBackend`` class.

    Raises:
        InvalidArgumentError: vLLM is not importable here, or another release than the contract's is installed
            (one line, naming the version the contract needs).
    """
    try:
        module = importlib.import_module("vllm.v1.hisparse.backend")
    except ImportError as exc:
        raise InvalidArgumentError(
            f"--vllm-backend needs vLLM {VLLM_VERSION} importable in this Python ({exc}); install vllm=={VLLM_VERSION} "
            "(ci/vllm-tests.sh shows how on a CPU machine)"
        ) from None
    import vllm

    installed = str(getattr(vllm, "__version__", "unknown"))
    if installed != VLLM_VERSION:  # the plugin's rule too (integrations/vllm.py: register)
        raise InvalidArgumentError(
            f"--vllm-backend tests vLLM {VLLM_VERSION}'s HiSparseBackend contract, but vLLM {installed} is installed "
            f"here (its members and op schemas may differ: 0.33 -> 0.34 changed three of the four schemas); install "
            f"vllm=={VLLM_VERSION} in this environment"
        )
    base: type = module.HiSparseBackend
    return base


def check_vllm_class(qualname: str) -> type:
    """Import the class ``"module:Class"`` names and check that it can be vLLM's backend.

    Raises:
        InvalidArgumentError: vLLM missing, a malformed or unimportable qualname, not a class, or a class lacking
            one of the 14 members (named).
    """
    from .qualnames import load_factory

    _vllm_base()
    target = load_factory(qualname, what="--vllm-backend")
    if not isinstance(target, type):
        raise InvalidArgumentError(
            f"--vllm-backend {qualname!r} is a {type(target).__name__}, not a class (vLLM calls the class with no "
            "arguments, vllm/v1/hisparse/backend.py:140)"
        )
    missing = [name for name in VLLM_MEMBERS if not hasattr(target, name)]
    if missing:
        raise InvalidArgumentError(
            f"--vllm-backend {qualname!r} lacks vLLM 0.34.0 HiSparseBackend member(s) {', '.join(missing)} "
            "(vllm/v1/hisparse/backend.py:20-79)"
        )
    return target


def load_vllm_class(qualname: str) -> type:
    """The checked class (see :func:`check_vllm_class`)."""
    return check_vllm_class(qualname)


@functools.cache
def view_of(qualname: str) -> VllmContractView:
    """The view of ``qualname``'s instance, built once per process (vLLM caches per qualname, backend.py:138-140)."""
    klass = load_vllm_class(qualname)
    return VllmContractView(qualname, klass())


def accelerator_device() -> torch.device:
    """``torch.accelerator.current_accelerator()`` with its current index where there is one, else the CPU."""
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if accelerator is None:
        return torch.device("cpu")
    return torch.device(accelerator.type, torch.accelerator.current_device_index())


def current_stream() -> Any:
    """The stream vLLM records and waits events on (``worker.py:172-183, 419``); None without an accelerator."""
    return torch.accelerator.current_stream() if torch.accelerator.is_available() else None


def suite_runtime(device: torch.device, row_width: int = 64, host_rows: int = 16) -> types.SimpleNamespace:
    """A stand-in for vLLM's ``HiSparseRuntime`` with the attributes set when ``create_cache_ops(runtime)`` is called
    (``runtime.py:781`` in ``bind_source_cache``; design note vllm-034-hisparse.md row B8).

    ``request_state_indices`` is not set: vLLM sets it later (``binding.py:158``).
    """
    blocks, block_size = 2, 4
    hot_backing = torch.zeros((blocks * block_size, row_width), dtype=torch.uint8, device=device)
    host = torch.zeros((host_rows, row_width), dtype=torch.uint8)
    index_group = types.SimpleNamespace(
        device_global_indices=torch.full((1, blocks * block_size), -1, dtype=torch.int32, device=device)
    )
    return types.SimpleNamespace(
        hot=hot_backing.view(blocks, block_size, row_width), hot_backing=hot_backing,
        hot_block_table=torch.arange(blocks, dtype=torch.int32, device=device).view(1, blocks),
        _host_cache=host, registered_host_pool=host, index_group=index_group, kv_dtype=torch.uint8,
        row_width=row_width, device=device, region_stride=blocks * block_size, max_union_rows=blocks * block_size,
    )


#: The four op names vLLM 0.34.0 calls on ``runtime.cache_ops`` (design note vllm-034-hisparse.md rows B9-B11, B16)
#: and the un-prefixed names the suite's sequence driver uses.
VLLM_OP_NAMES: dict[str, str] = {
    "resolve_residency": "hisparse_resolve_residency",
    "gather_compact": "hisparse_gather_compact",
    "gather_plan": "hisparse_gather_plan",
    "invalidate_written_slots": "hisparse_invalidate_written_slots",
}


class VllmOpNames:
    """An ops object seen through vLLM's four names only: ``resolve_residency(*args)`` calls
    ``ops.hisparse_resolve_residency(*args)``, positionally, as vLLM does."""

    def __init__(self, ops: Any) -> None:
        self.ops = ops

    def __getattr__(self, name: str) -> Any:
        if name not in VLLM_OP_NAMES:
            raise AttributeError(f"{name!r} is not one of vLLM 0.34.0's cache ops ({', '.join(VLLM_OP_NAMES)})")
        bound = getattr(self.ops, VLLM_OP_NAMES[name])

        def call(*args: Any) -> Any:
            return bound(*args)

        return call


class StreamEvent:
    """An IPC event used as vLLM uses it where there is an accelerator: recorded on, and waited for by,
    ``torch.accelerator.current_stream()`` (``worker.py:172-183, 419, 620``); everything else is the event's own."""

    def __init__(self, event: Any) -> None:
        self.event = event

    def record(self, stream: Any = None) -> None:
        self.event.record(stream if stream is not None else current_stream())

    def wait(self, stream: Any = None) -> None:
        (stream if stream is not None else current_stream()).wait_event(self.event)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.event, name)


def _own_event(event: Any) -> Any:
    """The instance's event behind a :class:`StreamEvent`."""
    return event.event if isinstance(event, StreamEvent) else event


class _CapturedGraph:
    """What :meth:`VllmContractView.capture` yields: ``replay()`` runs the captured work."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph

    def replay(self) -> None:
        self.graph.replay()


def as_vllm_config(config: Any) -> Any:
    """vLLM 0.34.0's ``KVCacheConfig`` for the suite's :class:`hisparse_hal.kv_cache.KVCacheConfig` (anything else as
    given): what vLLM hands the config hooks (binding.py:139, 150).

    One device-resident placement per layer (``KVCacheTensor`` at the layer's byte offset into the allocation
    ``kv_caches`` maps it to, kv_cache_interface.py:1510-1531) and one group of the layers, an ``MLAAttentionSpec`` of
    one head whose row is the suite's row (``fp8_ds_mla``: uint8 rows named by ``cache_dtype_str``).
    """
    from hisparse_hal.kv_cache import KV_FORMAT_SPECS, KVCacheConfig

    if not isinstance(config, KVCacheConfig) or config.format not in KV_FORMAT_SPECS:
        return config
    from vllm.v1.kv_cache_interface import KVCacheConfig as VllmKVCacheConfig
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, KVCacheTensor, MLAAttentionSpec

    spec = KV_FORMAT_SPECS[config.format]
    head = MLAAttentionSpec(block_size=config.block_size, num_kv_heads=1, head_size=config.row_width,
                            dtype=spec.dtype, cache_dtype_str=config.format if spec.fixed_row_bytes else None)
    tensors = [KVCacheTensor(size=layer.offset_bytes + config.layer_bytes, layers=[layer.name],
                             layer_stride=config.layer_bytes, block_stride=config.block_bytes,
                             offset=layer.offset_bytes)
               for layer in config.layers]
    groups = [KVCacheGroupSpec([layer.name for layer in config.layers], head)]
    return VllmKVCacheConfig(num_blocks=config.num_blocks, kv_cache_tensors=tensors, kv_cache_groups=groups)


class VllmContractView:
    """The backend under test as the suite's fixtures use it, for a vLLM-contract instance.

    Attributes:
        qualname: ``"module:Class"`` vLLM would be given.
        impl: the instance (built with no arguments).
        name: the qualname (what messages call the backend).
        device: :func:`accelerator_device`.
    """

    def __init__(self, qualname: str, impl: Any) -> None:
        self.qualname = qualname
        self.impl = impl
        self.name = qualname
        self.device = accelerator_device()
        self._capabilities: Capabilities | None = None
        self._runtimes: list[Any] = []

    # ------------------------------------------------------------------ vLLM's 14 members, forwarded
    @property
    def supports_shared_host_pool(self) -> Any:
        """The instance's ``supports_shared_host_pool`` (backend.py:21)."""
        return self.impl.supports_shared_host_pool

    @property
    def stats_dtype(self) -> Any:
        """The instance's ``stats_dtype`` (backend.py:22)."""
        return self.impl.stats_dtype

    def check_available(self) -> None:
        self.impl.check_available()

    def pin_tensor(self, tensor: torch.Tensor) -> None:
        self.impl.pin_tensor(tensor)

    def unpin_tensor(self, tensor: torch.Tensor) -> None:
        self.impl.unpin_tensor(tensor)

    def create_cache_ops(self, runtime: Any = None) -> Any:
        """The instance's ops for ``runtime``; None gives a :func:`suite_runtime` (kept alive with the view)."""
        if runtime is None:
            runtime = suite_runtime(self.device)
            self._runtimes.append(runtime)
        return self.impl.create_cache_ops(runtime)

    def validate_kv_cache_config(self, kv_cache_config: Any) -> None:
        """The instance's hook, given vLLM's ``KVCacheConfig`` for a suite config (:func:`as_vllm_config`)."""
        self.impl.validate_kv_cache_config(as_vllm_config(kv_cache_config))

    def prepare_kv_cache_views(self, kv_cache_config: Any, kv_caches: dict[str, Any],
                               forward_context: dict[str, Any]) -> None:
        """The instance's hook, given vLLM's ``KVCacheConfig`` for a suite config (:func:`as_vllm_config`)."""
        self.impl.prepare_kv_cache_views(as_vllm_config(kv_cache_config), kv_caches, forward_context)

    def create_ipc_event(self) -> Any:
        """The instance's event; where there is an accelerator, used on its current stream (:class:`StreamEvent`)."""
        return self._as_vllm_uses(self.impl.create_ipc_event())

    def export_event(self, event: Any) -> Any:
        return self.impl.export_event(_own_event(event))

    def import_event(self, device: torch.device, handle: Any) -> Any:
        return self._as_vllm_uses(self.impl.import_event(device, handle))

    def _as_vllm_uses(self, event: Any) -> Any:
        return StreamEvent(event) if self.device.type != "cpu" else event

    def gather_resident_rows(self, source: torch.Tensor, destination: torch.Tensor, row_ids: torch.Tensor) -> None:
        self.impl.gather_resident_rows(source, destination, row_ids)

    def is_current_stream_capturing(self) -> bool:
        result: bool = self.impl.is_current_stream_capturing()
        return result

    def swap_blocks_batch(self, src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor) -> None:
        self.impl.swap_blocks_batch(src, dst, sizes)

    # ------------------------------------------------------------------ what the suite derives
    @property
    def capabilities(self) -> Capabilities:
        """Derived once from the class and from probing calls (see :func:`derive_capabilities`)."""
        if self._capabilities is None:
            self._capabilities = derive_capabilities(self)
        return self._capabilities

    @contextlib.contextmanager
    def capture(self) -> Iterator[_CapturedGraph]:
        """Capture through torch's own graph API for the device, on a side stream, as vLLM captures.

        Raises:
            UnsupportedCapabilityError: the device has no torch graph capture (the CPU).
        """
        if not graph_capture_available(self.device):
            raise UnsupportedCapabilityError(
                f"graph capture: torch has no graph API for device {self.device} (the vLLM contract captures "
                "through torch.cuda.graph only)"
            )
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
            yield _CapturedGraph(graph)
        torch.cuda.current_stream(self.device).wait_stream(side)


def graph_capture_available(device: torch.device) -> bool:
    """Whether torch can capture graphs on ``device`` (its CUDA/HIP graph API)."""
    return device.type == "cuda" and torch.cuda.is_available()


def _overrides(klass: type, member: str) -> bool:
    """Whether ``klass`` defines ``member`` itself rather than inheriting vLLM's default."""
    try:
        base = _vllm_base()
    except InvalidArgumentError:
        return True
    return inspect.getattr_static(klass, member, None) is not inspect.getattr_static(base, member, None)


#: How long the child importer of the IPC probe may take (it imports torch, vLLM and the class).
IPC_PROBE_TIMEOUT_S = 180.0
#: Where a process that probed IPC events leaves the outcome for the processes it starts (xdist workers, IPC peers),
#: so that each probes at most once per run: ``{"qualname", "works", "why"}`` as JSON. Internal to the suite.
IPC_PROBE_MEMO = "_CONFORMANCE_VLLM_IPC_PROBE"

_IMPORTER = """
import pickle, sys
from hisparse_hal.conformance.vllm_contract import view_of
qualname, handle = pickle.load(sys.stdin.buffer)
view = view_of(qualname)
view.import_event(view.device, handle)
"""


def _import_elsewhere(qualname: str, handle: Any) -> str | None:
    """Import ``handle`` in a child process (an IPC event is imported by another process, as vLLM's ranks do,
    ``worker.py:172-183``); None when it worked, else why not."""
    import pickle
    import subprocess

    from hisparse_hal.python_child import python_command, python_environment

    try:
        payload = pickle.dumps((qualname, handle))
    except Exception as exc:  # noqa: BLE001 - an unpicklable handle cannot reach another rank
        return f"export_event's handle cannot be pickled: {type(exc).__name__}: {exc}"
    try:
        done = subprocess.run(python_command(code=_IMPORTER), input=payload, capture_output=True,
                              env=python_environment(), timeout=IPC_PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"import_event in another process gave no answer within {IPC_PROBE_TIMEOUT_S:.0f} s"
    if done.returncode != 0:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["(no output)"])[-1]
        return f"import_event in another process failed: {last}"
    return None


def _probe_ipc(view: VllmContractView) -> tuple[bool, str]:
    """Create and export one event here, import it in a child process; whether it all worked, and what failed.

    Once per run: the outcome is left in :data:`IPC_PROBE_MEMO` for the processes this one starts.
    """
    import json
    import os

    memo = json.loads(os.environ.get(IPC_PROBE_MEMO, "{}") or "{}")
    if memo.get("qualname") == view.qualname:
        return bool(memo["works"]), str(memo["why"])
    works, why = _probe_ipc_once(view)
    os.environ[IPC_PROBE_MEMO] = json.dumps({"qualname": view.qualname, "works": works, "why": why})
    return works, why


def _probe_ipc_once(view: VllmContractView) -> tuple[bool, str]:
    try:
        event = view.create_ipc_event()
        handle = view.export_event(event)
    except Exception as exc:  # noqa: BLE001 - any failure means no IPC events
        return False, f"{type(exc).__name__}: {exc}"
    failed = _import_elsewhere(view.qualname, handle)
    if failed is not None:
        return False, failed
    return True, "create_ipc_event and export_event worked here, import_event in a child process"


def _probe_kv_formats(view: VllmContractView) -> frozenset[str]:
    """The KV formats ``validate_kv_cache_config`` accepts."""
    from hisparse_hal.kv_cache import KV_FORMAT_SPECS, KVCacheConfig, LayerSpec

    accepted = set()
    for fmt in sorted(KV_FORMATS):
        width = KV_FORMAT_SPECS[fmt].fixed_row_bytes or 64
        try:
            view.validate_kv_cache_config(KVCacheConfig(fmt, 4, 4, width, (LayerSpec("layer.0"),)))
        except Exception:  # noqa: BLE001 - refused: not a format of this class
            continue
        accepted.add(fmt)
    return frozenset(accepted)


def derive_capabilities(view: VllmContractView) -> Capabilities:
    """``Capabilities`` of a vLLM-contract instance from its class attributes and from probing calls.

    ``shared_host_pool``/``stats_dtype``: the class's values; ``ipc_events``: an event could be created, exported
    and imported; ``graph_capture``: torch captures on the device; ``kv_formats``: what ``validate_kv_cache_config``
    accepts. What vLLM's contract does not expose gets the neutral value (``batch_copy`` "loop", no batch cap, no
    cycle limit, no host-pointer aliasing). ``versions`` records the class, vLLM's version and whether
    ``gather_resident_rows`` is vLLM's default (backend.py:61-70).
    """
    klass = type(view.impl)
    ipc, ipc_why = _probe_ipc(view)
    shared = view.supports_shared_host_pool
    stats = view.stats_dtype
    try:
        import vllm

        vllm_version = str(vllm.__version__)
    except ImportError:
        vllm_version = "not importable"
    gather = "overridden" if _overrides(klass, "gather_resident_rows") else "vllm default"
    return Capabilities(
        batch_copy="loop", max_batch_descriptors=None, ipc_events=ipc, ipc_event_max_cycles=None,
        shared_host_pool=shared if isinstance(shared, bool) else bool(shared),
        graph_capture=graph_capture_available(view.device), host_pointer_alias=False,
        kv_formats=_probe_kv_formats(view),
        stats_dtype=stats if isinstance(stats, torch.dtype) else torch.uint64,
        versions={"vllm": vllm_version, "class": view.qualname,
                  "gather_resident_rows": gather},
        reasons={"ipc_events": f"probed: {ipc_why}",
                 "graph_capture": f"torch graph API on {view.device}: {graph_capture_available(view.device)}",
                 "kv_formats": "probed with validate_kv_cache_config"},
    )
