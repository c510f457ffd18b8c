"""vLLM 0.34.0 ``HiSparseBackend`` classes that run on hisparse-hal's backends, one per selection.

vLLM builds the class named by ``current_platform.get_hisparse_backend_cls()`` with no arguments, once per
process (``vllm/v1/hisparse/backend.py:131-140``); the instance here selects its hisparse-hal backend through
:func:`hisparse_hal.registry.get_backend` and forwards vLLM's 14 members to it. Importing this module imports
vLLM (it is only named by the plugin in :mod:`hisparse_hal.integrations.vllm`).
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import torch
from vllm.v1.hisparse.backend import HiSparseBackend as VllmHiSparseBackend

from hisparse_hal.backend import HiSparseBackend
from hisparse_hal.errors import UnsupportedCapabilityError
from hisparse_hal.registry import get_backend

__all__ = [
    "HalHiSparseBackend",
    "AutoHiSparseBackend",
    "CpuHiSparseBackend",
    "CudaHiSparseBackend",
    "RocmHiSparseBackend",
    "ADAPTERS",
]


class HalHiSparseBackend(VllmHiSparseBackend):
    """vLLM's ``HiSparseBackend`` contract on the hisparse-hal backend named ``hal_name`` (None: the
    registry's own choice, ``HISPARSE_HAL_BACKEND`` or the highest-priority available backend).

    Attributes:
        hal: the hisparse-hal backend every member forwards to.

    Raises (construction):
        BackendUnavailableError: the named backend is unknown or unavailable here (a ``RuntimeError``).
    """

    hal_name: ClassVar[str | None] = None

    def __init__(self) -> None:
        self.hal: HiSparseBackend = get_backend(self.hal_name)
        # GPU IPC events go to vLLM as the torch.cuda.Event they wrap (see create_ipc_event); ours stay here.
        self._events: dict[int, Any] = {}
        self._events_lock = threading.Lock()

    @property  # vLLM declares a class attribute; ours depends on the device
    def supports_shared_host_pool(self) -> bool:  # type: ignore[override, unused-ignore]
        """True only where vLLM's use of IPC events orders work across processes on this device.

        Non-writer ranks only ever call ``torch.accelerator.current_stream().wait_event(event)``
        (``kv_connector/v1/hisparse/worker.py:419``). On the CPU device that never reaches the event's
        ``wait`` (torch's CPU stream has no events), so the CPU device says False under vLLM; GPU backends
        say what their capability plan says (ROCm 7.2.x: False, IPC events break after 32 cycles, vLLM
        #57602).
        """
        return self.hal.device.type != "cpu" and self.hal.supports_shared_host_pool

    @property
    def stats_dtype(self) -> torch.dtype:  # type: ignore[override, unused-ignore]
        """The hisparse-hal backend's ``[hits, misses]`` counter dtype (``runtime.py:623``)."""
        return self.hal.stats_dtype

    def check_available(self) -> None:
        """Raises ``BackendUnavailableError`` (a ``RuntimeError``, ``runtime.py:557-562``) when unusable."""
        self.hal.check_available()

    def pin_tensor(self, tensor: torch.Tensor) -> None:
        """See :meth:`hisparse_hal.backend.HiSparseBackend.pin_tensor`."""
        self.hal.pin_tensor(tensor)

    def unpin_tensor(self, tensor: torch.Tensor) -> None:
        """See :meth:`hisparse_hal.backend.HiSparseBackend.unpin_tensor`; every failure is a ``RuntimeError``."""
        self.hal.unpin_tensor(tensor)

    def create_cache_ops(self, runtime: Any) -> Any:
        """The object whose four ``hisparse_*`` methods vLLM calls (``runtime.py:781``)."""
        return self.hal.create_cache_ops(runtime)

    def validate_kv_cache_config(self, kv_cache_config: Any) -> None:
        """See :meth:`hisparse_hal.backend.HiSparseBackend.validate_kv_cache_config`; also refuses a shared
        host pool where :attr:`supports_shared_host_pool` is False under vLLM.

        Raises:
            InvalidArgumentError, UnsupportedCapabilityError: naming the bad value.
        """
        if getattr(kv_cache_config, "hisparse_shared_host_pool", False) and not self.supports_shared_host_pool:
            raise UnsupportedCapabilityError(
                f"KV cache config asks for a shared HiSparse host pool, but hisparse-hal's {self.hal.name!r} "
                "backend does not provide one under vLLM (supports_shared_host_pool is False, which vLLM's planner "
                "reads at vllm/v1/hisparse/runtime.py:295); the config and the backend disagree"
            )
        self.hal.validate_kv_cache_config(kv_cache_config)

    def prepare_kv_cache_views(
        self, kv_cache_config: Any, kv_caches: dict[str, Any], forward_context: dict[str, Any]
    ) -> None:
        """See :meth:`hisparse_hal.backend.HiSparseBackend.prepare_kv_cache_views` (validated as above first)."""
        self.validate_kv_cache_config(kv_cache_config)
        self.hal.prepare_kv_cache_views(kv_cache_config, kv_caches, forward_context)

    def gather_resident_rows(self, source: torch.Tensor, destination: torch.Tensor, row_ids: torch.Tensor) -> None:
        """See :meth:`hisparse_hal.backend.HiSparseBackend.gather_resident_rows` (``-1`` reads row 0)."""
        self.hal.gather_resident_rows(source, destination, row_ids)

    def is_current_stream_capturing(self) -> bool:
        """See :meth:`hisparse_hal.backend.HiSparseBackend.is_current_stream_capturing`."""
        return self.hal.is_current_stream_capturing()

    def swap_blocks_batch(self, src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor) -> None:
        """See :meth:`hisparse_hal.backend.HiSparseBackend.swap_blocks_batch`."""
        self.hal.swap_blocks_batch(src, dst, sizes)

    def create_ipc_event(self) -> Any:
        """An event vLLM can ``record(stream)``, ``synchronize()`` and pass to ``torch.Stream.wait_event``.

        ``wait_event`` reads its argument as a ``torch.Event`` without a type check (torch/csrc/Stream.cpp,
        ``THPStream_wait_event``), so vLLM gets a torch event: the CPU device's events are ``torch.Event``
        subclasses; on a GPU it is the ``torch.cuda.Event`` our event wraps (what vLLM's own
        ``CUDAHiSparseBackend`` hands out, ``backend.py:109-110``), and ours is kept for ``export_event``.
        """
        event = self.hal.create_ipc_event()
        torch_event = getattr(event, "torch_event", None)
        if torch_event is None:
            return event
        with self._events_lock:
            self._events[id(torch_event)] = (torch_event, event)
        return torch_event

    def export_event(self, event: Any) -> Any:
        """Picklable bytes for :meth:`import_event` in another rank (``worker.py:178-179``).

        Raises:
            InvalidArgumentError: ``event`` did not come from this object's :meth:`create_ipc_event`.
        """
        with self._events_lock:
            kept = self._events.get(id(event))
        if kept is not None and kept[0] is event:
            return self.hal.export_event(kept[1])
        return self.hal.export_event(event)  # the CPU device's own events; the backend rejects anything else

    def import_event(self, device: torch.device, handle: Any) -> Any:
        """Open an event another rank exported, as a torch event (see :meth:`create_ipc_event`)."""
        event = self.hal.import_event(device, handle)
        return getattr(event, "torch_event", event)


class AutoHiSparseBackend(HalHiSparseBackend):
    """The registry's choice (``HISPARSE_HAL_BACKEND``, else the highest-priority available backend)."""

    hal_name = None


class CpuHiSparseBackend(HalHiSparseBackend):
    """hisparse-hal's CPU reference device."""

    hal_name = "cpu"


class CudaHiSparseBackend(HalHiSparseBackend):
    """hisparse-hal's CUDA backend (vLLM's own ``CUDAHiSparseBackend`` stays vLLM's default on NVIDIA)."""

    hal_name = "cuda"


class RocmHiSparseBackend(HalHiSparseBackend):
    """hisparse-hal's ROCm backend (vLLM 0.34.0 has none: ``RocmPlatform`` returns None)."""

    hal_name = "rocm"


#: hisparse-hal backend name (``"auto"``: the registry's choice) -> the class vLLM builds.
ADAPTERS: dict[str, type[HalHiSparseBackend]] = {
    "auto": AutoHiSparseBackend,
    "cpu": CpuHiSparseBackend,
    "cuda": CudaHiSparseBackend,
    "rocm": RocmHiSparseBackend,
}
