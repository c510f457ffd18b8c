"""Stand-in CUDA and ROCm vLLM platforms: vLLM's own cannot be imported without their drivers. They carry only what
the plugin and vLLM's HiSparse selector read: the platform enum, ``device_type`` and ``get_hisparse_backend_cls``
(``platforms/cuda.py:273-275``, ``platforms/interface.py:199-202``). The ``platform`` fixture of this folder's
conftest.py makes one of them vLLM's ``current_platform``.
"""

from __future__ import annotations

from vllm.platforms.interface import Platform, PlatformEnum

__all__ = ["CUDA_DEFAULT", "StandInCuda", "StandInRocm"]

CUDA_DEFAULT = "vllm.v1.hisparse.backend.CUDAHiSparseBackend"


class StandInCuda(Platform):
    """STAND-IN for vLLM's CudaPlatform (needs libcuda): its enum and its HiSparse backend (cuda.py:273-275)."""

    _enum = PlatformEnum.CUDA
    device_type = "cuda"

    @classmethod
    def get_hisparse_backend_cls(cls) -> str | None:
        return CUDA_DEFAULT


class StandInRocm(Platform):
    """STAND-IN for vLLM's RocmPlatform (needs a ROCm torch): its enum; no HiSparse backend (the base's None)."""

    _enum = PlatformEnum.ROCM
    device_type = "cuda"
