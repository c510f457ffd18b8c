"""Hypothesis strategies for bad input: swap batches, gathers and registrations that a backend must refuse.

Every strategy draws one case of a given kind against one :class:`bad_input_worlds.World` (its real
addresses) and yields a :class:`BadCall`: what to call, the typed error it must raise, and the
substrings its message must contain (the bad value itself, and the first bad descriptor's index where
there is one).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from hypothesis import strategies as st

from hisparse_hal.errors import InvalidArgumentError, InvalidDescriptorError
from hisparse_hal.regions import Region
from hisparse_hal.testing.bad_input_worlds import BLOCK, GATHER_SHAPE, STAGING_ROWS, World

__all__ = ["BadCall", "Overlapping", "bad_gathers", "bad_registrations", "bad_swaps", "overlapping_swaps"]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
META = torch.device("meta")
SWAP_DESCRIPTOR_KINDS = ("negative_size", "one_byte_past_end", "one_byte_before_start", "spanning_registrations",
                         "huge_size", "wild_address", "unpinned_memory", "after_unpin", "guard_bytes")
SWAP_MALFORMED_KINDS = ("wrong_dtype", "wrong_rank", "wrong_length", "not_a_tensor", "wrong_device")
GATHER_KINDS = ("ids_dtype", "ids_rank", "id_out_of_range", "destination_rows", "destination_width",
                "destination_dtype", "destination_strided", "destination_overlaps_source",
                "destination_requires_grad", "source_rank", "source_empty", "not_a_tensor", "wrong_device")
REGISTRATION_KINDS = ("pin_overlapping", "pin_again", "pin_bad_tensor", "unpin_not_pinned", "region_bad_size",
                      "region_negative_address", "region_overlapping", "region_past_int64", "region_not_an_int",
                      "unregister_unknown", "registration_of_unpinned")
BAD_DESCRIPTOR_DTYPES = (torch.int32, torch.int16, torch.int8, torch.uint8, torch.uint64, torch.float32,
                         torch.float64, torch.bfloat16, torch.bool, torch.complex64)
BAD_ID_DTYPES = (torch.float32, torch.float64, torch.int16, torch.int8, torch.uint8, torch.bool, torch.bfloat16,
                 torch.uint32)


@dataclasses.dataclass
class BadCall:
    """One call that must fail: ``member(*args)`` raises ``error`` whose message has every ``expect``."""

    area: str
    kind: str
    member: str
    args: tuple[Any, ...]
    error: type[Exception]
    expect: tuple[str, ...]
    index: int | None = None  # InvalidDescriptorError.index, for descriptor kinds

    def call(self, world: World) -> None:
        getattr(world.backend, self.member)(*self.args)


def _i64(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


@st.composite
def _valid_descriptor(draw: st.DrawFn, regions: list[Region]) -> tuple[int, int, int]:
    """A descriptor wholly inside known regions, decoded from one drawn integer (one draw per descriptor
    keeps generation cheap; zero shrinks to the first region's first byte)."""
    code = draw(st.integers(0, 2**48 - 1))
    code, src = divmod(code, len(regions))
    code, dst = divmod(code, len(regions))
    code, size = divmod(code, 2 * BLOCK)
    size += 1
    code, src_offset = divmod(code, regions[src].size - size + 1)
    dst_offset = code % (regions[dst].size - size + 1)
    return regions[src].start + src_offset, regions[dst].start + dst_offset, size


def _not_a_tensor(draw: st.DrawFn, tensor: torch.Tensor) -> tuple[object, str]:
    value = draw(st.sampled_from(["list", "none", "int", "tuple"]))
    head = tensor.flatten()[:8].tolist()
    replacement = {"list": head, "none": None, "int": 7, "tuple": tuple(head)}[value]
    return replacement, type(replacement).__name__


@st.composite
def bad_swaps(draw: st.DrawFn, world: World, kind: str) -> BadCall:
    """A swap batch with exactly one thing wrong, of ``kind``: a malformed array, or one bad descriptor
    among valid ones (valid copies before it would show up as a partial copy)."""
    roles = world.swap_regions()
    regions = list(roles.values())
    before, after = draw(st.integers(0, 5)), draw(st.integers(0, 3))
    rows = [draw(_valid_descriptor(regions)) for _ in range(before + after)]
    if kind in SWAP_MALFORMED_KINDS:
        return _malformed_swap(draw, kind, rows)
    i = before
    side = draw(st.sampled_from(["source", "destination"]))
    good = draw(_valid_descriptor(regions))
    expect: tuple[str, ...]
    if kind == "negative_size":
        size = draw(st.integers(INT64_MIN, -1))
        bad = (good[0], good[1], size)
        expect = (f"swap descriptor {i} has negative size {size}",)
    else:
        address, size, expect = _bad_range(draw, kind, world, roles)
        # The descriptor's other side must hold ``size`` bytes, or the message would name it instead.
        roomy = [r for r in regions if r.size >= size]
        if roomy:
            other = draw(st.sampled_from(roomy))
            other_address = other.start + draw(st.integers(0, other.size - size))
        else:  # no region holds it: the bad range goes on the source side, which is checked first
            side, other_address = "source", good[1]
        bad = (address, other_address, size) if side == "source" else (other_address, address, size)
        expect = (f"swap descriptor {i}: {side} range [{address:#x},", f"({size} bytes)", *expect)
    rows.insert(i, bad)
    src, dst, sizes = (_i64([row[k] for row in rows]) for k in range(3))
    return BadCall("swaps", kind, "swap_blocks_batch", (src, dst, sizes), InvalidDescriptorError, expect, i)


def _bad_range(draw: st.DrawFn, kind: str, world: World, roles: dict[str, Region]) -> tuple[int, int, tuple[str, ...]]:
    """An (address, size) that is not wholly inside one known region, and what the message must say."""
    outside = ("is not inside any known region",)
    if kind == "one_byte_past_end":
        region = draw(st.sampled_from(list(roles.values())))
        size = draw(st.integers(2, region.size))  # starts inside, ends one byte past the end
        return region.end - size + 1, size, (f"runs past the end of region {region.label!r}", "by 1 bytes")
    if kind == "one_byte_before_start":  # regions preceded by guard bytes, not by another region
        region = draw(st.sampled_from([roles["device"], roles["pool_chunk1"]]))
        return region.start - 1, draw(st.integers(1, region.size)), outside
    if kind == "spanning_registrations":
        first, second = draw(st.sampled_from([(roles["pool_chunk1"], roles["pool_chunk2"]),
                                              (roles["pool_chunk2"], roles["neighbour"])]))
        head, tail = draw(st.integers(1, first.size)), draw(st.integers(1, second.size))
        return first.end - head, head + tail, (f"runs past the end of region {first.label!r}", f"by {tail} bytes")
    if kind == "huge_size":
        region = draw(st.sampled_from(list(roles.values())))
        offset = draw(st.integers(0, region.size - 1))
        size = draw(st.integers(region.size - offset + 1, INT64_MAX))
        return region.start + offset, size, (f"runs past the end of region {region.label!r}",)
    if kind == "wild_address":
        address = draw(st.one_of(st.integers(INT64_MIN, -1), st.integers(0, 1 << 16),
                                 st.integers(1 << 62, INT64_MAX), st.integers(INT64_MIN, INT64_MAX)))
        if any(r.start <= address <= r.end for r in world.backend.regions):
            address = -address  # inside (or one past) a region: mirror it below zero
        return address, draw(st.integers(0, INT64_MAX)), outside
    if kind in ("unpinned_memory", "after_unpin"):
        memory = world.unpinned if kind == "unpinned_memory" else world.released
        size = draw(st.integers(1, memory.numel()))
        return memory.data_ptr() + draw(st.integers(0, memory.numel() - size)), size, outside
    assert kind == "guard_bytes", kind
    arena = draw(st.sampled_from([world.host, world.device]))
    lo, hi = draw(st.sampled_from(arena.guards))
    size = draw(st.integers(1, hi - lo))
    return arena.tensor.data_ptr() + lo + draw(st.integers(0, hi - lo - size)), size, outside


def _malformed_swap(draw: st.DrawFn, kind: str, rows: list[tuple[int, int, int]]) -> BadCall:
    arrays = {name: _i64([row[k] for row in rows]) for k, name in enumerate(("src", "dst", "sizes"))}
    if kind == "wrong_length":
        which = draw(st.sampled_from(list(arrays)))
        n = arrays[which].numel()
        new = draw(st.integers(0, 9).filter(lambda m: m != n))
        arrays[which] = _i64((arrays[which].tolist() + [4096] * new)[:new])
        lengths = {name: t.numel() for name, t in arrays.items()}
        expect: tuple[str, ...] = (f"src={lengths['src']}, dst={lengths['dst']}, sizes={lengths['sizes']}",)
    else:
        which = draw(st.sampled_from(list(arrays)))
        tensor = arrays[which]
        if kind == "wrong_dtype":
            dtype = draw(st.sampled_from(BAD_DESCRIPTOR_DTYPES))
            arrays[which] = tensor.to(dtype)
            expect = (f"'{which}' must have dtype torch.int64, got {dtype}",)
        elif kind == "wrong_rank":
            shaped = draw(st.sampled_from(["row", "column", "scalar"]))
            arrays[which] = {"row": tensor.view(1, -1), "column": tensor.view(-1, 1),
                             "scalar": torch.tensor(4096, dtype=torch.int64)}[shaped]
            expect = (f"'{which}' must be 1-D, got shape {tuple(arrays[which].shape)}",)
        elif kind == "not_a_tensor":
            arrays[which], type_name = _not_a_tensor(draw, tensor)  # type: ignore[assignment]
            expect = (f"'{which}' must be a torch.Tensor, got {type_name}",)
        else:
            assert kind == "wrong_device"
            arrays[which] = tensor.to(META)
            expect = (f"'{which}' must be a CPU tensor, got device meta",)
    return BadCall("swaps", kind, "swap_blocks_batch", (arrays["src"], arrays["dst"], arrays["sizes"]),
                   InvalidDescriptorError, expect)


@st.composite
def bad_gathers(draw: st.DrawFn, world: World, kind: str) -> BadCall:
    """A gather with exactly one thing wrong with its source, destination or row ids, of ``kind``."""
    source = world.gather_source()
    blocks, rows_per_block, width = GATHER_SHAPE
    total = blocks * rows_per_block
    staging = world.staging.parts["staging"]
    low = 2 if kind == "destination_strided" else 1 if kind in ("id_out_of_range", "destination_width",
                                                                "destination_overlaps_source") else 0
    n = draw(st.integers(low, STAGING_ROWS // 2))
    ids = torch.tensor(draw(st.lists(st.integers(-1, total - 1), min_size=n, max_size=n)), dtype=torch.int64)
    destination = staging[: n * width].view(n, width)
    args: list[Any] = [source, destination, ids]
    expect: tuple[str, ...]
    if kind == "ids_dtype":
        dtype = draw(st.sampled_from(BAD_ID_DTYPES))
        args[2] = ids.to(dtype)
        expect = (f"row_ids must be int32 or int64, got {dtype}",)
    elif kind == "ids_rank":
        args[2] = draw(st.sampled_from([ids.view(1, -1), ids.view(-1, 1), torch.tensor(3)]))
        expect = (f"row_ids must be a flat 1-D list, got shape {tuple(args[2].shape)}",)
    elif kind == "id_out_of_range":
        dtype = draw(st.sampled_from([torch.int32, torch.int64]))
        top = torch.iinfo(dtype).max
        value = draw(st.one_of(st.integers(-top - 1, -2), st.integers(total, top)))
        j = draw(st.integers(0, n - 1))
        ids[j] = value
        args[2] = ids.to(dtype)
        expect = (f"row_ids[{j}] = {value} is out of range", f"[0, {total})")
    elif kind == "destination_rows":
        m = draw(st.integers(0, STAGING_ROWS).filter(lambda m: m != n))
        args[1] = staging[: m * width].view(m, width)
        expect = (f"gather destination {(m, width)} (torch.uint8) does not hold {n} rows",)
    elif kind == "destination_width":
        w = draw(st.integers(1, 2 * width).filter(lambda w: w != width))
        args[1] = staging[: n * w].view(n, w)
        expect = (f"gather destination {(n, w)} (torch.uint8) does not hold {n} rows",)
    elif kind == "destination_dtype":  # 16-byte elements do not divide a 200-byte row
        args[1] = staging[: 16 * n].view(torch.complex128)
        expect = (f"gather row of {width} bytes", "cannot be reinterpreted as torch.complex128")
    elif kind == "destination_strided":
        args[1] = staging[: 2 * n * width].view(2 * n, width)[::2]
        expect = (f"gather destination must be contiguous, got strides {args[1].stride()}",)
    elif kind == "destination_overlaps_source":  # staging placed inside the device cache the rows come from
        offset = draw(st.integers(0, min(blocks * rows_per_block * width - 1, world.device_cache.numel() - n * width)))
        args[1] = world.device_cache[offset:offset + n * width].view(n, width)
        start = args[1].data_ptr()
        expect = (f"gather destination [{start:#x}, {start + n * width:#x}) overlaps the source's byte span",)
    elif kind == "destination_requires_grad":
        args[1] = torch.zeros(n, width // 4, dtype=torch.float32, requires_grad=True)
        expect = (f"gather destination {(n, width // 4)} (torch.float32) requires grad",)
    elif kind == "source_rank":
        args[0] = draw(st.sampled_from([source.view(total, width), source.view(-1), source.view(1, *GATHER_SHAPE)]))
        expect = (f"gather source must be [num_blocks, block_size, row_width], got shape {tuple(args[0].shape)}",)
    elif kind == "source_empty":
        args[0] = draw(st.sampled_from([source[:0], source[:, :0]]))
        expect = (f"gather source has no rows: shape {tuple(args[0].shape)}",)
    elif kind == "not_a_tensor":
        k = draw(st.integers(0, 2))
        args[k], type_name = _not_a_tensor(draw, args[k])
        expect = (f"gather '{('source', 'destination', 'row_ids')[k]}' must be a torch.Tensor, got {type_name}",)
    else:
        assert kind == "wrong_device", kind
        k = draw(st.integers(0, 2))
        args[k] = args[k].to(META)
        expect = ((f"gather {('source', 'destination')[k]} is on meta",) if k < 2
                  else ("must be on one device, got cpu, cpu, meta",))
    return BadCall("gathers", kind, "gather_resident_rows", tuple(args), InvalidArgumentError, expect)


@st.composite
def bad_registrations(draw: st.DrawFn, world: World, kind: str) -> BadCall:
    """A pin, unpin or region registration of ``kind`` that must be refused and leave every table as it was."""
    host = world.host.tensor
    pinned_lo = world.pool.data_ptr() - host.data_ptr()
    pinned_hi = pinned_lo + world.pool.numel() + world.neighbour.numel()
    member, error = "pin_tensor", InvalidArgumentError
    args: tuple[Any, ...]
    expect: tuple[str, ...]
    if kind == "pin_overlapping":
        lo = draw(st.integers(0, pinned_hi - 1))
        hi = draw(st.integers(max(lo, pinned_lo) + 1, host.numel()))
        exact = {(pinned_lo, pinned_lo + world.pool.numel()), (pinned_lo + world.pool.numel(), pinned_hi)}
        if (lo, hi) in exact:
            hi += 1
        args = (host[lo:hi],)
        expect = (f"pin_tensor: tensor at {host.data_ptr() + lo:#x} ({hi - lo} bytes) overlaps known region",)
    elif kind == "pin_again":
        tensor = draw(st.sampled_from([world.pool, world.neighbour]))
        args = (tensor,)
        expect = (f"tensor at {tensor.data_ptr():#x} ({tensor.numel()} bytes) is already pinned",)
    elif kind == "pin_bad_tensor":
        problem = draw(st.sampled_from(["strided", "empty", "not_a_tensor", "meta"]))
        if problem == "strided":
            args = (world.unpinned.view(32, 32).t(),)
            expect = ("tensor must be contiguous, got strides (1, 32)",)
        elif problem == "empty":
            args = (world.unpinned[:0],)
            expect = ("tensor is empty (shape (0,))",)
        elif problem == "meta":
            args = (world.unpinned.to(META),)
            expect = ("tensor must be in host memory, got device meta",)
        else:
            value, type_name = _not_a_tensor(draw, world.unpinned[:4])
            args = (value,)
            expect = (f"expected a torch.Tensor, got {type_name}",)
    elif kind == "unpin_not_pinned":
        member = "unpin_tensor"
        choice = draw(st.sampled_from(["unpinned", "released", "part_of_pool"]))
        tensor = {"unpinned": world.unpinned, "released": world.released,
                  "part_of_pool": world.pool[: draw(st.integers(1, world.pool.shape[0] - 1))]}[choice]
        args = (tensor,)
        expect = (f"unpin_tensor: tensor at {tensor.data_ptr():#x} ({tensor.numel()} bytes) was not pinned",)
    elif kind == "registration_of_unpinned":
        member = "host_registration"
        tensor = draw(st.sampled_from([world.unpinned, world.released]))
        args = (tensor,)
        expect = (f"tensor at {tensor.data_ptr():#x} ({tensor.numel()} bytes) is not pinned",)
    elif kind == "unregister_unknown":
        member = "unregister_region"
        region = draw(st.sampled_from([r for r in world.backend.regions if r.kind == "pinned_host"]
                                      + [Region(world.unpinned.data_ptr(), 64, "explicit", "never registered")]))
        args = (region,)
        expect = (f"unregister_region: {region.label!r} was not registered explicitly",)
    else:
        member = "register_region"
        address, size, expect = _bad_region(draw, kind, world)
        args = (address, size, f"bad {kind}")
    return BadCall("registrations", kind, member, args, error, expect)


def _bad_region(draw: st.DrawFn, kind: str, world: World) -> tuple[Any, Any, tuple[str, ...]]:
    free = world.unpinned.data_ptr()
    if kind == "region_bad_size":
        size = draw(st.integers(-(2**70), 0))
        return free, size, (f"must have size > 0, got {size}",)
    if kind == "region_negative_address":
        address = draw(st.integers(-(2**70), -1))
        return address, draw(st.integers(1, 4096)), (f"has negative start address {address}",)
    if kind == "region_overlapping":
        region = draw(st.sampled_from(list(world.backend.regions)))
        address = region.start + draw(st.integers(-64, region.size - 1))
        return address, draw(st.integers(65, 8192)), (f"[{address:#x},", "overlaps known region")
    if kind == "region_past_int64":
        address = draw(st.integers(1 << 60, 2**66))
        size = draw(st.integers(max(1, 2**63 - address), 2**66))
        return address, size, (f"[{address:#x}, {address + size:#x})", "beyond the largest address")
    assert kind == "region_not_an_int", kind
    bad = draw(st.sampled_from([1.5, "0x1000", None, True, False, torch.tensor(4096)]))
    which = draw(st.sampled_from(["address", "size"]))
    pair: tuple[object, object] = (bad, 64) if which == "address" else (free, bad)
    return pair[0], pair[1], (f"got {pair[0]!r}, {pair[1]!r}",)


@dataclasses.dataclass
class Overlapping:
    """A swap batch whose descriptors depend on each other: a destination overlaps another
    descriptor's source or destination. Accepted by the contract (see ``swap_blocks_batch``)."""

    rows: list[tuple[int, int, int]]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return tuple(_i64([row[k] for row in self.rows]) for k in range(3))  # type: ignore[return-value]


@st.composite
def overlapping_swaps(draw: st.DrawFn, world: World) -> Overlapping:
    """Two to six descriptors in the device cache and the first pool chunk, the second one's destination
    overlapping the first one's destination or source."""
    roles = world.swap_regions()
    regions = [roles["device"], roles["pool_chunk1"]]
    first = draw(_valid_descriptor(regions))
    size = draw(st.integers(1, 2 * BLOCK))
    target = draw(st.sampled_from([0, 1]))  # overlap the first destination, or the first source
    anchor = first[1] if target == 0 else first[0]
    region = next(r for r in regions if r.start <= anchor < r.end)
    lo = max(region.start, anchor - size + 1)
    hi = min(region.end - size, anchor + first[2] - 1)
    second_dst = draw(st.integers(lo, hi))
    src_region = draw(st.sampled_from(regions))
    second = (src_region.start + draw(st.integers(0, src_region.size - size)), second_dst, size)
    rest = draw(st.lists(_valid_descriptor(regions), max_size=4))
    return Overlapping([first, second, *rest])

