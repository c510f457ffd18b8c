"""tests/conftest.py gives each xdist worker one torch thread; a single-process run keeps torch's default."""

from __future__ import annotations

import os

import pytest
import torch

from tests.conftest import XDIST_WORKER_ENV, torch_threads_for


def test_an_xdist_worker_gets_one_torch_thread_and_a_plain_run_the_default() -> None:
    assert torch_threads_for({XDIST_WORKER_ENV: "gw1"}) == 1
    assert torch_threads_for({}) is None
    assert torch_threads_for({XDIST_WORKER_ENV: ""}) is None


@pytest.mark.skipif(not os.environ.get(XDIST_WORKER_ENV), reason="runs under pytest -n (an xdist worker) only")
def test_this_xdist_worker_runs_one_torch_thread() -> None:
    assert torch.get_num_threads() == 1
