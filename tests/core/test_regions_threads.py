"""Shared backend state under threads (issue 30 item 5): swaps, captured-swap replays, pins, explicit
registrations and cache-op table registrations racing on one CPU backend with a tiny switch interval, a bounded
number of iterations each, asserting on the bytes moved and the tables left (no timing assertions)."""

from __future__ import annotations

import mmap
import sys
import threading
from collections.abc import Callable, Iterator

import pytest
import torch

from hisparse_hal.cache_ops import tables
from hisparse_hal.regions import Region, RegionTable
from hisparse_hal.vendors.cpu.backend import CpuBackend

PAGE = mmap.PAGESIZE
ROUNDS = 150


@pytest.fixture
def tiny_switch_interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _run_all(workers: list[Callable[[], None]]) -> list[str]:
    errors: list[str] = []

    def guarded(work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as error:  # noqa: BLE001 - reported to the test below
            errors.append(f"{work.__name__}: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=guarded, args=(work,), daemon=True) for work in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
        assert not thread.is_alive(), f"{thread.name} still running after its bounded rounds"
    return errors


def test_swaps_replays_pins_registrations_and_tables_race_without_a_spurious_error(tiny_switch_interval):
    backend = CpuBackend()
    backend.host_chunk_bytes = PAGE  # many regions per pin: every pin and unpin rebuilds a large table
    pool = torch.zeros(8, PAGE, dtype=torch.uint8)
    backend.pin_tensor(pool)
    staging = torch.zeros(8 * PAGE, dtype=torch.uint8)
    backend.register_region(staging.data_ptr(), staging.numel(), "staging")

    def swapper() -> None:
        for i in range(ROUNDS):
            block = i % 7  # block 7 of staging is the replayer's target
            staging[block * PAGE:(block + 1) * PAGE].fill_(i % 251)
            backend.swap_blocks_batch(torch.tensor([staging.data_ptr() + block * PAGE]),
                                      torch.tensor([pool.data_ptr() + block * PAGE]), torch.tensor([PAGE]))
            assert bool((pool[block] == i % 251).all()), f"round {i}: block {block} holds {pool[block][:4]}"

    def replayer() -> None:
        source = torch.full((PAGE,), 9, dtype=torch.uint8)
        backend.register_region(source.data_ptr(), PAGE, "replay source")
        target = staging[7 * PAGE:]
        with backend.capture() as graph:
            backend.swap_blocks_batch(torch.tensor([source.data_ptr()]), torch.tensor([target.data_ptr()]),
                                      torch.tensor([PAGE]))
        for i in range(ROUNDS):
            source.fill_(i % 251)
            graph.replay()
            assert bool((target == i % 251).all()), f"replay {i} moved the wrong bytes"

    def pinner() -> None:
        for i in range(ROUNDS // 3):
            scratch = torch.full((256, PAGE), i % 251, dtype=torch.uint8)
            backend.pin_tensor(scratch)
            assert backend.host_registration(scratch).size == 256 * PAGE
            backend.unpin_tensor(scratch)

    def registrar() -> None:
        for _ in range(ROUNDS):
            buffer = torch.zeros(PAGE, dtype=torch.uint8)
            region = backend.register_region(buffer.data_ptr(), PAGE, "racing explicit")
            assert backend.regions.find(buffer.data_ptr()) == region
            backend.unregister_region(region)

    def table_user() -> None:
        for _ in range(ROUNDS):
            table = torch.zeros(2, 4, dtype=torch.int32)
            tables.register_table(table)
            assert tables.table_at(table.data_ptr()) is table

    assert _run_all([swapper, replayer, pinner, registrar, table_user]) == []
    labels = sorted({r.label for r in backend.regions} - {"replay source"})
    assert labels == sorted({f"pinned host {pool.data_ptr():#x} chunk {k}/8" for k in range(1, 9)} | {"staging"})
    assert [r.address for r in backend.pinned_registrations()] == [pool.data_ptr()]


def test_iterating_a_table_while_another_thread_changes_it_always_sees_one_whole_generation(tiny_switch_interval):
    table = RegionTable()
    fixed = [Region(0x100000 + k * 0x2000, 0x1000, "explicit", f"fixed {k}") for k in range(2048)]
    table.update(add=fixed)

    def changer() -> None:
        for i in range(ROUNDS * 4):
            extra = Region(0x10000000 + (i % 7) * 0x1000, 0x800, "explicit", f"extra {i}")
            table.add(extra)
            table.remove(extra)

    def reader() -> None:
        for _ in range(ROUNDS * 4):
            seen = list(table)
            assert seen == sorted(seen, key=lambda r: r.start)
            assert set(fixed) <= set(seen) and len(seen) in (2048, 2049)

    assert _run_all([changer, reader, reader]) == []
