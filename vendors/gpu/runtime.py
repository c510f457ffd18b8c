"""What the CUDA and ROCm runtime bindings share: the :class:`CopyRuntime` protocol the GPU backend calls,
and the descriptor handling both batch calls need (zero-byte copies left out, failing indices mapped back).

Nothing here loads a vendor library; each vendor's ``runtime.py`` implements the protocol over ctypes.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from hisparse_hal.errors import DeviceRuntimeError
from hisparse_hal.regions import SwapBatch

__all__ = ["CopyRuntime", "SIZE_MAX", "nonempty_descriptors", "descriptor_index"]

#: ``SIZE_MAX`` of a 64-bit ``size_t``: the "no failing index" value both batch calls leave in ``failIdx``.
SIZE_MAX = (1 << 64) - 1


@runtime_checkable
class CopyRuntime(Protocol):
    """A vendor runtime binding as the shared GPU layer uses it.

    Implemented by ``hisparse_hal.vendors.cuda.runtime.CudaDriver`` and
    ``hisparse_hal.vendors.rocm.runtime.HipRuntime``.
    Every method checks every return code and raises ``DeviceRuntimeError`` with the vendor's error
    name (and, for a batch, the failing descriptor index within the batch it was given).
    """

    #: Names the runtime in messages: ``"CUDA driver"``, ``"HIP runtime"``.
    label: str

    def has_batch_copy(self) -> bool:
        """Whether the vendor's batch-copy symbol was resolved."""
        ...

    def copy_batch(self, batch: SwapBatch, stream: int, *, use_attributes: bool) -> None:
        """Enqueue ``batch`` (at most the cap) with ONE vendor batch call on ``stream``.

        The descriptor tensors' memory is passed to the vendor directly (``data_ptr()``). With
        ``use_attributes`` device-to-host sources are read in stream order.
        """
        ...

    def copy_each(self, batch: SwapBatch, stream: int) -> None:
        """Enqueue ``batch`` one asynchronous copy per descriptor on ``stream``."""
        ...

    def register_host(self, address: int, size: int) -> int | None:
        """Page-lock and register ``[address, address + size)``; return its device alias, if any."""
        ...

    def unregister_host(self, address: int) -> None:
        """Release a registration made by :meth:`register_host` starting at ``address``."""
        ...

    def is_context_lost(self, error: DeviceRuntimeError) -> bool:
        """Whether ``error`` means the device context is gone (teardown then leaks instead of failing)."""
        ...



def nonempty_descriptors(batch: SwapBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(dst, src, sizes, positions)`` of ``batch`` without its zero-byte descriptors, vectorized.

    A zero-byte copy moves nothing, and vendor batch calls may reject it (cuMemcpyBatchAsync does,
    rapidsai/rmm #2509), so runtimes leave such descriptors out. ``positions`` maps each kept
    descriptor back to its index in ``batch`` for error messages; it is None when every one is kept.
    """
    if batch.size_range is not None and batch.size_range[0] > 0:
        return batch.dst, batch.src, batch.sizes, None  # the check's bounds already exclude zero sizes
    keep = batch.sizes != 0
    if bool(keep.all()):
        return batch.dst, batch.src, batch.sizes, None
    positions = keep.nonzero().squeeze(1)
    return batch.dst[positions], batch.src[positions], batch.sizes[positions], positions


def descriptor_index(kept: int, count: int, positions: torch.Tensor | None) -> int | None:
    """The index in the original batch of kept descriptor ``kept`` (see :func:`nonempty_descriptors`).

    Returns None when ``kept`` is not below ``count`` (a batch call that named no failing copy leaves
    ``SIZE_MAX``).
    """
    if not 0 <= kept < count:
        return None
    return int(positions[kept]) if positions is not None else kept
