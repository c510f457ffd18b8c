"""A test guard that fails on every host read of a tensor value: what a CUDA/HIP graph capture cannot do.

Two modes: a ``TorchDispatchMode`` for aten ops that read a value (or have a data-dependent shape), and a
``TorchFunctionMode`` for Tensor methods such as ``.tolist()`` that hand a value to Python without reaching
the dispatcher. Shared by the cache-ops and gather tests.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


class HostSyncError(AssertionError):
    """An op read a device value on the host, which a graph capture cannot do."""


SYNCING_ATEN_OPS = frozenset({
    "aten._local_scalar_dense", "aten.item", "aten.is_nonzero", "aten.equal", "aten.allclose",
    "aten.nonzero", "aten.nonzero_numpy", "aten.argwhere", "aten.masked_select", "aten.masked_scatter",
    "aten.unique", "aten._unique", "aten._unique2", "aten.unique_dim", "aten.unique_consecutive",
    "aten.unique_dim_consecutive", "aten.bincount", "aten.histc",
})
SYNCING_TENSOR_METHODS = frozenset({
    "item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "__complex__",
})
_INDEXING_OPS = frozenset({"aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"})


class _NoHostSync(TorchDispatchMode):
    """Fails on every aten op that reads a tensor value back to the host (or has a data-dependent shape).

    Boolean-mask indexing is caught by its index dtype: its kernel calls ``nonzero`` below the Python key.
    Records the name of every op it lets through in ``seen``.
    """

    def __init__(self, seen: list[str]) -> None:
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func.overloadpacket)
        if name in SYNCING_ATEN_OPS:
            raise HostSyncError(f"{func} reads device values on the host")
        if name in _INDEXING_OPS:
            indices = args[1] if len(args) > 1 else ()
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
                raise HostSyncError(f"{func} with a boolean mask has a data-dependent shape")
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


class _NoHostReadback(TorchFunctionMode):
    """Fails on Tensor methods that hand a value to Python (``.tolist()`` never reaches the dispatcher)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if getattr(func, "__name__", "") in SYNCING_TENSOR_METHODS:
            raise HostSyncError(f"Tensor.{func.__name__} reads a device value on the host")
        return func(*args, **(kwargs or {}))


class no_host_sync:
    """Context manager: any host read of a tensor value inside raises :class:`HostSyncError`.

    ``with no_host_sync() as guard:`` gives the guard; ``guard.seen`` lists the aten ops that ran inside.
    """

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __enter__(self) -> no_host_sync:
        self._modes = (_NoHostReadback(), _NoHostSync(self.seen))
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
