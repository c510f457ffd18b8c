"""Host-side checks of the four cache ops' arguments (vLLM 0.34.0 schemas), shared by every implementation.

Each ``check_*`` takes an op's arguments in vLLM's positional order and returns one frozen bundle
(:class:`ResolveInputs`, :class:`GatherInputs`, :class:`InvalidateInputs`) that every implementation's phases
read, so a schema change is an edit here and in :mod:`.signatures`, not in every implementation.

Invariant: only metadata is read (type, dtype, device, shape, strides, Python ints, the table registry's
addresses), never tensor values, so a check never synchronizes with the device. A failed check raises
``InvalidArgumentError`` naming the argument, its value and what was expected, before anything is written.
"""

from __future__ import annotations

import dataclasses

import torch

from hisparse_hal.errors import InvalidArgumentError, ScalarRangeError

from . import tables as table_registry

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "MAX_HOT_SLOTS",
    "attention_stride_bound",
    "GatherInputs",
    "InvalidateInputs",
    "ResolveInputs",
    "check_gather_compact",
    "check_gather_plan",
    "check_invalidate_written_slots",
    "check_resolve_residency",
    "MAX_TABLES",
    "row_bytes",
]

#: Slots are int16 in ``lru_slots``, so a hot region holds at most 2**15 of them (vLLM 0.34.0 checks the same,
#: ``hisparse_kernels.cu:1014-1260``).
MAX_HOT_SLOTS = 1 << 15
#: Bounds of the scalars' arithmetic. Every integer scalar of the four ops is the schema's ``int``, an ``int64_t``
#: in the C++ op (``torch_bindings.cpp:1071-1101``, ``hisparse_kernels.cu:1022-1034, 952-953``); the resolve
#: kernel then narrows ``max_union_rows``, ``source_block_size`` and ``resident_block_size`` to ``int32_t``
#: (``hisparse_kernels.cu:1327-1331``) and computes rows and attention indices in ``int32_t``.
INT64_MAX = (1 << 63) - 1
INT32_MAX = (1 << 31) - 1
#: Why a scalar the call does not use is still bounded: it crosses the op boundary as an int64 size or stride.
_UNUSED = " (the schema's int64_t; sizes and strides are never negative)"
_ROW_ALIGN = 16
_I32 = torch.int32


def _fail(name: str, found: str, expected: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{name} is {found}; expected {expected}")


def _describe(tensor: torch.Tensor) -> str:
    return f"{tensor.dtype} {tuple(tensor.shape)} strides {tuple(tensor.stride())} on {tensor.device}"


def _required(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise _fail(name, f"{type(value).__name__} {value!r:.60}", "a torch.Tensor")
    return value


def _optional(name: str, value: object) -> torch.Tensor | None:
    if value is not None and not isinstance(value, torch.Tensor):
        raise _fail(name, f"{type(value).__name__} {value!r:.60}", "a torch.Tensor or None")
    return value


def _int(name: str, value: object, low: int = 0, high: int = INT64_MAX, why: str = _UNUSED) -> int:
    """``value`` as a Python int in ``[low, high]`` (bool, float, NaN and other types refused).

    Raises:
        InvalidArgumentError: not an int. ScalarRangeError: outside ``[low, high]`` (naming both bounds).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, f"{type(value).__name__} {value!r:.60}", "a Python int")
    if not low <= value <= high:
        raise ScalarRangeError(name, value, low, high, why)
    return value


def _dtype(name: str, tensor: torch.Tensor, dtype: torch.dtype) -> None:
    if tensor.dtype != dtype:
        raise _fail(name, _describe(tensor), f"dtype {dtype}; allocate it as {dtype} (vLLM 0.34.0 passes {dtype})")


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
    host = _required("host_cache", host_cache)
    _ndim("host_cache", host, 2)
    _contiguous("host_cache", host)
    row_bytes("host_cache", host)
    return host


def _rows_contiguous(name: str, cache: torch.Tensor) -> None:
    if cache.size(-1) > 1 and cache.stride(-1) != 1:
        raise _fail(name, _describe(cache), "contiguous rows (stride 1 in the last dimension)")
    if cache.dim() == 3 and cache.size(1) > 1 and cache.stride(1) != cache.size(2):
        raise _fail(name, _describe(cache), "rows of a block stored back to back (stride(1) == row width)")


def _hot_cache(hot_cache: object, device: torch.device) -> tuple[torch.Tensor, int]:
    hot = _required("hot_cache", hot_cache)
    if hot.dim() != 3:  # vLLM 0.34.0 dropped the 2-D staging form (hisparse_kernels.cu:1339-1403)
        raise _fail("hot_cache", _describe(hot), "a 3-D paged cache [num_blocks, block_size, row_width]")
    _device("hot_cache", hot, device)
    _rows_contiguous("hot_cache", hot)
    row_bytes("hot_cache", hot)
    block_size = hot.size(1)
    if block_size <= 0:
        raise _fail("hot_cache", _describe(hot), "a positive block size (dimension 1)")
    rows = hot.size(0) * block_size
    if rows >= INT32_MAX:  # vLLM: hot_rows < INT32_MAX (hisparse_kernels.cu:1097); physical rows are int32
        raise _fail("hot_cache", f"{rows} rows", f"fewer than {INT32_MAX} rows (physical rows are int32)")
    return hot, block_size


def _same_row_bytes(host: torch.Tensor, hot: torch.Tensor) -> None:
    if row_bytes("host_cache", host) != row_bytes("hot_cache", hot):
        raise _fail(
            "hot_cache", f"{row_bytes('hot_cache', hot)}-byte rows",
            f"the host cache's row size ({row_bytes('host_cache', host)} bytes); the ops copy whole rows",
        )


@dataclasses.dataclass(frozen=True)
class ResolveInputs:
    """``hisparse_resolve_residency``'s 23 arguments, checked, plus the geometry every phase needs.

    Field names and order are vLLM 0.34.0's schema (design note §3.1); the derived fields follow.
    """

    host_cache: torch.Tensor
    hot_cache: torch.Tensor
    hot_block_table: torch.Tensor
    global_indices: torch.Tensor
    hot_indices: torch.Tensor
    device_global_indices: torch.Tensor
    lru_slots: torch.Tensor
    request_state_indices: torch.Tensor | None
    region_stride: int
    max_union_rows: int
    stats: torch.Tensor | None
    attention_indices: torch.Tensor | None
    attention_block_stride: int
    request_ids: torch.Tensor | None
    source_block_table: torch.Tensor | None
    source_block_size: int
    valid_counts: torch.Tensor | None
    swap_host_physical_rows: torch.Tensor | None
    swap_device_physical_rows: torch.Tensor | None
    swap_counts: torch.Tensor | None
    resident_block_table: torch.Tensor | None
    resident_block_size: int
    num_valid_rows: torch.Tensor | None
    # derived geometry
    num_rows: int
    top_k: int
    host_rows: int
    block_size: int
    hot_size: int
    num_states: int
    device: torch.device

    @property
    def empty(self) -> bool:
        """No rows or no top-k columns: the op does nothing (``hisparse_kernels.cu:1014-1260``)."""
        return self.num_rows == 0 or self.top_k == 0

    @property
    def has_swaps(self) -> bool:
        """The three swap outputs are given (they are given together or not at all)."""
        return self.swap_counts is not None


@dataclasses.dataclass(frozen=True)
class GatherInputs:
    """``hisparse_gather_plan``'s or ``hisparse_gather_compact``'s 5 arguments, checked, with geometry.

    ``selector`` is ``miss_mask`` (plan: copy where nonzero) or ``miss_counts`` (compact: the first
    ``clamp(count, 0, columns)`` columns), as ``compact`` says.
    """

    host_cache: torch.Tensor
    hot_cache: torch.Tensor
    global_indices: torch.Tensor
    hot_indices: torch.Tensor
    selector: torch.Tensor
    compact: bool
    num_rows: int
    columns: int
    host_rows: int
    block_size: int
    hot_rows: int
    device: torch.device

    @property
    def empty(self) -> bool:
        return self.num_rows == 0 or self.columns == 0


@dataclasses.dataclass(frozen=True)
class InvalidateInputs:
    """``hisparse_invalidate_written_slots``'s 6 arguments, checked, with the candidate tables.

    ``tables`` are the registered tables (:mod:`.tables`) of shape ``[num_state_rows, region_stride]`` on the
    ops' device, in address order; ``addresses`` their ``data_ptr()`` values. Which of them the pointer tensor
    names is a value, resolved by each implementation (on the device where reading it would sync).
    """

    device_global_indices_ptrs: torch.Tensor
    request_state_indices: torch.Tensor
    req_id_per_token: torch.Tensor
    written_slots: torch.Tensor
    num_state_rows: int
    region_stride: int
    tables: tuple[torch.Tensor, ...]
    addresses: tuple[int, ...]
    device: torch.device

    @property
    def empty(self) -> bool:
        """Nothing to do: no group, no token, or empty tables."""
        return (self.device_global_indices_ptrs.numel() == 0 or self.written_slots.numel() == 0
                or self.num_state_rows == 0 or self.region_stride == 0)


def _vector(name: str, value: object, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    vector = _required(name, value)
    _vector_of(name, vector, dtype, device)
    return vector


def _optional_vector(name: str, value: object, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    vector = _optional(name, value)
    if vector is not None:
        _vector_of(name, vector, dtype, device)
    return vector


def _vector_of(name: str, vector: torch.Tensor, dtype: torch.dtype, device: torch.device) -> None:
    """A contiguous 1-D tensor of ``dtype`` on ``device``."""
    _dtype(name, vector, dtype)
    _ndim(name, vector, 1)
    _device(name, vector, device)
    _contiguous(name, vector)


def _check_topk(global_indices: object) -> torch.Tensor:
    """``global_indices``: int32 ``[rows, top_k]`` with unit last stride; its device is the ops' device."""
    topk = _required("global_indices", global_indices)
    _dtype("global_indices", topk, _I32)
    _ndim("global_indices", topk, 2)
    _unit_last_stride("global_indices", topk)
    return topk


def _check_state(device_global_indices: object, lru_slots: object, region_stride: object, top_k: int,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The persistent state: DGI int32 and LRU int16 ``[states, hot slots]``, ``top_k <= slots <= 2**15``."""
    dgi = _required("device_global_indices", device_global_indices)
    _int32_matrix("device_global_indices", dgi, device, None)
    _contiguous("device_global_indices", dgi)
    num_states, hot_size = dgi.shape
    lru = _required("lru_slots", lru_slots)
    _dtype("lru_slots", lru, torch.int16)
    _shape("lru_slots", lru, (num_states, hot_size))
    _device("lru_slots", lru, device)
    _contiguous("lru_slots", lru)
    if hot_size < top_k:
        raise _fail("lru_slots", f"{hot_size} slots per state row", f"at least top_k = {top_k} slots")
    if hot_size > MAX_HOT_SLOTS:
        raise _fail("lru_slots", f"{hot_size} slots per state row", f"at most {MAX_HOT_SLOTS} (slots are int16)")
    _int("region_stride", region_stride, hot_size, hot_size,
         " (it must equal device_global_indices.size(1), the hot slots per state row)")
    return dgi, lru


def _check_stats(stats: object, device: torch.device) -> torch.Tensor | None:
    """``stats``: ``[hits, misses]`` in vLLM's ``stats_dtype`` (uint64) or int64, or None."""
    counters = _optional("stats", stats)
    if counters is not None:
        if counters.dtype not in (torch.uint64, torch.int64):
            raise _fail("stats", _describe(counters), "dtype torch.uint64 (vLLM's stats_dtype) or torch.int64")
        _shape("stats", counters, (2,))
        _device("stats", counters, device)
        _contiguous("stats", counters)
    return counters


def attention_stride_bound(hot_blocks: int, block_size: int) -> int:
    """The largest ``attention_block_stride`` whose attention indices fit int32 for a hot cache of ``hot_blocks``
    blocks of ``block_size`` rows.

    The kernel writes ``block_div(row, block) * stride + block_mod(row, block)`` into the int32
    ``attention_indices`` (``hisparse_kernels.cu:188-199``); a hot row is below ``hot_blocks * block_size``, so
    the largest index is ``(hot_blocks - 1) * stride + block_size - 1``. One block: only the offset remains.
    Since ``hot_rows < 2**31`` (``hisparse_kernels.cu:1097``) the bound is never below ``block_size``.
    """
    if hot_blocks <= 1:
        return INT64_MAX
    return (INT32_MAX - (block_size - 1)) // (hot_blocks - 1)


def _check_attention(attention_indices: object, attention_block_stride: object, shape: tuple[int, int],
                     hot: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """``attention_indices`` (row-strided int32 like ``global_indices``) and its block stride: at least the hot
    block size (``hisparse_kernels.cu:1244``), at most :func:`attention_stride_bound`."""
    _int("attention_block_stride", attention_block_stride)
    attention = _optional("attention_indices", attention_indices)
    if attention is not None:
        _int32_matrix("attention_indices", attention, device, shape)
        _unit_last_stride("attention_indices", attention)
        blocks, block_size = hot.size(0), hot.size(1)
        _int("attention_block_stride", attention_block_stride, block_size, attention_stride_bound(blocks, block_size),
             f" when attention_indices is given: at least the hot block size {block_size}, and small enough that "
             f"the last of {blocks} hot blocks' attention indices fit int32 (hisparse_kernels.cu:188-199)")
    return attention


def _check_sources(request_ids: object, source_block_table: object, source_block_size: object, num_rows: int,
                   device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``request_ids`` and ``source_block_table``: both or neither; the table's block size when given."""
    requests = _optional("request_ids", request_ids)
    source = _optional("source_block_table", source_block_table)
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
        # int32 in the kernel: token / size, token % size and block * size + offset (hisparse_kernels.cu:217-238,
        # narrowed at 1329). Below 2**31 our int64 arithmetic (block * size + offset < 2**62) cannot wrap either.
        _int("source_block_size", source_block_size, 1, INT32_MAX,
             " when source_block_table is given (the kernel narrows it to int32, hisparse_kernels.cu:1329)")
    return requests, source


def _check_hot_table(hot_block_table: object, needed_rows: int, hot_size: int, block_size: int,
                     device: torch.device) -> torch.Tensor:
    """``hot_block_table``: a row per request row and enough columns for every hot slot."""
    table = _required("hot_block_table", hot_block_table)
    _int32_matrix("hot_block_table", table, device, None)
    _unit_last_stride("hot_block_table", table)
    if table.size(0) < needed_rows:
        raise _fail("hot_block_table", _describe(table), f"at least {needed_rows} rows (one per request row)")
    needed_cols = -(-hot_size // block_size)
    if table.size(1) < needed_cols:
        raise _fail("hot_block_table", _describe(table),
                    f"at least {needed_cols} columns (ceil({hot_size} slots / block size {block_size}))")
    return table


def _check_valid_counts(valid_counts: object, num_rows: int, device: torch.device) -> torch.Tensor | None:
    counts = _optional("valid_counts", valid_counts)
    if counts is not None:  # vLLM's own tests pass row-strided views here: any stride
        _dtype("valid_counts", counts, _I32)
        _shape("valid_counts", counts, (num_rows,))
        _device("valid_counts", counts, device)
    return counts


_SWAP_OUTPUTS = ("swap_host_physical_rows", "swap_device_physical_rows", "swap_counts")


def _check_swap_plan(outputs: tuple[object, object, object], shape: tuple[int, int],
                     device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The three swap-plan outputs: all or none; two flat ``[rows * top_k]`` plans (design note §3.3 step 4) and
    a count per row."""
    host_rows, device_rows, counts = (_optional(name, out) for name, out in zip(_SWAP_OUTPUTS, outputs, strict=True))
    given = (host_rows, device_rows, counts)
    present = [name for name, value in zip(_SWAP_OUTPUTS, given, strict=True) if value is not None]
    if present and len(present) != len(_SWAP_OUTPUTS):
        absent = [name for name in _SWAP_OUTPUTS if name not in present]
        raise _fail(absent[0], "None", f"a tensor because {present[0]} is given (pass all three swap outputs or none)")
    for name, plan in ((_SWAP_OUTPUTS[0], host_rows), (_SWAP_OUTPUTS[1], device_rows)):
        if plan is not None:
            _int32_matrix(name, plan, device, shape)
            _contiguous(name, plan)
    if counts is not None:
        _dtype("swap_counts", counts, _I32)
        _device("swap_counts", counts, device)
        _contiguous("swap_counts", counts)
        if counts.numel() < shape[0]:
            raise _fail("swap_counts", _describe(counts), f"at least {shape[0]} elements (one per row)")
    return host_rows, device_rows, counts


def _check_resident(resident_block_table: object, resident_block_size: object, has_source: bool, block_size: int,
                    device: torch.device) -> torch.Tensor | None:
    """``resident_block_table`` (read by state row) needs a source table and the hot block size."""
    _int("resident_block_size", resident_block_size)
    resident = _optional("resident_block_table", resident_block_table)
    if resident is not None:
        if not has_source:
            raise _fail("source_block_table", "None",
                        "a tensor: resident_block_table is given, and the resident lookup needs a source table")
        _int32_matrix("resident_block_table", resident, device, None)
        _unit_last_stride("resident_block_table", resident)
        _int("resident_block_size", resident_block_size, block_size, block_size,
             " (the hot block size, when resident_block_table is given; hisparse_kernels.cu:1159)")
    return resident


def _check_valid_rows(num_valid_rows: object, has_requests: bool, device: torch.device) -> torch.Tensor | None:
    """``num_valid_rows``: one int32 on the device (``query_start_loc[-1:]``); it masks ``request_ids``."""
    valid_rows = _optional("num_valid_rows", num_valid_rows)
    if valid_rows is not None:
        if not has_requests:
            raise _fail("request_ids", "None", "a tensor: num_valid_rows is given, and it masks request_ids")
        _dtype("num_valid_rows", valid_rows, _I32)
        if valid_rows.numel() != 1:
            raise _fail("num_valid_rows", _describe(valid_rows), "one int32 element (query_start_loc[-1:])")
        _device("num_valid_rows", valid_rows, device)
    return valid_rows


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
    stats: object = None,
    attention_indices: object = None,
    attention_block_stride: object = 0,
    request_ids: object = None,
    source_block_table: object = None,
    source_block_size: object = 0,
    valid_counts: object = None,
    swap_host_physical_rows: object = None,
    swap_device_physical_rows: object = None,
    swap_counts: object = None,
    resident_block_table: object = None,
    resident_block_size: object = 0,
    num_valid_rows: object = None,
) -> ResolveInputs:
    """Check ``resolve_residency``'s arguments as vLLM 0.34.0's op does (design note §3.2) and bundle them.

    The index tensors' device is ``global_indices.device``; every tensor but ``host_cache`` (read for its
    geometry only) must be on it. ``max_union_rows`` is range-checked only for a non-empty batch, as in
    vLLM's kernel. vLLM's shared-memory bound is not applied: no implementation here keeps the union in
    shared memory.

    Returns:
        The checked :class:`ResolveInputs`.

    Raises:
        InvalidArgumentError: naming the first bad argument, its value and what was expected.
    """
    topk = _check_topk(global_indices)
    device = topk.device
    num_rows, top_k = topk.shape
    host = _host_cache(host_cache)
    hot, block_size = _hot_cache(hot_cache, device)
    hot_out = _required("hot_indices", hot_indices)
    _int32_matrix("hot_indices", hot_out, device, (num_rows, top_k))
    _contiguous("hot_indices", hot_out)
    dgi, lru = _check_state(device_global_indices, lru_slots, region_stride, top_k, device)
    num_states, hot_size = dgi.shape
    states = _optional_vector("request_state_indices", request_state_indices, _I32, device)
    if states is None and num_states < num_rows:
        raise _fail("device_global_indices", f"{num_states} state rows",
                    f"at least {num_rows} (one per batch row) when request_state_indices is None")
    counters = _check_stats(stats, device)
    attention = _check_attention(attention_indices, attention_block_stride, (num_rows, top_k), hot, device)
    requests, source = _check_sources(request_ids, source_block_table, source_block_size, num_rows, device)
    needed_rows = source.size(0) if source is not None else num_rows
    table = _check_hot_table(hot_block_table, needed_rows, hot_size, block_size, device)
    counts = _check_valid_counts(valid_counts, num_rows, device)
    swap_plan = _check_swap_plan((swap_host_physical_rows, swap_device_physical_rows, swap_counts),
                                 (num_rows, top_k), device)
    resident = _check_resident(resident_block_table, resident_block_size, source is not None, block_size, device)
    valid_rows = _check_valid_rows(num_valid_rows, requests is not None, device)
    if num_rows and top_k:  # narrowed to int32 at hisparse_kernels.cu:1327; hot_size <= 2**15 keeps it exact
        _int("max_union_rows", max_union_rows, 1, hot_size,
             f" (1 to the {hot_size} hot slots, hisparse_kernels.cu:1254)")
    else:
        _int("max_union_rows", max_union_rows)
    assert isinstance(region_stride, int) and isinstance(max_union_rows, int)
    assert isinstance(attention_block_stride, int) and isinstance(source_block_size, int)
    assert isinstance(resident_block_size, int)
    return ResolveInputs(
        host, hot, table, topk, hot_out, dgi, lru, states, region_stride, max_union_rows, counters, attention,
        attention_block_stride, requests, source, source_block_size, counts, *swap_plan, resident,
        resident_block_size, valid_rows,
        num_rows=num_rows, top_k=top_k, host_rows=host.size(0), block_size=block_size, hot_size=hot_size,
        num_states=num_states, device=device,
    )


def _check_gather(
    host_cache: object, hot_cache: object, global_indices: object, hot_indices: object, selector: object,
    names: tuple[str, str, str], compact: bool,
) -> GatherInputs:
    """The two gathers' checks (``hisparse_kernels.cu:1339-1452``): a contiguous int32 ``[R, C]`` plan, a 2-D
    contiguous host cache on the plan's device and a 3-D hot cache with contiguous rows of the same bytes."""
    source_name, target_name, selector_name = names
    sources = _required(source_name, global_indices)
    device = sources.device
    _int32_matrix(source_name, sources, device, None)
    _contiguous(source_name, sources)
    host = _host_cache(host_cache)
    hot, block_size = _hot_cache(hot_cache, device)
    _device("host_cache", host, device)
    _same_row_bytes(host, hot)
    targets = _required(target_name, hot_indices)
    _int32_matrix(target_name, targets, device, tuple(sources.shape))
    _contiguous(target_name, targets)
    chosen = _required(selector_name, selector)
    if compact:
        _dtype(selector_name, chosen, _I32)
        _device(selector_name, chosen, device)
        _contiguous(selector_name, chosen)
        if chosen.numel() < sources.size(0):
            raise _fail(selector_name, _describe(chosen), f"at least {sources.size(0)} elements (one per plan row)")
    else:
        _int32_matrix(selector_name, chosen, device, tuple(sources.shape))
        _contiguous(selector_name, chosen)
    return GatherInputs(
        host, hot, sources, targets, chosen, compact, num_rows=sources.size(0), columns=sources.size(1),
        host_rows=host.size(0), block_size=block_size, hot_rows=hot.size(0) * block_size, device=device,
    )


def check_gather_compact(
    host_cache: object,
    hot_cache: object,
    miss_global_indices: object,
    miss_hot_indices: object,
    miss_counts: object,
) -> GatherInputs:
    """Check ``gather_compact``'s arguments (vLLM 0.34.0, ``hisparse_kernels.cu:1405-1452``) and bundle them.

    Raises:
        InvalidArgumentError: naming the first bad argument, its value and what was expected.
    """
    return _check_gather(host_cache, hot_cache, miss_global_indices, miss_hot_indices, miss_counts,
                         ("miss_global_indices", "miss_hot_indices", "miss_counts"), compact=True)


def check_gather_plan(
    host_cache: object,
    hot_cache: object,
    global_indices: object,
    hot_indices: object,
    miss_mask: object,
) -> GatherInputs:
    """Check ``gather_plan``'s arguments (vLLM 0.34.0, ``hisparse_kernels.cu:1339-1403``) and bundle them.

    Raises:
        InvalidArgumentError: naming the first bad argument, its value and what was expected.
    """
    return _check_gather(host_cache, hot_cache, global_indices, hot_indices, miss_mask,
                         ("global_indices", "hot_indices", "miss_mask"), compact=False)


#: Most tables one invalidation call may name (vLLM's grid bound, ``hisparse_kernels.cu:896-1012``).
MAX_TABLES = 65535


def check_invalidate_written_slots(
    device_global_indices_ptrs: object,
    request_state_indices: object,
    req_id_per_token: object,
    written_slots: object,
    num_state_rows: object,
    region_stride: object,
) -> InvalidateInputs:
    """Check ``invalidate_written_slots``'s arguments (design note §3.6) and bundle them with the candidate tables.

    Raises:
        InvalidArgumentError: naming the first bad argument, its value and what was expected.
    """
    pointers = _required("device_global_indices_ptrs", device_global_indices_ptrs)
    device = pointers.device
    _vector("device_global_indices_ptrs", pointers, torch.int64, device)
    if pointers.numel() > MAX_TABLES:
        raise _fail("device_global_indices_ptrs", _describe(pointers), f"at most {MAX_TABLES} table addresses")
    states = _vector("request_state_indices", request_state_indices, _I32, device)
    tokens = _vector("req_id_per_token", req_id_per_token, _I32, device)
    slots = _vector("written_slots", written_slots, torch.int64, device)
    if slots.numel() != tokens.numel():
        raise _fail("written_slots", _describe(slots),
                    f"{tokens.numel()} elements, one per entry of req_id_per_token")
    # int64_t in the kernel, compared with int32 state indices; ``state * region_stride`` < 2**46 (cu:902-916).
    rows = _int("num_state_rows", num_state_rows)
    width = _int("region_stride", region_stride, 0, MAX_HOT_SLOTS,
                 f" (a state row's hot slots; at most {MAX_HOT_SLOTS}, the int16 LRU slots' range)")
    candidates = tuple(t for t in table_registry.registered_tables()
                       if tuple(t.shape) == (rows, width) and t.device == device)
    return InvalidateInputs(pointers, states, tokens, slots, rows, width, candidates,
                            tuple(t.data_ptr() for t in candidates), device)
