"""Host-side checks of the four cache ops' arguments, shared by every implementation.

Invariant: only metadata is read (type, dtype, device, shape, strides, Python ints), never tensor values, so a
check never synchronizes with the device. A failed check raises ``InvalidArgumentError`` naming the argument,
its value and what was expected, before anything is written.
"""

from __future__ import annotations

import torch

from hisparse_hal.errors import InvalidArgumentError

__all__ = [
    "MAX_HOT_SLOTS",
    "check_gather_compact",
    "check_gather_plan",
    "check_invalidate_written_slots",
    "check_resolve_residency",
    "row_bytes",
]

#: Slots are int16 in ``lru_slots``, so a hot region holds at most 2**15 of them (vLLM 0.33.0 checks the same).
MAX_HOT_SLOTS = 1 << 15
_ROW_ALIGN = 16
_I32 = torch.int32


def _fail(name: str, found: str, expected: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{name} is {found}; expected {expected}")


def _describe(tensor: torch.Tensor) -> str:
    return f"{tensor.dtype} {tuple(tensor.shape)} strides {tuple(tensor.stride())} on {tensor.device}"


def _tensor(name: str, value: object, *, optional: bool = False) -> torch.Tensor | None:
    if value is None and optional:
        return None
    if not isinstance(value, torch.Tensor):
        expected = "a torch.Tensor or None" if optional else "a torch.Tensor"
        raise _fail(name, f"{type(value).__name__} {value!r:.60}", expected)
    return value


def _int(name: str, value: object, low: int | None = None, high: int | None = None, why: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, f"{type(value).__name__} {value!r:.60}", "a Python int")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"in [{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]"
        raise _fail(name, str(value), f"an int {bounds}{why}")
    return value


def _dtype(name: str, tensor: torch.Tensor, dtype: torch.dtype) -> None:
    if tensor.dtype != dtype:
        raise _fail(name, _describe(tensor), f"dtype {dtype}; allocate it as {dtype} (vLLM 0.33.0 passes {dtype})")


def _ndim(name: str, tensor: torch.Tensor, ndim: int) -> None:
    if tensor.dim() != ndim:
        raise _fail(name, _describe(tensor), f"a {ndim}-D tensor")


def _shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != shape:
        raise _fail(name, _describe(tensor), f"shape {shape}")


def _contiguous(name: str, tensor: torch.Tensor) -> None:
    if not tensor.is_contiguous():
        raise _fail(name, _describe(tensor), "a contiguous tensor; pass .contiguous()")


def _unit_last_stride(name: str, tensor: torch.Tensor) -> None:
    if tensor.size(-1) > 1 and tensor.stride(-1) != 1:
        raise _fail(name, _describe(tensor), "stride 1 in the last dimension (rows may be strided)")


def _device(name: str, tensor: torch.Tensor, device: torch.device) -> None:
    if tensor.device != device:
        raise _fail(name, _describe(tensor), f"a tensor on {device}, the device of the index tensors")


def _int32_matrix(name: str, tensor: torch.Tensor, device: torch.device, shape: tuple[int, ...] | None) -> None:
    _dtype(name, tensor, _I32)
    _ndim(name, tensor, 2)
    if shape is not None:
        _shape(name, tensor, shape)
    _device(name, tensor, device)


def row_bytes(name: str, cache: torch.Tensor) -> int:
    """Bytes of one row of ``cache`` (its last dimension), checked to be a multiple of 16.

    Raises:
        InvalidArgumentError: the row is empty or not a multiple of 16 bytes.
    """
    size = cache.size(-1) * cache.element_size() if cache.dim() else 0
    if size <= 0 or size % _ROW_ALIGN:
        raise _fail(name, _describe(cache), f"rows of a positive multiple of {_ROW_ALIGN} bytes (found {size} bytes)")
    return size


def _host_cache(host_cache: object) -> torch.Tensor:
    host = _tensor("host_cache", host_cache)
    assert host is not None
    _ndim("host_cache", host, 2)
    _contiguous("host_cache", host)
    row_bytes("host_cache", host)
    return host


def _rows_contiguous(name: str, cache: torch.Tensor) -> None:
    if cache.size(-1) > 1 and cache.stride(-1) != 1:
        raise _fail(name, _describe(cache), "contiguous rows (stride 1 in the last dimension)")
    if cache.dim() == 3 and cache.size(1) > 1 and cache.stride(1) != cache.size(2):
        raise _fail(name, _describe(cache), "rows of a block stored back to back (stride(1) == row width)")


def _hot_cache(hot_cache: object, device: torch.device, *, staging_allowed: bool) -> tuple[torch.Tensor, int]:
    hot = _tensor("hot_cache", hot_cache)
    assert hot is not None
    if hot.dim() != 3 and not (staging_allowed and hot.dim() == 2):
        expected = "a 3-D paged cache [blocks, block_size, row_width]"
        raise _fail("hot_cache", _describe(hot), expected + (" or a 2-D staging buffer" if staging_allowed else ""))
    _device("hot_cache", hot, device)
    _rows_contiguous("hot_cache", hot)
    row_bytes("hot_cache", hot)
    block_size = hot.size(1) if hot.dim() == 3 else 1
    if hot.dim() == 3 and block_size <= 0:
        raise _fail("hot_cache", _describe(hot), "a positive block size (dimension 1)")
    rows = hot.size(0) * block_size
    if rows >= 1 << 31:
        raise _fail("hot_cache", f"{rows} rows", "fewer than 2**31 rows (physical rows are int32)")
    return hot, block_size


def _same_row_bytes(host: torch.Tensor, hot: torch.Tensor) -> None:
    if row_bytes("host_cache", host) != row_bytes("hot_cache", hot):
        raise _fail(
            "hot_cache", f"{row_bytes('hot_cache', hot)}-byte rows",
            f"the host cache's row size ({row_bytes('host_cache', host)} bytes); the ops copy whole rows",
        )


def check_resolve_residency(
    host_cache: object,
    hot_cache: object,
    hot_block_table: object,
    global_indices: object,
    hot_indices: object,
    device_global_indices: object,
    lru_slots: object,
    request_state_indices: object,
    region_stride: object,
    max_union_rows: object,
    miss_mask: object,
    stats: object,
    attention_indices: object,
    attention_block_stride: object,
    request_ids: object,
    source_block_table: object,
    source_block_size: object,
    resolved_global_indices: object,
    valid_counts: object,
    swap_host_physical_rows: object,
    swap_device_physical_rows: object,
    swap_counts: object,
    resident_block_table: object,
    resident_block_size: object,
    resident_null_block: object,
    *,
    error_flags: object = None,
) -> None:
    """Check ``resolve_residency``'s arguments as vLLM 0.33.0's op does, plus ``error_flags``.

    The index tensors' device is ``global_indices.device``; every tensor but ``host_cache`` (read for its
    geometry only) must be on it. ``max_union_rows`` is not checked when the batch is empty (``N == 0`` or
    ``K == 0``), as in vLLM's kernel.

    Raises:
        InvalidArgumentError: naming the first bad argument, its value and what was expected.
    """
    topk = _tensor("global_indices", global_indices)
    assert topk is not None
    _dtype("global_indices", topk, _I32)
    _ndim("global_indices", topk, 2)
    _unit_last_stride("global_indices", topk)
    device = topk.device
    num_rows, top_k = topk.shape
    _host_cache(host_cache)
    _, block_size = _hot_cache(hot_cache, device, staging_allowed=False)

    hot_out = _tensor("hot_indices", hot_indices)
    assert hot_out is not None
    _int32_matrix("hot_indices", hot_out, device, (num_rows, top_k))
    _contiguous("hot_indices", hot_out)

    dgi = _tensor("device_global_indices", device_global_indices)
    assert dgi is not None
    _int32_matrix("device_global_indices", dgi, device, None)
    _contiguous("device_global_indices", dgi)
    num_states, hot_size = dgi.shape
    lru = _tensor("lru_slots", lru_slots)
    assert lru is not None
    _dtype("lru_slots", lru, torch.int16)
    _shape("lru_slots", lru, (num_states, hot_size))
    _device("lru_slots", lru, device)
    _contiguous("lru_slots", lru)
    if hot_size < top_k:
        raise _fail("lru_slots", f"{hot_size} slots per state row", f"at least top_k = {top_k} slots")
    if hot_size > MAX_HOT_SLOTS:
        raise _fail("lru_slots", f"{hot_size} slots per state row", f"at most {MAX_HOT_SLOTS} (slots are int16)")
    _int("region_stride", region_stride, hot_size, hot_size, " (it must equal lru_slots.size(1))")

    states = _tensor("request_state_indices", request_state_indices, optional=True)
    if states is not None:
        _dtype("request_state_indices", states, _I32)
        _ndim("request_state_indices", states, 1)
        _device("request_state_indices", states, device)
        _contiguous("request_state_indices", states)
    elif num_states < num_rows:
        raise _fail(
            "device_global_indices", f"{num_states} state rows",
            f"at least {num_rows} (one per batch row) when request_state_indices is None",
        )

    for name, value in (("miss_mask", miss_mask), ("resolved_global_indices", resolved_global_indices)):
        out = _tensor(name, value, optional=True)
        if out is not None:
            _int32_matrix(name, out, device, (num_rows, top_k))
            _contiguous(name, out)

    counters = _tensor("stats", stats, optional=True)
    if counters is not None:
        _dtype("stats", counters, torch.uint64)
        _shape("stats", counters, (2,))
        _device("stats", counters, device)
        _contiguous("stats", counters)

    _int("attention_block_stride", attention_block_stride)
    attention = _tensor("attention_indices", attention_indices, optional=True)
    if attention is not None:
        _int32_matrix("attention_indices", attention, device, (num_rows, top_k))
        _unit_last_stride("attention_indices", attention)
        _int("attention_block_stride", attention_block_stride, block_size, None,
             f" (at least the hot block size {block_size} when attention_indices is given)")

    requests = _tensor("request_ids", request_ids, optional=True)
    source = _tensor("source_block_table", source_block_table, optional=True)
    if (requests is None) != (source is None):
        given, missing = ("request_ids", "source_block_table") if source is None else ("source_block_table",
                                                                                        "request_ids")
        raise _fail(missing, "None", f"a tensor because {given} is given (pass both or neither)")
    _int("source_block_size", source_block_size)
    if requests is not None and source is not None:
        _dtype("request_ids", requests, _I32)
        _device("request_ids", requests, device)
        _contiguous("request_ids", requests)
        if requests.numel() < num_rows:
            raise _fail("request_ids", _describe(requests), f"at least {num_rows} elements (one per row)")
        _int32_matrix("source_block_table", source, device, None)
        _unit_last_stride("source_block_table", source)
        _int("source_block_size", source_block_size, 1, None, " when source_block_table is given")

    table = _tensor("hot_block_table", hot_block_table)
    assert table is not None
    _int32_matrix("hot_block_table", table, device, None)
    needed_rows = source.size(0) if source is not None else num_rows
    if table.size(0) < needed_rows:
        raise _fail("hot_block_table", _describe(table), f"at least {needed_rows} rows (one per request row)")
    needed_cols = -(-hot_size // block_size)
    if table.size(1) < needed_cols:
        raise _fail("hot_block_table", _describe(table),
                    f"at least {needed_cols} columns (ceil({hot_size} slots / block size {block_size}))")

    counts = _tensor("valid_counts", valid_counts, optional=True)
    if counts is not None:
        _dtype("valid_counts", counts, _I32)
        _shape("valid_counts", counts, (num_rows,))
        _device("valid_counts", counts, device)

    swaps = {
        "swap_host_physical_rows": _tensor("swap_host_physical_rows", swap_host_physical_rows, optional=True),
        "swap_device_physical_rows": _tensor("swap_device_physical_rows", swap_device_physical_rows, optional=True),
        "swap_counts": _tensor("swap_counts", swap_counts, optional=True),
    }
    present = [name for name, value in swaps.items() if value is not None]
    if present and len(present) != len(swaps):
        absent = [name for name in swaps if name not in present]
        raise _fail(absent[0], "None", f"a tensor because {present[0]} is given (pass all three swap outputs or none)")
    for name in ("swap_host_physical_rows", "swap_device_physical_rows"):
        out = swaps[name]
        if out is not None:
            _int32_matrix(name, out, device, (num_rows, top_k))
            _contiguous(name, out)
    swap_count = swaps["swap_counts"]
    if swap_count is not None:
        _dtype("swap_counts", swap_count, _I32)
        _device("swap_counts", swap_count, device)
        _contiguous("swap_counts", swap_count)
        if swap_count.numel() < num_rows:
            raise _fail("swap_counts", _describe(swap_count), f"at least {num_rows} elements (one per row)")

    _int("resident_block_size", resident_block_size)
    _int("resident_null_block", resident_null_block, 0, None)
    resident = _tensor("resident_block_table", resident_block_table, optional=True)
    if resident is not None:
        if requests is None:
            raise _fail("request_ids", "None", "a tensor: the resident lookup needs request_ids and source_block_table")
        _int32_matrix("resident_block_table", resident, device, None)
        _unit_last_stride("resident_block_table", resident)
        _int("resident_block_size", resident_block_size, block_size, block_size,
             " (the hot block size, when resident_block_table is given)")

    flags = _tensor("error_flags", error_flags, optional=True)
    if flags is not None:
        _dtype("error_flags", flags, _I32)
        _shape("error_flags", flags, (1,))
        _device("error_flags", flags, device)

    if num_rows and top_k:
        _int("max_union_rows", max_union_rows, 1, hot_size, f" (1 to the {hot_size} hot slots)")
    else:
        _int("max_union_rows", max_union_rows)


def _gather_sources_and_caches(
    name: str, plan: object, host_cache: object, hot_cache: object, staging_allowed: bool
) -> tuple[torch.Tensor, int]:
    """The two gathers' common checks: a contiguous int32 ``[R, C]`` plan of host rows, a host cache on its
    device and a hot cache with the same row bytes. Returns the plan and the hot cache's block size."""
    sources = _tensor(name, plan)
    assert sources is not None
    device = sources.device
    _int32_matrix(name, sources, device, None)
    _contiguous(name, sources)
    host = _host_cache(host_cache)
    hot, block_size = _hot_cache(hot_cache, device, staging_allowed=staging_allowed)
    _device("host_cache", host, device)
    _same_row_bytes(host, hot)
    return sources, block_size


def check_gather_compact(
    host_cache: object,
    hot_cache: object,
    miss_global_indices: object,
    miss_hot_indices: object,
    miss_counts: object,
) -> None:
    """Check ``gather_compact``'s arguments: 2-D host cache, 3-D hot cache of equal row bytes, int32 plan.

    Raises:
        InvalidArgumentError: naming the first bad argument, its value and what was expected.
    """
    sources, _ = _gather_sources_and_caches("miss_global_indices", miss_global_indices, host_cache, hot_cache,
                                            staging_allowed=False)
    device = sources.device
    targets = _tensor("miss_hot_indices", miss_hot_indices)
    assert targets is not None
    _int32_matrix("miss_hot_indices", targets, device, tuple(sources.shape))
    _contiguous("miss_hot_indices", targets)
    counts = _tensor("miss_counts", miss_counts)
    assert counts is not None
    _dtype("miss_counts", counts, _I32)
    _device("miss_counts", counts, device)
    _contiguous("miss_counts", counts)
    if counts.numel() < sources.size(0):
        raise _fail("miss_counts", _describe(counts), f"at least {sources.size(0)} elements (one per plan row)")


def check_gather_plan(
    host_cache: object,
    hot_cache: object,
    global_indices: object,
    hot_indices: object,
    miss_mask: object,
    request_state_indices: object,
    attention_indices: object,
    attention_block_stride: object,
) -> None:
    """Check ``gather_plan``'s arguments: a 2-D (staging) or 3-D (paged) hot cache, int32 ``[R, C]`` plans.

    Raises:
        InvalidArgumentError: naming the first bad argument, its value and what was expected.
    """
    sources, block_size = _gather_sources_and_caches("global_indices", global_indices, host_cache, hot_cache,
                                                     staging_allowed=True)
    device = sources.device
    for name, value in (("hot_indices", hot_indices), ("miss_mask", miss_mask)):
        plan = _tensor(name, value)
        assert plan is not None
        _int32_matrix(name, plan, device, tuple(sources.shape))
        _contiguous(name, plan)
    states = _tensor("request_state_indices", request_state_indices, optional=True)
    if states is not None:
        _dtype("request_state_indices", states, _I32)
        _device("request_state_indices", states, device)
        _contiguous("request_state_indices", states)
        if states.numel() < sources.size(0):
            raise _fail("request_state_indices", _describe(states),
                        f"at least {sources.size(0)} elements (it is indexed by plan row)")
    _int("attention_block_stride", attention_block_stride)
    attention = _tensor("attention_indices", attention_indices, optional=True)
    if attention is not None:
        _int32_matrix("attention_indices", attention, device, tuple(sources.shape))
        _contiguous("attention_indices", attention)
        _int("attention_block_stride", attention_block_stride, block_size, None,
             f" (at least the hot block size {block_size} when attention_indices is given)")


def check_invalidate_written_slots(
    device_global_indices: object,
    request_state_indices: object,
    req_id_per_token: object,
    written_slots: object,
) -> None:
    """Check ``invalidate_written_slots``'s arguments: int32 DGI and ids, int64 slots, one per token.

    Raises:
        InvalidArgumentError: naming the first bad argument, its value and what was expected.
    """
    dgi = _tensor("device_global_indices", device_global_indices)
    assert dgi is not None
    device = dgi.device
    _int32_matrix("device_global_indices", dgi, device, None)
    _contiguous("device_global_indices", dgi)
    vectors = {}
    for name, value, dtype in (
        ("request_state_indices", request_state_indices, _I32),
        ("req_id_per_token", req_id_per_token, _I32),
        ("written_slots", written_slots, torch.int64),
    ):
        vector = _tensor(name, value)
        assert vector is not None
        _dtype(name, vector, dtype)
        _ndim(name, vector, 1)
        _device(name, vector, device)
        _contiguous(name, vector)
        vectors[name] = vector
    tokens, slots = vectors["req_id_per_token"], vectors["written_slots"]
    if slots.numel() != tokens.numel():
        raise _fail("written_slots", _describe(slots),
                    f"{tokens.numel()} elements, one per entry of req_id_per_token")
