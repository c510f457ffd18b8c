"""Known memory regions and the vectorized check of swap descriptors against them.

Invariant: a swap batch reaches a copy engine only if every descriptor's source and destination range
lies wholly inside one known region. The check is vectorized (no per-descriptor Python): two reductions
prove a side that spans one region, a bucket table locates a side spread over several (an engine's
layers), a ``searchsorted`` finds the first bad descriptor; a rejected batch copies nothing.
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
from collections.abc import Iterator, Sequence

import torch

from .errors import InvalidArgumentError, InvalidDescriptorError

__all__ = ["Region", "RegionTable", "SwapBatch", "check_descriptor_tensors", "check_region"]

REGION_KINDS = ("pinned_host", "device_cache", "explicit")
#: One past the last byte a region may cover: descriptors are int64 tensors.
MAX_ADDRESS = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class Region:
    """One contiguous byte range a backend may copy to or from.

    Attributes:
        start: first byte address.
        size: length in bytes (> 0).
        kind: ``"pinned_host"``, ``"device_cache"`` or ``"explicit"``.
        label: a human name for error messages (``"pinned pool 0x7f.. chunk 1/3"``, ``"layer.3"``).
        device: where the bytes live.
        device_alias: for host memory on backends with ``host_pointer_alias``, the device address of
            ``start``; otherwise None.
    """

    start: int
    size: int
    kind: str
    label: str
    device: torch.device = torch.device("cpu")
    device_alias: int | None = None

    @property
    def end(self) -> int:
        """One past the last byte."""
        return self.start + self.size


@dataclasses.dataclass(frozen=True)
class SwapBatch:
    """A validated swap batch: contiguous int64 CPU tensors the caller may reuse after the call.

    ``src_region`` and ``dst_region`` hold, per descriptor, the index into ``regions`` of the region
    that contains it (a stride-0 view when one region holds the whole side). ``size_range`` is
    ``(smallest, largest)`` of ``sizes`` when known (the check computes it), so copy paths need no
    further pass to find zero-byte or uniform descriptors.
    """

    src: torch.Tensor
    dst: torch.Tensor
    sizes: torch.Tensor
    src_region: torch.Tensor
    dst_region: torch.Tensor
    regions: tuple[Region, ...]
    size_range: tuple[int, int] | None = None

    def size_bounds(self) -> tuple[int, int]:
        """``(smallest, largest)`` size; ``(0, 0)`` for an empty batch."""
        if self.size_range is not None:
            return self.size_range
        if self.count == 0:
            return (0, 0)
        low, high = torch.aminmax(self.sizes)
        return int(low), int(high)

    @property
    def count(self) -> int:
        """Number of descriptors."""
        return int(self.src.numel())

    def uniform_size(self) -> int | None:
        """The common byte count when every descriptor has the same size, else None."""
        if self.count == 0:
            return None
        low, high = self.size_bounds()
        return low if low == high else None

    def chunks(self, cap: int | None) -> Iterator[SwapBatch]:
        """Split into consecutive batches of at most ``cap`` descriptors (one batch when cap is None)."""
        if cap is None or self.count <= cap:
            yield self
            return
        for begin in range(0, self.count, cap):
            end = min(begin + cap, self.count)
            yield SwapBatch(
                self.src[begin:end],
                self.dst[begin:end],
                self.sizes[begin:end],
                self.src_region[begin:end],
                self.dst_region[begin:end],
                self.regions,
                # Uniform sizes stay exact for every chunk; other bounds are recomputed on demand.
                self.size_range if self.size_range is not None and self.size_range[0] == self.size_range[1] else None,
            )


def check_descriptor_tensors(src: object, dst: object, sizes: object) -> None:
    """Check that swap descriptors are three 1-D int64 CPU tensors of equal length.

    Raises:
        InvalidDescriptorError: naming the argument and its bad type, dtype, device, shape or length.
    """
    for name, value in (("src", src), ("dst", dst), ("sizes", sizes)):
        if not isinstance(value, torch.Tensor):
            raise InvalidDescriptorError(
                f"swap descriptor '{name}' must be a torch.Tensor, got {type(value).__name__}"
            )
        if value.dtype != torch.int64:
            raise InvalidDescriptorError(
                f"swap descriptor '{name}' must have dtype torch.int64, got {value.dtype}"
            )
        if value.device.type != "cpu":
            raise InvalidDescriptorError(
                f"swap descriptor '{name}' must be a CPU tensor, got device {value.device}; "
                "build descriptor arrays in host memory"
            )
        if value.dim() != 1:
            raise InvalidDescriptorError(
                f"swap descriptor '{name}' must be 1-D, got shape {tuple(value.shape)}"
            )
    assert isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor)
    assert isinstance(sizes, torch.Tensor)
    if not (src.numel() == dst.numel() == sizes.numel()):
        raise InvalidDescriptorError(
            "swap descriptors must have equal lengths, got "
            f"src={src.numel()}, dst={dst.numel()}, sizes={sizes.numel()}"
        )


class RegionTable:
    """The regions a backend knows, kept sorted for vectorized lookup. Thread-safe.

    Regions never overlap: adding one that overlaps a known region is an error, so every address
    belongs to at most one region. Every change builds a new immutable :class:`_TableView` under the
    lock and swaps it in with one assignment; readers (iteration, lookups, swap checks) take the
    current view without the lock and see one consistent generation.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._view = _TableView.build(())

    def __len__(self) -> int:
        return len(self._view.regions)

    def __iter__(self) -> Iterator[Region]:
        return iter(self._view.regions)

    def snapshot(self) -> tuple[Region, ...]:
        """The known regions, sorted by start, as one consistent tuple."""
        return self._view.regions

    def add(self, region: Region) -> Region:
        """Add ``region``.

        Raises:
            InvalidArgumentError: the region is empty, has a negative start, ends past the int64 address
                space, has an unknown kind, or overlaps a known region (both are named).
        """
        self.update(add=(region,))
        return region

    def remove(self, region: Region) -> None:
        """Forget ``region``.

        Raises:
            InvalidArgumentError: the region is not known.
        """
        self.update(remove=(region,))

    def update(self, *, add: Sequence[Region] = (), remove: Sequence[Region] = ()) -> None:
        """Forget the regions ``remove`` and add the regions ``add`` in one change: all or nothing.

        One sort and one rebuild whatever the count, so registering a pool of n chunks costs
        O(n log n), not one rebuild per chunk.

        Raises:
            InvalidArgumentError: a region to remove is not known, or a region to add is invalid or
                overlaps a known region or another added one (as :meth:`add`); nothing changed.
        """
        for region in add:
            check_region(region)
        with self._lock:
            kept = self._view.regions
            if remove:
                gone = set(remove)
                known = set(kept)
                for region in remove:
                    if region not in known:
                        raise InvalidArgumentError(
                            f"region {region.label!r} at {region.start:#x} is not registered"
                        )
                kept = tuple(r for r in kept if r not in gone)
            regions = sorted((*kept, *add), key=lambda r: r.start) if add else list(kept)
            _check_no_overlap(regions, add)
            self._view = _TableView.build(tuple(regions))

    def overlapping(self, start: int, end: int) -> Region | None:
        """The first known region overlapping ``[start, end)``, or None (a binary search)."""
        view = self._view
        k = max(bisect.bisect_right(view.start_list, start) - 1, 0)
        for region in view.regions[k:k + 2]:  # the region holding start, else the next one
            if region.start < end and start < region.end:
                return region
        return None

    def find(self, address: int) -> Region | None:
        """The region containing ``address``, or None."""
        view = self._view
        k = bisect.bisect_right(view.start_list, address) - 1
        if k >= 0 and address < view.end_list[k]:
            return view.regions[k]
        return None

    def check_swap_batch(self, src: object, dst: object, sizes: object) -> SwapBatch:
        """Validate a whole swap batch before anything is copied.

        Args:
            src: 1-D int64 CPU tensor of source addresses.
            dst: 1-D int64 CPU tensor of destination addresses, same length.
            sizes: 1-D int64 CPU tensor of byte counts (>= 0), same length.

        Returns:
            A :class:`SwapBatch` with contiguous copies of the descriptors and, per descriptor, the
            index of its source and destination region.

        Raises:
            InvalidDescriptorError: the arrays are malformed, or a descriptor has a negative size or a
                range outside every known region (or straddling a region's end); the message names the
                first bad index, its values and why.
        """
        check_descriptor_tensors(src, dst, sizes)
        assert isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor)
        assert isinstance(sizes, torch.Tensor)
        view = self._view  # one immutable generation, swapped in whole by update()
        n = src.numel()
        # One copy of all three arrays, not views: the caller may overwrite its arrays as soon as we
        # return (and another thread could edit them between this check and the copy engine).
        packed, bounds = _pack_with_bounds(src, dst, sizes)
        src, dst, sizes = packed[0], packed[1], packed[2]
        if n == 0:
            empty = torch.empty(0, dtype=torch.int64)
            return SwapBatch(src, dst, sizes, empty, empty, view.regions, (0, 0))
        (src_low, src_high), (dst_low, dst_high), (low_size, high_size) = bounds
        if low_size >= 0:
            src_region = view.side_regions(src, sizes, src_low, src_high, high_size)
            if src_region is not None:
                dst_region = view.side_regions(dst, sizes, dst_low, dst_high, high_size)
                if dst_region is not None:
                    return SwapBatch(src, dst, sizes, src_region, dst_region, view.regions, (low_size, high_size))
        # A bad batch (or a layout the bucket table does not fit): check each descriptor, name the first bad.
        return self._check_each(packed, view.regions, view.starts, view.ends, (low_size, high_size))

    def _check_each(
        self,
        packed: torch.Tensor,
        regions: tuple[Region, ...],
        starts: torch.Tensor,
        ends: torch.Tensor,
        size_range: tuple[int, int],
    ) -> SwapBatch:
        """The per-descriptor check of a ``[src; dst; sizes]`` batch that is bad, or whose layout the bucket
        table does not fit: one ``searchsorted`` over both address rows; raises naming the first bad one."""
        src, dst, sizes = packed[0], packed[1], packed[2]
        negative = sizes < 0
        located, ok = _locate(packed[:2], sizes, starts, ends)
        src_region, dst_region = located[0], located[1]
        src_ok, dst_ok = ok[0], ok[1]
        bad = negative | ~(src_ok & dst_ok)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])  # the first bad descriptor, whatever is wrong with it
            if bool(negative[i]):
                raise InvalidDescriptorError(
                    f"swap descriptor {i} has negative size {int(sizes[i])}; sizes must be >= 0", i
                )
            side, address = ("source", int(src[i])) if not bool(src_ok[i]) else ("destination", int(dst[i]))
            raise InvalidDescriptorError(
                f"swap descriptor {i}: {side} range [{address:#x}, {address + int(sizes[i]):#x}) "
                f"({int(sizes[i])} bytes) {self._why_outside(address, int(sizes[i]), regions)}; "
                "nothing was copied. Pin the host pool, pass the cache to prepare_kv_cache_views, "
                "or register the region explicitly",
                i,
            )
        return SwapBatch(src, dst, sizes, src_region, dst_region, regions, size_range)

    @staticmethod
    def _why_outside(address: int, size: int, regions: tuple[Region, ...]) -> str:
        for region in regions:
            if region.start <= address < region.end or (size == 0 and address == region.end):
                return (
                    f"runs past the end of region {region.label!r} "
                    f"[{region.start:#x}, {region.end:#x}) by {address + size - region.end} bytes"
                )
        return "is not inside any known region"


def check_region(region: Region) -> None:
    """Raise ``InvalidArgumentError`` for a region no table may hold (naming it and the bad value)."""
    if region.size <= 0:
        raise InvalidArgumentError(f"region {region.label!r} must have size > 0, got {region.size}")
    if region.start < 0:
        raise InvalidArgumentError(f"region {region.label!r} has negative start address {region.start}")
    if region.end > MAX_ADDRESS:  # the descriptor check works in int64; such a region cannot be indexed
        raise InvalidArgumentError(
            f"region {region.label!r} [{region.start:#x}, {region.end:#x}) ends beyond the largest address "
            f"a swap descriptor can hold ({MAX_ADDRESS:#x}); check its start and size"
        )
    if region.kind not in REGION_KINDS:
        raise InvalidArgumentError(f"region kind must be one of {REGION_KINDS}, got {region.kind!r}")


def _check_no_overlap(regions: Sequence[Region], added: Sequence[Region]) -> None:
    """Raise ``InvalidArgumentError`` naming the first two overlapping regions of a start-sorted sequence (the one
    being added first)."""
    new = set(added)
    for known, region in zip(regions, regions[1:], strict=False):
        if region.start < known.end:
            if known in new and region not in new:
                known, region = region, known
            raise InvalidArgumentError(
                f"region {region.label!r} [{region.start:#x}, {region.end:#x}) overlaps "
                f"known region {known.label!r} [{known.start:#x}, {known.end:#x}); "
                "release the known region first"
            )


@dataclasses.dataclass(frozen=True)
class _TableView:
    """One generation of a :class:`RegionTable`: immutable except the bucket-table memo, which has its lock."""

    regions: tuple[Region, ...]
    starts: torch.Tensor
    ends: torch.Tensor
    next_starts: torch.Tensor
    start_list: tuple[int, ...]
    end_list: tuple[int, ...]
    lookups: dict[tuple[int, int], _BucketLookup | None]
    lookups_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @classmethod
    def build(cls, regions: tuple[Region, ...]) -> _TableView:
        """The view of start-sorted, non-overlapping ``regions``."""
        start_list = tuple(r.start for r in regions)
        end_list = tuple(r.end for r in regions)
        # The start of the next region per region (MAX_ADDRESS after the last): the bucket lookup's
        # one correction step compares against it.
        return cls(
            regions,
            torch.tensor(start_list, dtype=torch.int64),
            torch.tensor(end_list, dtype=torch.int64),
            torch.tensor(start_list[1:] + (MAX_ADDRESS,), dtype=torch.int64),
            start_list,
            end_list,
            {},
        )

    def lookup(self, first: int, last: int) -> _BucketLookup | None:
        """The bucket lookup of regions ``first..last``, built once per view (under the memo's lock)."""
        key = (first, last)
        with self.lookups_lock:
            if key in self.lookups:
                return self.lookups[key]
        lookup = _BucketLookup.build(self.start_list, self.end_list, first, last, self.starts)
        with self.lookups_lock:
            if len(self.lookups) >= _MAX_LOOKUPS:
                self.lookups.clear()
            self.lookups[key] = lookup
        return lookup

    def side_regions(
        self, addresses: torch.Tensor, sizes: torch.Tensor, low: int, high: int, high_size: int
    ) -> torch.Tensor | None:
        """Per-descriptor region index of one side (``addresses``, lowest ``low``, highest ``high``) when
        every ``[address, address + size)`` lies inside one region; None when some may not (the caller then
        runs the per-descriptor check, which names the first bad one). ``sizes`` are known to be >= 0.

        One region holding ``[low, high + high_size)`` proves the whole side with no per-descriptor work.
        Otherwise the regions from the one holding ``low`` to the one holding ``high`` are bucketed
        (:class:`_BucketLookup`) and every address is located and checked in a fixed number of passes.
        """
        first = bisect.bisect_right(self.start_list, low) - 1
        if first < 0:
            return None  # the lowest address lies below every region
        n = addresses.numel()
        if high + high_size <= self.end_list[first]:
            return _region_index(first).expand(n)
        last = bisect.bisect_right(self.start_list, high) - 1
        if high >= self.end_list[last] or last == first:
            return None  # the highest address lies in a gap, or one region's end is overrun
        lookup = self.lookup(first, last)
        if lookup is None:
            return None
        # -width <= room <= width and 0 <= size <= high_size: room - size cannot wrap below -2**63.
        subtract = lookup.width <= _SAFE_SPAN and high_size <= _SAFE_SPAN
        index = torch.empty(n, dtype=torch.int64)
        # In pieces below torch's parallel grain, like the packing (a whole 65,536 woke the pool: 3x slower).
        for begin in range(0, n, CHECK_PIECE):
            end = min(begin + CHECK_PIECE, n)
            piece, piece_index = addresses[begin:end], index[begin:end]
            lookup.locate(piece, self.next_starts, piece_index)
            room = torch.gather(self.ends, 0, piece_index)
            room -= piece  # bytes left in the located region: negative for an address in a gap
            if subtract:
                room -= sizes[begin:end]
                fits = int(room.min()) >= 0
            else:
                fits = bool(torch.ge(room, sizes[begin:end]).all())
            if not fits:
                return None
        return index


#: Bucket tables kept per table generation (one per distinct (first, last) region pair met).
_MAX_LOOKUPS = 64
#: Largest bucket table built (int64 entries); a layout needing more is checked with ``searchsorted``.
MAX_BUCKETS = 1 << 15
#: Below this, differences of two non-negative int64 values of a span cannot overflow when subtracted again.
_SAFE_SPAN = 1 << 62


@dataclasses.dataclass(frozen=True)
class _BucketLookup:
    """Locates addresses among regions ``first..last`` in a fixed number of vectorized passes.

    The span from ``base`` (the start of region ``first``) to the end of region ``last`` is cut into
    buckets of ``2**shift`` bytes, no wider than the smallest distance between two consecutive region
    starts, so a bucket holds at most one start. ``table[b]`` is the last region starting at or before
    bucket ``b``'s first byte; an address in bucket ``b`` lies in that region or, past the one start the
    bucket may hold, in the next. So a lookup is one shift, two gathers and one compare, whatever the
    number of regions (a ``searchsorted`` costs a binary search per address: 64 us per 8,192 over 62
    regions, docs/benchmarks.md).
    """

    base: int
    shift: int
    width: int
    table: torch.Tensor

    @classmethod
    def build(
        cls, start_list: Sequence[int], end_list: Sequence[int], first: int, last: int, starts: torch.Tensor
    ) -> _BucketLookup | None:
        """The lookup for regions ``first..last`` (``first < last``), or None when it would need more than
        :data:`MAX_BUCKETS` buckets (regions of very different sizes: a small one beside a large one)."""
        base = start_list[first]
        gap = min(start_list[k + 1] - start_list[k] for k in range(first, last))
        shift = gap.bit_length() - 1  # 2**shift <= gap
        width = end_list[last] - base
        buckets = ((width - 1) >> shift) + 1
        if buckets > MAX_BUCKETS:
            return None
        bucket_starts = torch.arange(buckets, dtype=torch.int64).bitwise_left_shift_(shift).add_(base)
        table = torch.searchsorted(starts, bucket_starts, right=True).sub_(1)
        return cls(base, shift, width, table)

    def locate(self, addresses: torch.Tensor, next_starts: torch.Tensor, out: torch.Tensor) -> None:
        """Write to ``out`` the index of the last region starting at or before each address, for addresses
        in ``[base, end of region last)``."""
        bucket = torch.sub(addresses, self.base).bitwise_right_shift_(self.shift)
        torch.gather(self.table, 0, bucket, out=out)  # gather, not take: no index wrapping, 2 us less per 8,192
        out += torch.ge(addresses, torch.gather(next_starts, 0, out))


_REGION_INDICES = torch.arange(64, dtype=torch.int64)


def _region_index(k: int) -> torch.Tensor:
    """A one-element int64 tensor holding ``k`` (a view of a shared table for small ``k``)."""
    return _REGION_INDICES[k:k + 1] if k < _REGION_INDICES.numel() else torch.full((1,), k, dtype=torch.int64)


#: Descriptors copied and reduced per step of the check. Three rows of this many int64 stay below torch's
#: intra-op parallel grain (32,768 elements), so the check runs on the calling thread only: on a busy host
#: each wake of torch's thread pool cost milliseconds (hisparse-hal bench, docs/benchmarks.md).
CHECK_PIECE = 8192


def _pack_with_bounds(
    src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor
) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Copy the three descriptor rows into one ``[3, n]`` tensor and return it with each row's
    ``(min, max)`` (``(0, 0)`` when empty), in pieces of :data:`CHECK_PIECE` descriptors."""
    n = src.numel()
    if n <= CHECK_PIECE:
        packed = torch.stack((src, dst, sizes))
        return packed, [_bounds(row) if n else (0, 0) for row in packed]
    packed = torch.empty((3, n), dtype=torch.int64)
    lows, highs = [[], [], []], [[], [], []]  # type: list[list[int]], list[list[int]]
    for begin in range(0, n, CHECK_PIECE):
        end = min(begin + CHECK_PIECE, n)
        for row, values in enumerate((src, dst, sizes)):
            piece = packed[row, begin:end]
            piece.copy_(values[begin:end])
            low, high = _bounds(piece)
            lows[row].append(low)
            highs[row].append(high)
    return packed, [(min(lows[row]), max(highs[row])) for row in range(3)]


def _bounds(values: torch.Tensor) -> tuple[int, int]:
    """``(min, max)`` of a non-empty 1-D tensor as Python ints."""
    low, high = torch.aminmax(values)
    return int(low), int(high)


def _locate(
    addresses: torch.Tensor, sizes: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """For ``[sides, n]`` contiguous addresses: per address, the index of the last region starting at or
    before it, and whether ``[address, address + size)`` fits inside that region (one ``searchsorted``;
    written to avoid int64 overflow)."""
    if starts.numel() == 0:
        return torch.zeros_like(addresses), torch.zeros_like(addresses, dtype=torch.bool)
    index = torch.searchsorted(starts, addresses.reshape(-1), right=True).view(addresses.shape) - 1
    safe = index.clamp_min(0)
    room = ends.take(safe) - addresses  # bytes from address to the region's end
    # index >= 0 means starts[index] <= address: searchsorted found the last start at or before it.
    ok = (index >= 0) & (room >= sizes)
    return safe, ok
