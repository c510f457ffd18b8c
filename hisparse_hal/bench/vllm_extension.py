"""vLLM 0.34.0's own HiSparse kernels (``csrc/hisparse_kernels.cu`` from its sdist) built as a torch extension: the
GPU peer of :mod:`.kernel_peer`, registered as ``torch.ops.hisparse_vllm_peer.<op>`` with our schemas.

The sources are never committed: ``ci/prepare-vllm-peer.sh`` extracts them from the sdist and every file is
checked against ``ci/vllm_kernel_peer/SHA256SUMS`` before it is compiled. Needs a CUDA build of torch and nvcc.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

from hisparse_hal.cache_ops.library import SCHEMAS
from hisparse_hal.errors import InvalidArgumentError, UnsupportedCapabilityError

__all__ = ["NAMESPACE", "TORCH_TARGET_VERSION", "VllmKernelOps", "build", "check_sources"]

#: Where the peer's ops live: ``torch.ops.hisparse_vllm_peer.resolve_residency`` and the other three.
NAMESPACE = "hisparse_vllm_peer"
#: The stable-ABI floor vLLM 0.34.0 builds its ``_C_stable_libtorch`` with (CMakeLists.txt:1290-1295): torch 2.11.
TORCH_TARGET_VERSION = "0x020B000000000000ULL"

# The fragment defining the peer's schemas; kept module-global (dropping a Library deregisters its ops).
_library: torch.library.Library | None = None


def check_sources(sources: Path, sums: Path) -> list[Path]:
    """Check every file ``sums`` lists (``sha256sum`` format, paths relative to ``sources``).

    Returns:
        The checked files, in the order listed.

    Raises:
        InvalidArgumentError: ``sums`` is missing or lists nothing, or a listed file is missing or differs (the
            message names the file and both digests).
    """
    if not sums.is_file():
        raise InvalidArgumentError(f"checksum list {sums} does not exist")
    entries = [line.split(maxsplit=1) for line in sums.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not entries:
        raise InvalidArgumentError(f"checksum list {sums} lists no file")
    checked = []
    for digest, name in entries:
        path = sources / name.strip()
        if not path.is_file():
            raise InvalidArgumentError(f"{path} is missing (listed in {sums}); run ci/prepare-vllm-peer.sh")
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if actual != digest:
            raise InvalidArgumentError(f"{path} has sha256 {actual}, {sums} expects {digest}")
        checked.append(path)
    return checked


def _define_schemas() -> None:
    """Define the four ops of :data:`NAMESPACE` with vLLM 0.34.0's schemas (once per process)."""
    global _library
    if _library is not None:
        return
    library = torch.library.Library(NAMESPACE, "DEF")
    for name, arguments in SCHEMAS.items():
        library.define(name + arguments)
    _library = library


class VllmKernelOps:
    """The four ops of the built extension, called positionally as vLLM's runtime calls its own."""

    def _op(self, name: str) -> Any:
        return getattr(getattr(torch.ops, NAMESPACE), name)

    def resolve_residency(self, *args: Any) -> None:
        """vLLM's ``hisparse_resolve_residency`` (23 arguments; ``host_cache`` pinned CPU memory)."""
        self._op("resolve_residency")(*args)

    def gather_compact(self, *args: Any) -> None:
        """vLLM's ``hisparse_gather_compact`` (5 arguments)."""
        self._op("gather_compact")(*args)

    def gather_plan(self, *args: Any) -> None:
        """vLLM's ``hisparse_gather_plan`` (5 arguments)."""
        self._op("gather_plan")(*args)

    def invalidate_written_slots(self, *args: Any) -> None:
        """vLLM's ``hisparse_invalidate_written_slots`` (6 arguments)."""
        self._op("invalidate_written_slots")(*args)


def build(sources: Path, binding: Path, sums: Path, build_dir: Path, verbose: bool = False) -> VllmKernelOps:
    """Check the sources, then compile ``csrc/hisparse_kernels.cu`` with our ``binding`` and load it.

    Args:
        sources: the folder ``ci/prepare-vllm-peer.sh`` filled (``csrc/hisparse_kernels.cu`` and its headers).
        binding: ``ci/vllm_kernel_peer/binding.cpp`` (registers the launchers under :data:`NAMESPACE`).
        sums: ``ci/vllm_kernel_peer/SHA256SUMS``.
        build_dir: ninja's folder (reused by a second process: a finished build is not redone).
        verbose: print the compiler's command lines.

    Raises:
        UnsupportedCapabilityError: torch here has no CUDA device (nothing compiled).
        InvalidArgumentError: a source file is missing or differs from its checksum, or ``binding`` is missing.
    """
    if not torch.accelerator.is_available() or torch.version.cuda is None:
        raise UnsupportedCapabilityError(
            f"the vLLM kernel peer needs a CUDA device and a CUDA build of torch (torch {torch.__version__}, "
            f"cuda {torch.version.cuda}, devices {torch.accelerator.device_count() if torch.version.cuda else 0})"
        )
    check_sources(sources, sums)
    if not binding.is_file():
        raise InvalidArgumentError(f"binding source {binding} does not exist")
    from torch.utils.cpp_extension import load

    _define_schemas()
    build_dir.mkdir(parents=True, exist_ok=True)
    defines = ["-DUSE_CUDA", f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}"]
    load(
        name=NAMESPACE, sources=[str(binding), str(sources / "csrc" / "hisparse_kernels.cu")],
        extra_include_paths=[str(sources / "csrc")], extra_cflags=["-O3", *defines],
        extra_cuda_cflags=["-O3", *defines], build_directory=str(build_dir), is_python_module=False,
        verbose=verbose,
    )
    return VllmKernelOps()
