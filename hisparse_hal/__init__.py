"""hisparse-hal: the vendor-neutral device layer for HiSparse sparse-attention KV-cache offload.

Importing this package loads no vendor library and touches no device. ``get_backend()`` probes the
registered backends and constructs the chosen one; ``probe_backends()`` explains every choice.
"""

from __future__ import annotations

from .backend import CacheOps, HiSparseBackend
from .capabilities import KV_FORMATS, Capabilities
from .errors import (
    BackendUnavailableError,
    CaptureMisuseError,
    DeviceRuntimeError,
    EventTimeoutError,
    HalError,
    InvalidArgumentError,
    InvalidDescriptorError,
    PeerLostError,
    UnsupportedCapabilityError,
)
from .kv_cache import KVCacheConfig, LayerSpec
from .registry import (
    BackendSpec,
    Probe,
    ProbeResult,
    get_backend,
    probe_backends,
    reset_backend_cache,
    select_backend,
)

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "HiSparseBackend",
    "CacheOps",
    "Capabilities",
    "KV_FORMATS",
    "KVCacheConfig",
    "LayerSpec",
    "BackendSpec",
    "Probe",
    "ProbeResult",
    "get_backend",
    "probe_backends",
    "select_backend",
    "reset_backend_cache",
    "HalError",
    "BackendUnavailableError",
    "InvalidArgumentError",
    "InvalidDescriptorError",
    "UnsupportedCapabilityError",
    "CaptureMisuseError",
    "DeviceRuntimeError",
    "EventTimeoutError",
    "PeerLostError",
]
