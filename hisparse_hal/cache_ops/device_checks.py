"""Value checks that must stop an op before it writes: a typed error where values are free to read, a device-side
assertion where reading them would sync the host (and break graph capture).

Invariant: on the CPU device the condition is read and the typed error raised before the caller writes anything;
on a GPU ``torch._assert_async`` is enqueued on the current stream, ordered before every write the caller
enqueues after it, and the caller masks the offending work so no state is corrupted. This mirrors vLLM's
CUDA ``__trap()`` (``hisparse_kernels.cu:563-571``): the error surfaces at the next synchronization, and the
device context is then unusable, as after vLLM's trap.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hisparse_hal.errors import InvalidArgumentError

__all__ = ["refuse", "values_readable"]


def values_readable(device: torch.device) -> bool:
    """Whether reading a tensor's values on the host is free (no device sync): the CPU device."""
    return device.type == "cpu"


def refuse(bad: torch.Tensor, error: Callable[[int], InvalidArgumentError], message: str) -> None:
    """Stop the op if any element of ``bad`` (a bool tensor) is set.

    Args:
        bad: where the op must not proceed.
        error: builds the typed error from the flat index of the first set element (CPU device).
        message: the device-side assertion's message (GPU).

    Raises:
        InvalidArgumentError: (a subclass, from ``error``) on the CPU device when ``bad`` has a set element.
    """
    if bad.numel() == 0:
        return
    if values_readable(bad.device):
        flat = bad.reshape(-1)
        if bool(flat.any()):
            raise error(int(torch.argmax(flat.to(torch.int8))))
        return
    torch._assert_async(~bad.any(), message)
