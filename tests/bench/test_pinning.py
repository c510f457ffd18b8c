"""``bench --pinning`` (``hisparse_hal/bench/pinning.py``): one pin and unpin per chunk size, nothing left pinned."""

from __future__ import annotations

import mmap

import torch

from hisparse_hal.bench.pinning import format_figures, measure


def test_measure_pins_in_the_asked_chunks_and_leaves_nothing_pinned():
    pool = torch.zeros(16 * mmap.PAGESIZE, dtype=torch.uint8)
    figures = measure(pool, mmap.PAGESIZE)
    assert (figures.pool_bytes, figures.chunk_bytes, figures.chunks) == (pool.numel(), mmap.PAGESIZE, 16)
    assert figures.pin_s >= 0 and figures.unpin_s >= 0
    lines = format_figures([figures])
    assert lines[0].split()[:3] == ["pool", "chunk", "chunks"] and " 16 " in lines[1]
    again = measure(pool, 4 * mmap.PAGESIZE)  # pinnable again: the first run released everything
    assert again.chunks == 4
