"""The four cache ops as torch custom ops, ``torch.ops.hisparse_hal.*``, with vLLM 0.34.0's schemas
(:data:`.signatures.DEFAULT_VLLM`).

Invariant: each op is defined once per process (importing again is a no-op); a call runs the implementation
``selection.implementation_for`` chose for its tensors' device (``host_impl`` on CPU, Triton or torch on a GPU),
the same memoised choice a backend's ``capabilities.cache_ops`` reads; the fake kernels write nothing, so
fake-tensor tracing and ``torch.compile`` see only the mutations the schemas declare.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from . import selection
from .signatures import DEFAULT_VLLM, OP_NAMES, REGISTRY

__all__ = ["NAMESPACE", "OP_NAMES", "SCHEMAS", "VLLM_OP_NAMES", "kernel_device_types", "register"]

logger = logging.getLogger(__name__)

NAMESPACE = "hisparse_hal"

#: Op name -> argument list, as vLLM 0.34.0 registers it under torch.ops._C_cache_ops (no extensions), derived
#: once from :mod:`.vllm034` by :mod:`.signatures`. Invalidation's first argument is not ``Tensor!``: it writes
#: the tables it names through raw pointers, invisibly to torch's alias analysis, exactly as vLLM's op does.
SCHEMAS: dict[str, str] = REGISTRY.get(DEFAULT_VLLM).schemas
# Our op name -> the name vLLM 0.34.0 registers under torch.ops._C_cache_ops.
VLLM_OP_NAMES: dict[str, str] = {name: f"hisparse_{name}" for name in OP_NAMES}

# The fragment that owns our definitions. Kept module-global: dropping a Library deregisters its ops.
_library: torch.library.Library | None = globals().get("_library")


def _device_kernel(name: str) -> Callable[..., None]:
    """A dispatcher kernel that forwards to the chosen implementation for the tensors' device."""

    def kernel(*args: Any, **kwargs: Any) -> None:
        # The GPU when any tensor is on one: a CPU host cache may come with GPU index tensors.
        devices = [arg.device for arg in args if isinstance(arg, torch.Tensor)]
        device = next((d for d in devices if d.type != "cpu"), torch.device("cpu"))
        getattr(selection.implementation_for(device).module, name)(*args, **kwargs)

    kernel.__name__ = f"{name}_kernel"
    return kernel


def _fake_kernel(*args: Any, **kwargs: Any) -> None:
    """Fake/meta kernel: the ops return nothing and their writes are declared by the schema."""
    return None


def kernel_device_types() -> list[str]:
    """The device types the ops get a kernel for: ``cpu`` and this torch build's accelerator.

    The accelerator is ``torch.accelerator.current_accelerator()`` (torch 2.6; compile-time, no device context,
    does not poison fork): ``cuda`` on CUDA and ROCm builds, whatever type another vendor's build has.

    Returns:
        The device types, ``cpu`` first.
    """
    current = torch.accelerator.current_accelerator()
    found = [] if current is None else [current.type]
    return ["cpu", *(kind for kind in found if kind != "cpu")]


def _defined(name: str) -> bool:
    return hasattr(getattr(torch.ops, NAMESPACE), name)


def register() -> None:
    """Define ``torch.ops.hisparse_hal.{resolve_residency, gather_compact, gather_plan, invalidate_written_slots}``.

    Idempotent: calling it again, or importing this module again, changes nothing. Runs on import.
    """
    global _library
    if _library is not None:
        return
    if any(_defined(name) for name in OP_NAMES):
        logger.info("torch.ops.%s cache ops are already defined by another copy of this module", NAMESPACE)
        return
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    register_fake = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract  # torch < 2.4
    for name, arguments in SCHEMAS.items():
        library.define(name + arguments)
        torch.library.impl(f"{NAMESPACE}::{name}", kernel_device_types(), _device_kernel(name), lib=library)
        register_fake(f"{NAMESPACE}::{name}", _fake_kernel, lib=library)
    _library = library


register()
