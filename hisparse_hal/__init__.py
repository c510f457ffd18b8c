"""hisparse-hal: the vendor-neutral device layer for HiSparse sparse-attention KV-cache offload.

Importing this package loads no vendor library and touches no device; it defines the cache ops as
``torch.ops.hisparse_hal.*``. ``get_backend()`` probes the registered backends and constructs the chosen one;
``probe_backends()`` explains every choice.
"""

from __future__ import annotations

import importlib.util as _importlib_util

# The checkout's top-level vendors/ and conformance/ are these subpackages only through an install (pyproject's
# package-dir): imported straight from a checkout, this folder has neither. Say so here, not at a later import.
if _importlib_util.find_spec(f"{__name__}.vendors") is None:
    raise ImportError(f"{__name__} was imported from {__path__[0]}, a source checkout, without its vendors and "
                      "conformance subpackages (an install maps them in): run pip install -e . in the checkout, or "
                      "run from another directory where a plain install is found first (README)")

# Defines torch.ops.hisparse_hal.* (vLLM's four HiSparse cache ops) at import. Not deferred: it adds about
# 20 ms to the package's ~850 ms import, almost all of which is torch (python -X importtime, CPU torch 2.13).
from . import cache_ops
from .backend import HiSparseBackend
from .cache_ops.bound import CacheOps
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
    "cache_ops",
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
