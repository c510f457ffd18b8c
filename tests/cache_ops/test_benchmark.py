"""``hisparse-hal bench --cache-ops``: the case builder and its agreement check, on a tiny case (not timed)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the Triton kernels are first defined

import pytest  # noqa: E402

from hisparse_hal.bench.arguments import positive_ints  # noqa: E402
from hisparse_hal.bench.cache_ops import CacheOpsCase, bench_case  # noqa: E402
from hisparse_hal.cli import build_parser  # noqa: E402
from hisparse_hal.errors import InvalidArgumentError  # noqa: E402
from hisparse_hal.vendors.cpu.backend import CpuBackend  # noqa: E402


def test_bench_case_runs_every_implementation_on_one_state_and_they_agree() -> None:
    pytest.importorskip("triton")
    case = CacheOpsCase(requests=3, context=256, top_k=64, slots=128)
    figures = bench_case(case, CpuBackend(), {"oracle": 1, "host_impl": 1, "torch_impl": 1, "triton_impl": 1})
    assert [f.implementation for f in figures] == ["oracle", "host_impl", "torch_impl", "triton_impl"]
    assert all(f.matches_torch for f in figures)
    # 10% of each request's 64 rows are new after the warm-up step: 6 misses per request, 656 bytes each
    assert {f.rows_copied for f in figures} == {18} and figures[0].bytes_copied == 18 * 656
    assert all(f.resolve_s > 0 and f.compact_s > 0 and f.one_copy_s > 0 for f in figures)


def test_bench_case_measures_peak_memory_and_kernel_launches_of_the_torch_based_implementations() -> None:
    case = CacheOpsCase(requests=3, context=256, top_k=64, queries=2)  # MTP: 6 rows, (2 + 1) x 64 hot slots
    figures = {f.implementation: f for f in bench_case(case, CpuBackend(), {"host_impl": 1, "torch_impl": 1})}
    assert case.hot_slots == 192 and all(f.matches_torch for f in figures.values())
    host, fixed = figures["host_impl"], figures["torch_impl"]
    # host's resolve and gathers are numpy passes: its count is the few aten kernels left (classify rows, stats)
    assert host.launches is not None and fixed.launches is not None and 0 < host.launches < fixed.launches
    # torch's gather holds its int64 index arrays and rounds of rows; host's holds only the rows it copies
    assert fixed.compact_peak_bytes is not None and host.compact_peak_bytes is not None
    assert 0 < host.compact_peak_bytes < fixed.compact_peak_bytes
    assert fixed.resolve_peak_bytes is not None and fixed.resolve_peak_bytes > 6 * 64 * 8
    assert host.resolve_peak_bytes is not None and host.resolve_peak_bytes <= fixed.resolve_peak_bytes  # runs, not rows


def test_bench_case_rejects_a_context_shorter_than_the_top_k() -> None:
    with pytest.raises(InvalidArgumentError, match=r"context \(32\) must be >= top_k \(64\)"):
        bench_case(CacheOpsCase(requests=1, context=32, top_k=64), CpuBackend(), {"torch_impl": 1})


def test_requests_option_parses_counts_and_rejects_garbage() -> None:
    assert positive_ints("64, 128", "--requests") == [64, 128]
    expected = "--requests must be positive integers separated by commas, got '64,x'"
    with pytest.raises(InvalidArgumentError, match=expected):
        positive_ints("64,x", "--requests")


def test_bench_command_takes_the_cache_ops_options() -> None:
    args = build_parser().parse_args(["bench", "--cache-ops", "--requests", "64", "--no-oracle"])
    assert args.cache_ops and args.requests == "64" and args.no_oracle and args.repeats == 5
    assert build_parser().parse_args(["bench", "--cache-ops"]).queries == "1,2,4"
