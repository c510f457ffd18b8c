"""The four cache ops as torch custom ops, ``torch.ops.hisparse_hal.*``, with vLLM 0.34.0's schemas.

Invariant: each op is defined once per process (importing again is a no-op); a call runs the implementation
``selection.implementation_for`` chose for its tensors' device (``host_impl`` on CPU, Triton or torch on CUDA/HIP),
the same memoised choice a backend's ``capabilities.cache_ops`` reads; the fake kernels write nothing, so
fake-tensor tracing and ``torch.compile`` see only the mutations the schemas declare.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from . import selection

__all__ = ["NAMESPACE", "OP_NAMES", "SCHEMAS", "VLLM_OP_NAMES", "register"]

logger = logging.getLogger(__name__)

NAMESPACE = "hisparse_hal"

# Argument lists as vLLM 0.34.0 registers them under torch.ops._C_cache_ops (design note §3.1, from
# csrc/torch_bindings.cpp:1070-1114 of the 0.34.0 sdist; whitespace collapsed). No extensions.
SCHEMAS: dict[str, str] = {
    "resolve_residency": (
        "(Tensor host_cache, Tensor! hot_cache, Tensor hot_block_table, Tensor global_indices, "
        "Tensor! hot_indices, Tensor! device_global_indices, Tensor! lru_slots, Tensor? request_state_indices, "
        "int region_stride, int max_union_rows, Tensor(a!)? stats=None, Tensor(b!)? attention_indices=None, "
        "int attention_block_stride=0, Tensor? request_ids=None, Tensor? source_block_table=None, "
        "int source_block_size=0, Tensor(c!)? valid_counts=None, Tensor(d!)? swap_host_physical_rows=None, "
        "Tensor(e!)? swap_device_physical_rows=None, Tensor(f!)? swap_counts=None, "
        "Tensor? resident_block_table=None, int resident_block_size=0, Tensor? num_valid_rows=None) -> ()"
    ),
    "gather_compact": (
        "(Tensor host_cache, Tensor! hot_cache, Tensor miss_global_indices, Tensor miss_hot_indices, "
        "Tensor miss_counts) -> ()"
    ),
    "gather_plan": (
        "(Tensor host_cache, Tensor! hot_cache, Tensor global_indices, Tensor hot_indices, "
        "Tensor miss_mask) -> ()"
    ),
    # The tables named by address are written through raw pointers, invisibly to torch's alias analysis,
    # exactly as vLLM's op does (its first argument is not ``Tensor!``).
    "invalidate_written_slots": (
        "(Tensor device_global_indices_ptrs, Tensor request_state_indices, Tensor req_id_per_token, "
        "Tensor written_slots, int num_state_rows, int region_stride) -> ()"
    ),
}
OP_NAMES: tuple[str, ...] = tuple(SCHEMAS)
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
        library.impl(name, _device_kernel(name), "CPU")
        library.impl(name, _device_kernel(name), "CUDA")  # HIP builds of torch dispatch through CUDA too
        register_fake(f"{NAMESPACE}::{name}", _fake_kernel, lib=library)
    _library = library


register()
