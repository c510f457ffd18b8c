"""NVIDIA backend: NVML probe (``spec``), capability plan (``capabilities``), libcuda binding
(``runtime``: ``CudaDriver``) and ``CudaBackend`` (``backend``).

Importing this package loads no CUDA library and initialises nothing on a device; the driver binding
is imported only with the backend class, when ``cuda`` is chosen.
"""

from .capabilities import plan_capabilities

__all__ = ["plan_capabilities"]
