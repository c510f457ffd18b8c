"""Moving the bytes of a validated swap batch on host memory, vectorized with torch.

Invariant: the result equals running the descriptors one after another, in order, each like memmove.
A batch without hazards (no destination overlapping another descriptor's source or destination) is
grouped by (source region, destination region, size) and each group moves with one ``index_select``
into a reused scratch buffer and one ``index_copy_`` per chunk; batches with hazards, groups too small
to vectorize and very large copies go through ``ctypes.memmove``, one call per descriptor.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading

import torch

from hisparse_hal.regions import Region, SwapBatch

__all__ = ["SwapMoveReport", "move_swap_batch", "memmove_each", "region_bytes"]

#: Scratch bytes per gather/scatter round; one buffer per thread, reused (fresh memory costs page faults).
SCRATCH_BYTES = 4 << 20
#: Most row indices built per round (bounds index memory when pieces are small).
MAX_INDEX_ROWS = 1 << 19
#: Groups with fewer descriptors go through memmove: the vectorized setup costs about as much.
MIN_VECTOR_GROUP = 16
#: Descriptors this large go through memmove: one pass, and the ~1 us per call is small next to the
#: copy (hisparse-hal bench on the CPU device: the gather-scatter path wins at 4 KiB, loses at 64 KiB).
LARGE_COPY_BYTES = 32 << 10

_scratch = threading.local()


@dataclasses.dataclass(frozen=True)
class SwapMoveReport:
    """How a batch was moved: descriptors moved vectorized, by memmove, and whether it had hazards."""

    vectorized: int
    looped: int
    hazard: bool


def region_bytes(region: Region) -> torch.Tensor:
    """A ``uint8`` tensor over the region's bytes (no copy, no ownership)."""
    buffer = (ctypes.c_uint8 * region.size).from_address(region.start)
    return torch.frombuffer(buffer, dtype=torch.uint8)


def memmove_each(src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor) -> None:
    """Copy descriptor by descriptor, in order, with ``ctypes.memmove`` (overlap-safe)."""
    for s, d, n in zip(src.tolist(), dst.tolist(), sizes.tolist()):
        ctypes.memmove(d, s, n)


def move_swap_batch(batch: SwapBatch) -> SwapMoveReport:
    """Copy every descriptor of a validated batch.

    Args:
        batch: validated by :meth:`RegionTable.check_swap_batch`; every range lies in ``batch.regions``.

    Returns:
        A :class:`SwapMoveReport` saying which path moved how many descriptors.
    """
    src, dst, sizes = batch.src, batch.dst, batch.sizes
    src_region, dst_region = batch.src_region, batch.dst_region
    moving = sizes > 0
    if not bool(moving.all()):
        src, dst, sizes = src[moving], dst[moving], sizes[moving]
        src_region, dst_region = src_region[moving], dst_region[moving]
    if sizes.numel() == 0:
        return SwapMoveReport(0, 0, False)
    if _has_hazard(src, dst, sizes, src_region, dst_region, len(batch.regions)):
        memmove_each(src, dst, sizes)
        return SwapMoveReport(0, int(sizes.numel()), True)

    groups, rest = _plan_groups(sizes, src_region, dst_region, len(batch.regions))
    vectorized = 0
    for s_index, d_index, size, members in groups:
        s_reg, d_reg = batch.regions[s_index], batch.regions[d_index]
        s_off = (src if members is None else src[members]) - s_reg.start
        d_off = (dst if members is None else dst[members]) - d_reg.start
        _move_group(s_reg, d_reg, s_off, d_off, size)
        vectorized += int(s_off.numel())
    if rest is not None:
        memmove_each(src[rest], dst[rest], sizes[rest])
    return SwapMoveReport(vectorized, int(sizes.numel()) - vectorized, False)


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
        if sizes.numel() >= MIN_VECTOR_GROUP and size < LARGE_COPY_BYTES:
            return [(int(src_region[0]), int(dst_region[0]), size, None)], None
        return [], torch.arange(sizes.numel())
    size_values, size_rank = torch.unique(sizes, return_inverse=True)
    distinct = size_values.numel()
    keys, inverse, counts = torch.unique(pair * distinct + size_rank, return_inverse=True, return_counts=True)
    order = torch.argsort(inverse, stable=True)  # members of each group, contiguous, in key order
    ends = torch.cumsum(counts, 0).tolist()
    groups: list[tuple[int, int, int, torch.Tensor | None]] = []
    chosen = (counts >= MIN_VECTOR_GROUP) & (size_values[keys % distinct] < LARGE_COPY_BYTES)
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


def _move_group(s_reg: Region, d_reg: Region, s_off: torch.Tensor, d_off: torch.Tensor, size: int) -> None:
    """Gather then scatter one group of equal-size descriptors, in rounds bounded by the scratch."""
    piece = _common_piece(size, torch.cat([s_off, d_off]))
    dtype, width = _element(piece, s_reg.start, d_reg.start)
    src_rows, dst_rows = _rows(s_reg, piece, dtype, width), _rows(d_reg, piece, dtype, width)
    per_desc = size // piece
    per_round = max(1, min(SCRATCH_BYTES // size, MAX_INDEX_ROWS // per_desc))
    scratch = _scratch_buffer()[: per_round * size].view(dtype).view(per_round * per_desc, -1)
    steps = torch.arange(per_desc, dtype=torch.int64)
    s_first, d_first = torch.div(s_off, piece, rounding_mode="floor"), torch.div(d_off, piece, rounding_mode="floor")
    for begin in range(0, s_off.numel(), per_round):
        s_idx, d_idx = s_first[begin:begin + per_round], d_first[begin:begin + per_round]
        if per_desc > 1:
            s_idx = (s_idx[:, None] + steps).reshape(-1)
            d_idx = (d_idx[:, None] + steps).reshape(-1)
        held = scratch[: s_idx.numel()]
        torch.index_select(src_rows, 0, s_idx, out=held)
        dst_rows.index_copy_(0, d_idx, held)
