"""The benchmark's helpers: submission-cost harness over the simulated drivers, the plain marshalling it is
compared with, and the swap plot. These check behaviour and output, never speed."""

from __future__ import annotations

import ctypes

import pytest

from hisparse_hal.bench import plot as bench_plot
from hisparse_hal.bench import submission as submission_bench
from hisparse_hal.bench.swaps import SwapFigure
from hisparse_hal.errors import BackendUnavailableError, InvalidDescriptorError


def test_plain_marshalling_builds_the_vendor_arrays_without_zero_byte_copies():
    regions = [(100, 200), (1000, 2000)]
    dst, src, sizes = submission_bench.plain_marshalling(regions, [100, 150, 120], [1000, 1500, 1900], [50, 0, 80])
    assert (list(dst), list(src), list(sizes)) == ([1000, 1900], [100, 120], [50, 80])
    assert isinstance(dst, ctypes.Array) and dst._type_ is ctypes.c_uint64


def test_plain_marshalling_rejects_a_descriptor_past_its_region_naming_it():
    with pytest.raises(InvalidDescriptorError, match=r"swap descriptor 1 at 0x96 \(60 bytes\) is outside every region"):
        submission_bench.plain_marshalling([(100, 200), (1000, 2000)], [100, 150], [1000, 1100], [50, 60])


def test_submission_bench_drives_both_simulated_backends_and_chunks_at_the_cap():
    figures = submission_bench.bench_submission(repeats=2, counts=(64, 8192 + 64))
    rows = {(f.backend, f.descriptors): f for f in figures}
    assert rows[("cuda (simulated driver 12.8)", 64)].vendor_calls == 1
    assert rows[("cuda (simulated driver 12.8)", 8192 + 64)].vendor_calls == 2  # the 8,192 cap
    assert rows[("rocm (simulated HIP 7.14)", 8192 + 64)].vendor_calls == 2
    assert rows[("rocm (simulated HIP 7.14), sources in 4 regions", 64)].vendor_calls == 1
    assert rows[("cuda (simulated driver 12.8), sources in 61 regions", 8192 + 64)].vendor_calls == 2
    assert rows[("rocm (simulated HIP 7.14), sources in 61 regions", 64)].vendor_calls == 1
    assert all(f.ours_best_us > 0 and f.plain_us > 0 for f in figures)
    assert submission_bench.marginal_ns(figures, "cuda (simulated driver 12.8)") is not None


def _figures() -> list[SwapFigure]:
    return [SwapFigure(656, 1000, 4.0, 0.7, "python memmove loop", 12.0, 300.0),
            SwapFigure(65536, 100, 11.0, 8.0, "python memmove loop", 14.0, 30.0)]


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "swaps.png"
    bench_plot.plot_swaps(_figures(), str(path), "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_names_the_extra(monkeypatch, tmp_path):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(BackendUnavailableError, match=r"from the checkout with: pip install -e '\.\[plot\]'"):
        bench_plot.plot_swaps(_figures(), str(tmp_path / "x.png"), "test")
