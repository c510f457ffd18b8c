"""Bad input at scale: thousands of generated bad swap batches, gathers and registrations thrown at the
CPU device and at the CUDA and ROCm backends on their SIMULATED vendor libraries.

Every case must raise the typed error from ``hisparse_hal.errors`` whose message names the bad value
(and the first bad descriptor's index); afterwards every guard byte around every region, every
destination byte, the backend's region table, its pins and the simulated driver's registrations are
exactly as before, and no copy reached the (simulated) driver. Each test counts its cases per kind,
writes them to ``<pytest basetemp>/bad-input-counts/<area>-<backend>.json``, prints one line (``-s``)
and asserts the counts. The world's teardown proves nothing is left registered. One exception to
"refused at the call": GPU backends check gather row ids on the device, so an out-of-range id is
reported once by ``raise_gather_faults()`` and only the staging rows may differ (guards may not).

Overlapping descriptors (a destination overlapping another descriptor's source or destination) are
not bad input: the contract accepts them (see ``HiSparseBackend.swap_blocks_batch``). What this file
checks for them is that they stay memory-safe: bytes change only inside the batch's destinations, and
on the CPU device the result is the in-order one.
"""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hisparse_hal.testing.bad_input_strategies import (
    GATHER_KINDS,
    REGISTRATION_KINDS,
    SWAP_DESCRIPTOR_KINDS,
    SWAP_MALFORMED_KINDS,
    BadCall,
    Overlapping,
    bad_gathers,
    bad_registrations,
    bad_swaps,
    overlapping_swaps,
)
from hisparse_hal.testing.bad_input_worlds import BACKENDS, Arena, World, build_world

SWAP_KINDS = SWAP_DESCRIPTOR_KINDS + SWAP_MALFORMED_KINDS
#: Generated examples per test and backend; each example holds one case of every kind of its area
#: (three batches for "overlapping"), so every kind runs once per example.
EXAMPLES = {"swaps": 150, "gathers": 75, "registrations": 80, "overlapping": 50}
#: Cases each test must run on each backend: 3 x (2,100 + 975 + 880) = 11,865 bad calls in all.
MIN_CASES = {"swaps": 150 * len(SWAP_KINDS), "gathers": 75 * len(GATHER_KINDS),
             "registrations": 80 * len(REGISTRATION_KINDS), "overlapping": 150}


def _settings(area: str) -> settings:
    return settings(
        max_examples=EXAMPLES[area],
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


@pytest.fixture(scope="module", params=BACKENDS)
def world(request: pytest.FixtureRequest):
    built = build_world(request.param)
    yield built
    built.release()
    assert built.state() == ((), (), (), ()), f"{built.name}: registrations left behind: {built.state()}"
    for arena in built.arenas:
        assert arena.changed() is None, arena.changed()


def _refused(world: World, case: BadCall) -> None:
    """Run one bad call and check everything the contract promises about a refusal."""
    copies = world.driver_copies()
    deferred = False
    try:
        case.call(world)
        if case.kind == "id_out_of_range":
            # GPU backends check gather ids on the device and report through raise_gather_faults()
            # (no read-back in the gather); the destination then holds clamped rows, to be discarded.
            deferred = True
            world.backend.raise_gather_faults()
    except case.error as error:
        message = str(error)
        missing = [text for text in case.expect if text not in message]
        assert not missing, f"{world.name} {case.kind}: message {message!r} lacks {missing}"
        if case.index is not None:
            assert getattr(error, "index", None) == case.index, f"{case.kind}: index {error!r}"
    else:
        raise AssertionError(f"{world.name} {case.kind}: {case.member} accepted bad input {case.args!r}")
    if deferred:
        world.backend.raise_gather_faults()  # reported exactly once: the record is cleared
        guards = [change for change in map(Arena.changed, world.arenas) if change is not None and "GUARD" in change]
        assert not guards, f"{world.name} {case.kind}: {guards}"
        for arena in world.arenas:
            arena.restore()
    changed = [change for change in map(Arena.changed, world.arenas) if change is not None]
    assert not changed, f"{world.name} {case.kind}: {changed}"
    assert world.state() == world.start_state, f"{world.name} {case.kind}: registrations changed"
    assert world.driver_copies() == copies, f"{world.name} {case.kind}: a copy reached the driver"


def _report(tmp_path_factory: pytest.TempPathFactory, area: str, world: World, counts: collections.Counter[str],
            kinds: tuple[str, ...], seconds: float) -> None:
    total = sum(counts.values())
    folder = tmp_path_factory.getbasetemp() / "bad-input-counts"
    folder.mkdir(exist_ok=True)
    summary = {"area": area, "backend": world.name, "cases": total, "seconds": round(seconds, 2),
               "per_kind": dict(sorted(counts.items()))}
    (folder / f"{area}-{world.name}.json").write_text(json.dumps(summary, indent=2))
    print(f"\nbad input at scale: {area} on {world.name}: {total} cases in {seconds:.1f} s; "
          + ", ".join(f"{kind}={counts[kind]}" for kind in kinds))
    assert total >= MIN_CASES[area], summary
    assert set(counts) == set(kinds), f"{area} on {world.name}: kinds {set(kinds) ^ set(counts)}"


def _throw_all(world: World, tmp_path_factory, area: str, make: Callable[..., Any], kinds: tuple[str, ...]) -> None:
    """Throw every kind of ``area``'s bad call at ``world`` (each must be refused, nothing changed), then report."""
    counts: collections.Counter[str] = collections.Counter()

    @_settings(area)
    @given(st.tuples(*(make(world, kind) for kind in kinds)))
    def throw(cases: tuple[BadCall, ...]) -> None:
        for case in cases:
            _refused(world, case)
            counts[case.kind] += 1

    started = time.perf_counter()
    throw()
    _report(tmp_path_factory, area, world, counts, kinds, time.perf_counter() - started)


def test_bad_swap_batches_are_refused_whole_with_a_typed_error_naming_the_value(world, tmp_path_factory):
    _throw_all(world, tmp_path_factory, "swaps", bad_swaps, SWAP_KINDS)


def test_bad_gathers_are_refused_with_a_typed_error_and_leave_the_destination_untouched(world, tmp_path_factory):
    _throw_all(world, tmp_path_factory, "gathers", bad_gathers, GATHER_KINDS)


def test_bad_pins_unpins_and_regions_are_refused_and_leave_every_registration_table_unchanged(world, tmp_path_factory):
    _throw_all(world, tmp_path_factory, "registrations", bad_registrations, REGISTRATION_KINDS)


def _in_order_image(world: World, rows: list[tuple[int, int, int]]) -> list[torch.Tensor]:
    """Each arena after running ``rows`` one after another, each like memmove (the CPU device's rule)."""
    images = [arena.snapshot.clone() for arena in world.arenas]

    def locate(address: int, size: int) -> tuple[torch.Tensor, int]:
        for arena, image in zip(world.arenas, images, strict=True):
            base = arena.tensor.data_ptr()
            if base <= address and address + size <= base + arena.tensor.numel():
                return image, address - base
        raise AssertionError(f"{address:#x} is in no arena")

    for src, dst, size in rows:
        (source, s), (target, d) = locate(src, size), locate(dst, size)
        target[d:d + size] = source[s:s + size].clone()
    return images


def _check_overlapping(world: World, batch: Overlapping) -> None:
    """Run one overlapping batch: accepted, bytes change only inside its destinations, and on the CPU
    device the result is the in-order one; then put every arena back."""
    try:
        world.backend.swap_blocks_batch(*batch.tensors())
        expected = _in_order_image(world, batch.rows)
        for arena, image in zip(world.arenas, expected, strict=True):
            written = torch.zeros(arena.tensor.numel(), dtype=torch.bool)
            base = arena.tensor.data_ptr()
            for _, dst, size in batch.rows:
                if base <= dst < base + arena.tensor.numel():
                    written[dst - base:dst - base + size] = True
            stray = (arena.tensor != arena.snapshot) & ~written
            assert not bool(stray.any()), f"{world.name}: bytes outside the destinations changed in {arena.name}"
            if world.name == "cpu":
                assert torch.equal(arena.tensor, image), f"cpu: {arena.name} differs from the in-order result"
        assert world.state() == world.start_state
    finally:
        for arena in world.arenas:
            arena.restore()


def test_overlapping_descriptors_are_accepted_and_write_only_inside_their_destinations(world, tmp_path_factory):
    counts: collections.Counter[str] = collections.Counter()

    @_settings("overlapping")
    @given(st.lists(overlapping_swaps(world), min_size=3, max_size=3))
    def throw(batches: list[Overlapping]) -> None:
        for batch in batches:
            _check_overlapping(world, batch)
            counts["overlapping_descriptors"] += 1

    started = time.perf_counter()
    throw()
    _report(tmp_path_factory, "overlapping", world, counts, ("overlapping_descriptors",), time.perf_counter() - started)
