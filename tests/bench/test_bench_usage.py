"""``hisparse-hal bench``: one mode per run, no option of another mode, an interrupt that keeps the cases already
measured, and no profiler noise in the table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from hisparse_hal import cli
from hisparse_hal.bench import cache_ops

PREFIX = "hisparse-hal bench: "


@pytest.fixture
def main(monkeypatch):
    """``cli.main`` in this process, with this process's SIGTERM handler put back afterwards."""
    previous = signal.getsignal(signal.SIGTERM)
    monkeypatch.delenv("HISPARSE_HAL_BACKEND", raising=False)
    yield cli.main
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize(("args", "line"), [
    (["--submission", "--cache-ops"], "--cache-ops and --submission are separate benchmarks; run one at a time"),
    (["--pinning", "--submission", "--cache-ops"],
     "--cache-ops, --pinning and --submission are separate benchmarks; run one at a time"),
    (["--requests", "64"], "--requests is an option of --cache-ops; add --cache-ops or drop --requests"),
    (["--queries", "1,2,4"], "--queries is an option of --cache-ops; add --cache-ops or drop --queries"),
    (["--no-oracle"], "--no-oracle is an option of --cache-ops; add --cache-ops or drop --no-oracle"),
    (["--pin-mib", "8"], "--pin-mib is an option of --pinning; add --pinning or drop --pin-mib"),
    (["--cache-ops", "--pin-chunks", "4096"], "--pin-chunks does nothing with --cache-ops: it is an option of "
                                              "--pinning"),
    (["--submission", "--swap-mib", "64"], "--swap-mib does nothing with --submission: it is an option of the "
                                           "swap benchmark (no mode option)"),
])
def test_options_of_another_mode_are_one_line_before_any_work(main, capsys, args, line):
    assert main(["bench", *args]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.splitlines() == [PREFIX + line]


def test_the_help_shows_the_defaults_and_the_submission_raise(main, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "median reported (default 5; --submission uses at least 50)" in text
    assert "(--cache-ops; default 8192)" in text and "(raises --repeats to at least 50)" in text


# A real Ctrl-C raises KeyboardInterrupt() without a message; the CLI's SIGTERM handler names its signal.
@pytest.mark.parametrize("interrupt", [KeyboardInterrupt(), KeyboardInterrupt("SIGINT")], ids=["ctrl_c", "named"])
def test_an_interrupt_keeps_the_cases_already_measured_in_json_marked_incomplete(main, capsys, monkeypatch, tmp_path,
                                                                                   interrupt):
    real = cache_ops.bench_case
    calls = []

    def first_then_interrupt(case, backend, plan):
        calls.append(case)
        if len(calls) > 1:
            raise interrupt
        return real(case, backend, {"torch_impl": 1, "host_impl": 1})

    monkeypatch.setattr(cache_ops, "bench_case", first_then_interrupt)
    target = tmp_path / "b.json"
    code = main(["bench", "--backend", "cpu", "--cache-ops", "--requests", "1,2", "--queries", "1",
                 "--context", "2304", "--repeats", "1", "--no-oracle", "--json", str(target)])
    assert code == 130
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err[-1] == (PREFIX + f"interrupted (SIGINT); the 1 case(s) measured so far are in {target}, "
                       "marked incomplete")
    doc = json.loads(target.read_text())
    assert doc["incomplete"] is True and doc["incomplete_reason"] == "interrupted (SIGINT) after 1 of 2 cases"
    assert {f["implementation"] for f in doc["figures"]} == {"torch_impl", "host_impl"}
    assert {f["case"]["requests"] for f in doc["figures"]} == {1}


def test_an_interrupt_before_any_case_writes_no_json(main, capsys, monkeypatch, tmp_path):
    def interrupt(case, backend, plan):
        raise KeyboardInterrupt("SIGTERM")

    monkeypatch.setattr(cache_ops, "bench_case", interrupt)
    target = tmp_path / "b.json"
    assert main(["bench", "--backend", "cpu", "--cache-ops", "--requests", "1", "--queries", "1",
                 "--context", "2304", "--repeats", "1", "--no-oracle", "--json", str(target)]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        PREFIX + "interrupted (SIGTERM); no case had finished; no --json file was written")
    assert not target.exists()


def test_the_cpu_peak_memory_measure_prints_no_profiler_markers():
    code = ("import os, torch; from hisparse_hal.bench.cache_ops import _peak_extra_bytes; "
            "print(_peak_extra_bytes(lambda: torch.ones(1 << 16), torch.device('cpu'))); "
            "print(os.environ.get('KINETO_LOG_LEVEL'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"})
    assert done.returncode == 0, done.stderr[-2000:]
    peak, level_after = done.stdout.split()
    assert int(peak) >= 4 << 16
    assert level_after == "None"  # the caller's environment as it was: nothing inherited by a library caller
    assert "USDT" not in done.stderr and "profiler_start" not in done.stderr, done.stderr


def test_a_kineto_level_the_user_set_is_kept_while_profiling_and_after(monkeypatch):
    monkeypatch.setenv("KINETO_LOG_LEVEL", "3")
    with cache_ops._quiet_kineto():
        assert os.environ["KINETO_LOG_LEVEL"] == "3"
    assert os.environ["KINETO_LOG_LEVEL"] == "3"
    monkeypatch.delenv("KINETO_LOG_LEVEL")
    with cache_ops._quiet_kineto():
        assert os.environ["KINETO_LOG_LEVEL"] == "6"
    assert "KINETO_LOG_LEVEL" not in os.environ
