"""The shared host pool (``scenario/pool.py``): its file can be unlinked while mapped, it tells a lost rank from
none, and its mapping lives as long as a tensor views it."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

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


# A process that closes its pool, then reads and prints a view of the data it still holds, as pytest does when it
# formats a traceback whose frames hold the pool's tensors (issue 30 item 9: that read used to hit unmapped memory).
_READ_AFTER_CLOSE = """
import torch
from hisparse_hal.scenario.pool import SharedPool
path = SharedPool.create(1, 4, 4096)
pool = SharedPool(path, 0, 1, 4, 4096)
SharedPool.unlink(path)
data, control = pool.data, pool.control
data[3, -4:] = torch.tensor([7, 8, 9, 10], dtype=torch.uint8)
pool.close()
print(repr(data[3, -4:]), int(control[0]))
del data, control
print("released")
"""


def test_a_view_of_a_closed_pool_stays_readable_until_it_is_dropped():
    done = subprocess.run([sys.executable, "-c", _READ_AFTER_CLOSE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Fatal Python error" not in done.stderr, (done.returncode, done.stderr[-2000:])
    assert done.stdout.splitlines() == ["tensor([ 7,  8,  9, 10], dtype=torch.uint8) -1", "released"]


def test_the_drivers_control_view_keeps_its_mapping(tmp_path):
    from hisparse_hal.scenario.driver import _map_control

    path = SharedPool.create(2, 1, 4096)
    try:
        control = _map_control(path)[:4]  # a slice: the only reference left to the mapping
    finally:
        SharedPool.unlink(path)
    gc.collect()
    assert control.tolist() == [-1, -1, -1, -1]
