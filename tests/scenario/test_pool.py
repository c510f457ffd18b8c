"""The shared host pool (``scenario/pool.py``): its file can be unlinked while mapped, and it tells a lost rank from
none."""

from __future__ import annotations

import os

import torch

from hisparse_hal.scenario.pool import SharedPool


def test_shared_pool_file_can_be_unlinked_while_mapped_and_reports_no_live_rank_lost(tmp_path):
    path = SharedPool.create(2, 4, 4096)
    try:
        pool = SharedPool(path, 0, 2, 4, 4096)
        assert pool.word(0) == -1 and pool.pid_of(0) == os.getpid() and pool.pid_of(1) == -1
        assert pool.lost_ranks() == []  # rank 1 never mapped the pool: not lost, not yet there
        assert SharedPool.unlink(path) and not os.path.exists(path)
        pool.data[0, :4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)  # the mapping outlives the name
        assert pool.data[0, :4].tolist() == [1, 2, 3, 4]
        pool.close()
    finally:
        SharedPool.unlink(path)
