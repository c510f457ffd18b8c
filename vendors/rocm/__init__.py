"""The ROCm backend: AMD GPUs through torch's HIP build and the HIP runtime (``libamdhip64``).

Importing this package loads no vendor library and touches no device: it only re-exports the pure
capability planner. The probe lives in ``spec``, the ctypes binding in ``runtime`` (``HipRuntime``) and
the backend class in ``backend``; those load on use.
"""

from __future__ import annotations

from .capabilities import (
    MAX_BATCH_DESCRIPTORS,
    HipVersion,
    hip_version,
    parse_arch,
    plan_capabilities,
)

__all__ = ["plan_capabilities", "hip_version", "HipVersion", "parse_arch", "MAX_BATCH_DESCRIPTORS"]
