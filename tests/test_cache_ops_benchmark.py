"""``hisparse-hal bench --cache-ops``: the case builder and its agreement check, on a tiny case (not timed)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the Triton kernels are first defined

import pytest  # noqa: E402

from hisparse_hal.bench.cache_ops import CacheOpsCase, _requests, bench_case  # noqa: E402
from hisparse_hal.cli import build_parser  # noqa: E402
from hisparse_hal.errors import InvalidArgumentError  # noqa: E402
from hisparse_hal.vendors.cpu.backend import CpuBackend  # noqa: E402


def test_bench_case_runs_every_implementation_on_one_state_and_they_agree() -> None:
    pytest.importorskip("triton")
    case = CacheOpsCase(requests=3, context=256, top_k=64, slots=128)
    figures = bench_case(case, CpuBackend(), {"oracle": 1, "torch_impl": 1, "triton_impl": 1})
    assert [f.implementation for f in figures] == ["oracle", "torch_impl", "triton_impl"]
    assert all(f.matches_torch for f in figures)
    # 10% of each request's 64 rows are new after the warm-up step: 6 misses per request, 656 bytes each
    assert {f.rows_copied for f in figures} == {18} and figures[0].bytes_copied == 18 * 656
    assert all(f.resolve_s > 0 and f.compact_s > 0 and f.one_copy_s > 0 for f in figures)


def test_bench_case_rejects_a_context_shorter_than_the_top_k() -> None:
    with pytest.raises(InvalidArgumentError, match=r"context \(32\) must be >= top_k \(64\)"):
        bench_case(CacheOpsCase(requests=1, context=32, top_k=64, slots=128), CpuBackend(), {"torch_impl": 1})


def test_requests_option_parses_counts_and_rejects_garbage() -> None:
    assert _requests("64, 128") == [64, 128]
    expected = "--requests must be positive integers separated by commas, got '64,x'"
    with pytest.raises(InvalidArgumentError, match=expected):
        _requests("64,x")


def test_bench_command_takes_the_cache_ops_options() -> None:
    args = build_parser().parse_args(["bench", "--cache-ops", "--requests", "64", "--no-oracle"])
    assert args.cache_ops and args.requests == "64" and args.no_oracle and args.repeats == 5
