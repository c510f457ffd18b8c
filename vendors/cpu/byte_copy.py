"""Moving the bytes of a validated swap batch on host memory, vectorized with torch.

Invariant: the result equals running the descriptors one after another, in order, each like memmove.
A batch without hazards (no destination overlapping another descriptor's source or destination) is
grouped by (source region, destination region, size). A group between two regions whose destinations
(or sources) tile one contiguous run moves in one pass, with one ``index_select`` into (or ``index_copy_``
from) that run; other groups go through a reused scratch buffer (``index_select`` then ``index_copy_``).
Batches with hazards, groups too small to vectorize, and large copies that form no run go through
``ctypes.memmove``, one call per descriptor.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading

import torch

from hisparse_hal.regions import Region, SwapBatch

from .runtime import memmove_each

__all__ = ["SwapMoveReport", "move_swap_batch", "region_bytes"]

#: Scratch bytes per gather/scatter round; one buffer per thread, reused (fresh memory costs page faults).
SCRATCH_BYTES = 4 << 20
#: Most row indices built per round (bounds index memory when pieces are small).
MAX_INDEX_ROWS = 1 << 19
#: Descriptors per step of the one-pass path's index work: 8,192 int64 stay below torch's intra-op
#: parallel grain (32,768 elements), so that work never wakes the thread pool.
INDEX_PIECE = 8192
#: Groups with fewer descriptors go through memmove: the vectorized setup costs about as much.
MIN_VECTOR_GROUP = 16
#: Descriptors this large that form no contiguous run go through memmove rather than the two-pass scratch
#: path: one pass, and the ~1 us per call is small next to the copy (hisparse-hal bench on the CPU device:
#: the gather-scatter path wins at 4 KiB, loses at 64 KiB).
LARGE_COPY_BYTES = 32 << 10

_scratch = threading.local()


@dataclasses.dataclass(frozen=True)
class SwapMoveReport:
    """How a batch was moved: descriptors moved vectorized, by memmove, and whether it had hazards.

    ``one_pass`` counts the vectorized descriptors that moved straight from source to destination (a
    contiguous run on one side), without the scratch buffer.
    """

    vectorized: int
    looped: int
    hazard: bool
    one_pass: int = 0


def region_bytes(region: Region) -> torch.Tensor:
    """A ``uint8`` tensor over the region's bytes (no copy, no ownership)."""
    buffer = (ctypes.c_uint8 * region.size).from_address(region.start)
    return torch.frombuffer(buffer, dtype=torch.uint8)


def move_swap_batch(batch: SwapBatch) -> SwapMoveReport:
    """Copy every descriptor of a validated batch.

    Args:
        batch: validated by :meth:`RegionTable.check_swap_batch`; every range lies in ``batch.regions``.

    Returns:
        A :class:`SwapMoveReport` saying which path moved how many descriptors.
    """
    src, dst, sizes = batch.src, batch.dst, batch.sizes
    src_region, dst_region = batch.src_region, batch.dst_region
    if batch.size_bounds()[0] <= 0:  # zero-byte descriptors move nothing: leave them out
        moving = sizes > 0
        src, dst, sizes = src[moving], dst[moving], sizes[moving]
        src_region, dst_region = src_region[moving], dst_region[moving]
    if sizes.numel() == 0:
        return SwapMoveReport(0, 0, False)
    tiled = _move_tiled_batch(batch, src, dst, sizes, src_region, dst_region)
    if tiled is not None:
        return tiled
    if _has_hazard(src, dst, sizes, src_region, dst_region, len(batch.regions)):
        memmove_each(src, dst, sizes)
        return SwapMoveReport(0, int(sizes.numel()), True)

    groups, rest = _plan_groups(sizes, src_region, dst_region, len(batch.regions))
    vectorized = one_pass = 0
    leftovers = [] if rest is None else [rest]
    for s_index, d_index, size, members in groups:
        s_reg, d_reg = batch.regions[s_index], batch.regions[d_index]
        s_off = (src if members is None else src[members]) - s_reg.start
        d_off = (dst if members is None else dst[members]) - d_reg.start
        how = _move_group(s_reg, d_reg, s_off, d_off, size)
        if how is None:  # large blocks in no run: memmove beats two passes through the scratch
            leftovers.append(torch.arange(sizes.numel()) if members is None else members)
            continue
        vectorized += int(s_off.numel())
        one_pass += int(s_off.numel()) if how else 0
    if leftovers:
        left = torch.cat(leftovers).sort().values  # memmove in the batch's order
        memmove_each(src[left], dst[left], sizes[left])
    return SwapMoveReport(vectorized, int(sizes.numel()) - vectorized, False, one_pass)


def _move_tiled_batch(
    batch: SwapBatch,
    src: torch.Tensor,
    dst: torch.Tensor,
    sizes: torch.Tensor,
    src_region: torch.Tensor,
    dst_region: torch.Tensor,
) -> SwapMoveReport | None:
    """The common spill/fetch shape, moved in one pass without the hazard sort: equal sizes, one source
    region, one other destination region, block-aligned sources, destinations tiling one contiguous run
    (so they are disjoint, and no destination can meet a source in another region). None when the batch
    has another shape.

    The index work runs in pieces of :data:`INDEX_PIECE` descriptors, below torch's parallel grain, so
    only the copy itself uses the thread pool (on a busy host each pool wake can stall for milliseconds).
    """
    count = int(sizes.numel())
    size = batch.uniform_size()
    if count < MIN_VECTOR_GROUP or size is None:
        return None
    s_index, d_index = _single_region(src_region), _single_region(dst_region)
    if s_index is None or d_index is None or s_index == d_index:
        return None
    s_reg = batch.regions[s_index]  # the destination run lies in regions[d_index]: the check proved it
    pieces = [(begin, min(begin + INDEX_PIECE, count)) for begin in range(0, count, INDEX_PIECE)]
    bounds = [torch.aminmax(dst[begin:end]) for begin, end in pieces]
    d_low = min(int(low) for low, _ in bounds)
    d_high = max(int(high) for _, high in bounds)
    if d_high - d_low != (count - 1) * size:
        return None
    # Each destination's place in the run and each source's block, checked to be exact as we go.
    # scatter_, not index assignment: about 10x cheaper per piece (torch 2.13 on the CPU).
    seen = torch.empty(count, dtype=torch.uint8)
    source_blocks = torch.empty(count, dtype=torch.int64)
    for begin, end in pieces:
        seen[begin:end].zero_()
    for begin, end in pieces:
        d_rel, s_rel = dst[begin:end] - d_low, src[begin:end] - s_reg.start
        if bool(((d_rel % size) | (s_rel % size)).any()):
            return None
        position = torch.div(d_rel, size, rounding_mode="floor")
        seen.scatter_(0, position, 1)
        source_blocks.scatter_(0, position, torch.div(s_rel, size, rounding_mode="floor"))
    if not all(bool(seen[begin:end].all()) for begin, end in pieces):
        return None  # a destination repeats: not a run
    dtype, width = _element(size, s_reg.start, d_low)
    src_rows = _rows(s_reg, size, dtype, width)
    run = _bytes_at(d_low, count * size).view(dtype).view(count, size // width)
    torch.index_select(src_rows, 0, source_blocks, out=run)
    return SwapMoveReport(count, 0, False, count)


def _bytes_at(address: int, size: int) -> torch.Tensor:
    """A ``uint8`` tensor over ``size`` bytes at ``address`` (inside a known region; no copy)."""
    return torch.frombuffer((ctypes.c_uint8 * size).from_address(address), dtype=torch.uint8)


def _single_region(region_index: torch.Tensor) -> int | None:
    """The one region every descriptor of a side lies in, or None. The check returns a stride-0 view
    when it proved one region holds the whole side, which costs nothing to recognise here."""
    first = int(region_index[0])
    if region_index.stride(0) == 0 or bool((region_index == first).all()):
        return first
    return None


def _is_permutation(position: torch.Tensor) -> bool:
    """Whether ``position`` holds every value of ``0..len-1`` exactly once (values already in range)."""
    seen = torch.zeros(position.numel(), dtype=torch.bool)
    seen[position] = True
    return bool(seen.all())


def _gather_run(src_rows: torch.Tensor, firsts: torch.Tensor, run: torch.Tensor, per_desc: int) -> None:
    """``run[i * per_desc + j] = src_rows[firsts[i] + j]``, in rounds bounded by ``MAX_INDEX_ROWS``."""
    steps = torch.arange(per_desc, dtype=torch.int64)
    per_round = max(1, MAX_INDEX_ROWS // per_desc)
    for begin in range(0, firsts.numel(), per_round):
        index = firsts[begin:begin + per_round]
        if per_desc > 1:
            index = (index[:, None] + steps).reshape(-1)
        torch.index_select(src_rows, 0, index, out=run[begin * per_desc: begin * per_desc + index.numel()])


def _scatter_run(dst_rows: torch.Tensor, firsts: torch.Tensor, run: torch.Tensor, per_desc: int) -> None:
    """``dst_rows[firsts[i] + j] = run[i * per_desc + j]``, in rounds bounded by ``MAX_INDEX_ROWS``."""
    steps = torch.arange(per_desc, dtype=torch.int64)
    per_round = max(1, MAX_INDEX_ROWS // per_desc)
    for begin in range(0, firsts.numel(), per_round):
        index = firsts[begin:begin + per_round]
        if per_desc > 1:
            index = (index[:, None] + steps).reshape(-1)
        dst_rows.index_copy_(0, index, run[begin * per_desc: begin * per_desc + index.numel()])


def _has_hazard(
    src: torch.Tensor,
    dst: torch.Tensor,
    sizes: torch.Tensor,
    src_region: torch.Tensor,
    dst_region: torch.Tensor,
    region_count: int,
) -> bool:
    """Whether a destination overlaps another destination or another descriptor's source.

    All sizes are > 0. A descriptor whose own source and destination overlap is no hazard: the
    vectorized path reads every source before writing any destination.
    """
    dst_end = dst + sizes
    order = torch.argsort(dst)
    starts, ends = dst[order], dst_end[order]
    if starts.numel() > 1 and bool((starts[1:] < ends[:-1]).any()):
        return True
    # Destinations are now disjoint, so sorted by start their ends are sorted too. Sources can only
    # meet destinations in a region that the batch both reads and writes.
    written = torch.zeros(region_count, dtype=torch.bool)
    written[dst_region] = True
    shared = written[src_region]
    if not bool(shared.any()):
        return False
    s, e = src[shared], src[shared] + sizes[shared]
    first = torch.searchsorted(ends, s, right=True)  # first destination ending after s
    past = torch.searchsorted(starts, e, right=False)  # destinations starting before e
    own = (s < dst_end[shared]) & (dst[shared] < e)
    return bool(((past - first) > own.to(torch.int64)).any())


def _plan_groups(
    sizes: torch.Tensor, src_region: torch.Tensor, dst_region: torch.Tensor, region_count: int
) -> tuple[list[tuple[int, int, int, torch.Tensor | None]], torch.Tensor | None]:
    """Split descriptors into vectorizable groups and the rest, without per-descriptor Python.

    Returns:
        ``(groups, rest)``: each group is ``(src_region, dst_region, size, members)`` with ``members``
        None for "every descriptor"; ``rest`` indexes the descriptors left to memmove (None: none).
    """
    pair = src_region * region_count + dst_region
    if bool((sizes == sizes[0]).all()) and bool((pair == pair[0]).all()):
        size = int(sizes[0])
        if sizes.numel() >= MIN_VECTOR_GROUP:
            return [(int(src_region[0]), int(dst_region[0]), size, None)], None
        return [], torch.arange(sizes.numel())
    size_values, size_rank = torch.unique(sizes, return_inverse=True)
    distinct = size_values.numel()
    keys, inverse, counts = torch.unique(pair * distinct + size_rank, return_inverse=True, return_counts=True)
    order = torch.argsort(inverse, stable=True)  # members of each group, contiguous, in key order
    ends = torch.cumsum(counts, 0).tolist()
    groups: list[tuple[int, int, int, torch.Tensor | None]] = []
    chosen = counts >= MIN_VECTOR_GROUP
    for g in chosen.nonzero().flatten().tolist():
        key, count = int(keys[g]), int(counts[g])
        s_index, d_index = divmod(key // distinct, region_count)
        groups.append((s_index, d_index, int(size_values[key % distinct]), order[ends[g] - count:ends[g]]))
    rest = (~chosen[inverse]).nonzero().flatten() if len(groups) < keys.numel() else None
    return groups, rest


def _common_piece(size: int, offsets: torch.Tensor) -> int:
    """The largest byte count dividing ``size`` and every offset (rows of this width never straddle)."""
    if bool((offsets % size == 0).all()):
        return size
    g = torch.gcd(offsets, torch.tensor(size, dtype=torch.int64))
    while g.numel() > 1:
        half = g.numel() // 2
        head = torch.gcd(g[:half], g[half:2 * half])
        g = head if g.numel() % 2 == 0 else torch.cat([head, g[-1:]])
    return int(g[0])


def _element(piece: int, *starts: int) -> tuple[torch.dtype, int]:
    """The widest integer dtype (and its width) dividing ``piece`` and every region start, so rows
    are moved in aligned words."""
    for dtype, width in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if piece % width == 0 and all(start % width == 0 for start in starts):
            return dtype, width
    return torch.uint8, 1


def _rows(region: Region, piece: int, dtype: torch.dtype, width: int) -> torch.Tensor:
    """The region as ``[region.size // piece, piece // width]`` rows of ``dtype`` (tail bytes left out)."""
    return region_bytes(region)[: region.size // piece * piece].view(dtype).view(-1, piece // width)


def _scratch_buffer() -> torch.Tensor:
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None:
        buffer = _scratch.buffer = torch.empty(SCRATCH_BYTES, dtype=torch.uint8)
    return buffer


def _move_group(s_reg: Region, d_reg: Region, s_off: torch.Tensor, d_off: torch.Tensor, size: int) -> bool | None:
    """Move one hazard-free group of equal-size descriptors.

    Returns:
        True when it moved in one pass (a contiguous run on one side, between two regions), False when it
        went through the scratch buffer, None when it moved nothing (large blocks in no run: the caller
        memmoves them).
    """
    piece = _common_piece(size, torch.cat([s_off, d_off]))
    dtype, width = _element(piece, s_reg.start, d_reg.start)
    src_rows, dst_rows = _rows(s_reg, piece, dtype, width), _rows(d_reg, piece, dtype, width)
    per_desc = size // piece
    s_first, d_first = torch.div(s_off, piece, rounding_mode="floor"), torch.div(d_off, piece, rounding_mode="floor")
    if s_reg is not d_reg:  # separate memory, so torch's out-of-place ops may read one and write the other
        order = _run_order(d_first, per_desc)
        if order is not None:
            start = int(d_first.min())
            firsts = torch.empty_like(s_first)
            firsts[order] = s_first
            _gather_run(src_rows, firsts, dst_rows[start: start + d_first.numel() * per_desc], per_desc)
            return True
        order = _run_order(s_first, per_desc)
        if order is not None:
            start = int(s_first.min())
            firsts = torch.empty_like(d_first)
            firsts[order] = d_first
            _scatter_run(dst_rows, firsts, src_rows[start: start + s_first.numel() * per_desc], per_desc)
            return True
    if size >= LARGE_COPY_BYTES:
        return None
    per_round = max(1, min(SCRATCH_BYTES // size, MAX_INDEX_ROWS // per_desc))
    scratch = _scratch_buffer()[: per_round * size].view(dtype).view(per_round * per_desc, -1)
    steps = torch.arange(per_desc, dtype=torch.int64)
    for begin in range(0, s_off.numel(), per_round):
        s_idx, d_idx = s_first[begin:begin + per_round], d_first[begin:begin + per_round]
        if per_desc > 1:
            s_idx = (s_idx[:, None] + steps).reshape(-1)
            d_idx = (d_idx[:, None] + steps).reshape(-1)
        held = scratch[: s_idx.numel()]
        torch.index_select(src_rows, 0, s_idx, out=held)
        dst_rows.index_copy_(0, d_idx, held)
    return False


def _run_order(firsts: torch.Tensor, per_desc: int) -> torch.Tensor | None:
    """Each block's place in one contiguous run, when blocks of ``per_desc`` units starting at ``firsts``
    tile it exactly (every block once); else None. Units are rows or bytes alike."""
    low, high = (int(v) for v in torch.aminmax(firsts))
    count = firsts.numel()
    if high - low != (count - 1) * per_desc:
        return None
    shifted = firsts - low
    if per_desc > 1 and bool((shifted % per_desc != 0).any()):
        return None
    position = torch.div(shifted, per_desc, rounding_mode="floor")
    return position if _is_permutation(position) else None
