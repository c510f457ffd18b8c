"""The registry of ``device_global_indices`` tables, by address, that ``invalidate_written_slots`` resolves.

vLLM 0.34.0 passes invalidation one int64 tensor of table ``data_ptr()`` values, one per index-group leader
(``runtime.py:1067-1085``; design note §3.6). A portable implementation must turn those addresses back into
tables, so every table an op may be handed is registered here first.

Invariant: an address maps to at most one live table (the newest registered at that address); entries are weak,
so a freed table drops out and its address may be reused by a later registration. Registering the same tensor
twice, or a KV-sharing reader's alias of its owner's table, is a no-op. The registry is process-wide: addresses
are process-wide, and vLLM calls invalidation through the first leader's ops object only (§3.6), so any
backend's ops must see every backend's tables.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

from hisparse_hal.errors import InvalidArgumentError

__all__ = ["address_tensor", "register_table", "register_runtime_tables", "registered_tables", "table_at",
           "tables_version"]

_lock = threading.Lock()
_tables: dict[int, weakref.ref[torch.Tensor]] = {}
_version = 0
#: Device tensors of address lists (``address_tensor``), newest last; a few per process at most.
_address_tensors: dict[tuple[torch.device, tuple[int, ...]], torch.Tensor] = {}
_MAX_ADDRESS_TENSORS = 64


def register_table(table: torch.Tensor) -> None:
    """Make ``table`` resolvable by its ``data_ptr()`` in ``invalidate_written_slots``.

    Args:
        table: an int32 2-D ``[num_state_rows, region_stride]`` contiguous tensor (a ``device_global_indices``).

    Raises:
        InvalidArgumentError: ``table`` is not such a tensor.
    """
    global _version
    if not isinstance(table, torch.Tensor) or table.dtype != torch.int32 or table.dim() != 2 \
            or not table.is_contiguous():
        found = f"{table.dtype} {tuple(table.shape)}" if isinstance(table, torch.Tensor) else type(table).__name__
        raise InvalidArgumentError(
            f"device_global_indices table is {found}; expected a contiguous int32 [num_state_rows, region_stride] "
            "tensor"
        )
    with _lock:
        known = _tables.get(table.data_ptr())
        current = known() if known is not None else None
        if current is not None and current.shape == table.shape and current.device == table.device:
            return  # the same table, or an alias of it (a KV-sharing reader): idempotent
        _tables[table.data_ptr()] = weakref.ref(table)
        _version += 1


def register_runtime_tables(runtime: Any) -> int:
    """Register the tables a vLLM 0.34.0 ``HiSparseRuntime`` holds when ``create_cache_ops`` sees it.

    Reads ``runtime.index_group.device_global_indices`` (and ``runtime.device_global_indices`` for engines that
    keep it on the runtime) defensively: missing attributes or non-tensors are skipped (design note §2 B8).

    Returns:
        How many tensors were registered (0 when the runtime holds none yet).
    """
    found = 0
    for owner in (getattr(runtime, "index_group", None), runtime):
        table = getattr(owner, "device_global_indices", None) if owner is not None else None
        if isinstance(table, torch.Tensor) and table.dtype == torch.int32 and table.dim() == 2:
            register_table(table)
            found += 1
    return found


def table_at(address: int) -> torch.Tensor | None:
    """The live registered table at ``address``, or None."""
    with _lock:
        ref = _tables.get(address)
        table = ref() if ref is not None else None
        if ref is not None and table is None:
            del _tables[address]
        return table


def registered_tables() -> list[torch.Tensor]:
    """Every live registered table, in address order (drops dead entries)."""
    with _lock:
        live = []
        for address in sorted(_tables):
            table = _tables[address]()
            if table is None:
                del _tables[address]
            else:
                live.append(table)
        return live


def tables_version() -> int:
    """A number that changes whenever a registration changes the address -> table map."""
    return _version


def address_tensor(addresses: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``addresses`` as an int64 tensor on ``device`` (at least one element; 0 stands for "none"), built once
    per address list and device and then reused, so a later call copies nothing from the host (the first
    call's host-to-device copy is the only one, as vLLM's own pointer tensor is built once,
    ``runtime.py:1067-1076``)."""
    values = addresses or (0,)
    key = (torch.device(device), values)
    with _lock:
        cached = _address_tensors.get(key)
        if cached is None:
            if len(_address_tensors) >= _MAX_ADDRESS_TENSORS:
                _address_tensors.clear()
            if key[0].type == "meta":
                cached = torch.empty(len(values), dtype=torch.int64, device="meta")
            else:
                cached = torch.tensor(values, dtype=torch.int64).to(key[0])
            _address_tensors[key] = cached
        return cached
