"""The installed ``hisparse-hal`` console script's contract (issue 24): exit codes 0 ok, 1 tests or checks failed,
2 usage or environment, 130 interrupted, the same in every subcommand; an error is one line, never a traceback;
outputs, optional extras, parameters and ``HISPARSE_HAL_*`` values are checked before any work starts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hisparse_hal.bench.arguments import min_context
from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.memory_budget import check_fits
from hisparse_hal.output_checks import require_module, writable_directory, writable_file


def _script() -> str:
    found = shutil.which("hisparse-hal", path=str(Path(sys.executable).parent)) or shutil.which("hisparse-hal")
    assert found, "the hisparse-hal console script is not installed (pip install -e '.[test]')"
    return found


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HISPARSE_HAL_")}
    environ.update(env or {})
    return subprocess.run([_script(), *args], env=environ, capture_output=True, text=True, timeout=timeout)


def _one_line_error(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


# ------------------------------------------------------------------------------ in-process checks (fast)
def test_an_existing_file_is_refused_as_a_report_folder(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(InvalidArgumentError, match=r"--report '.*f' is an existing file"):
        writable_directory(tmp_path / "f", "--report")


def test_a_folder_is_refused_as_an_output_file(tmp_path):
    with pytest.raises(InvalidArgumentError, match="--junit '.*' is a folder"):
        writable_file(tmp_path, "--junit")


def test_an_output_under_proc_is_refused_before_the_run():
    with pytest.raises(InvalidArgumentError, match="--json '/proc/x.json': cannot write in '/proc'"):
        writable_file("/proc/x.json", "--json")


def test_a_missing_extra_names_the_install_line_from_a_checkout():
    with pytest.raises(InvalidArgumentError, match=r"needs no_such_module_x.*pip install -e '\.\[plot\]'"):
        require_module("no_such_module_x", "plot", "bench --plot")


def test_a_size_over_the_available_memory_is_refused_with_both_figures():
    with pytest.raises(InvalidArgumentError, match="needs about 2.0 GiB of memory, but 1.0 GiB is available"):
        check_fits(2 << 30, "bench --swap-mib 700", available=1 << 30)


def test_the_smallest_cache_ops_context_leaves_room_for_the_rows_that_change():
    assert min_context() == 2304  # 2048 + 204 changed rows, rounded up to a 64-token block


# ------------------------------------------------------------------------------ through the console script
def test_version():
    done = _run("--version")
    assert done.returncode == 0 and done.stdout.startswith("hisparse-hal 0.")


def test_help_documents_the_exit_codes():
    done = _run("--help")
    assert done.returncode == 0 and "130 interrupted" in " ".join(done.stdout.split())


@pytest.mark.parametrize("args,message", [
    (["--repeats", "0"], "--repeats must be at least 1, got 0"),
    (["--swap-mib", "0"], "--swap-mib must be at least 1 (MiB per swap case), got 0"),
    (["--swap-mib", "100000000"], "bench --swap-mib 100000000 needs about"),
    (["--cache-ops", "--requests", "4,x"], "--requests must be positive integers separated by commas, got '4,x'"),
    (["--cache-ops", "--queries", "0"], "--queries must be positive integers separated by commas, got '0'"),
    (["--cache-ops", "--requests", "4", "--context", "2048"], "--context must be a multiple of 64 and at least 2304"),
    (["--cache-ops", "--requests", "100000"], "needs about"),
    (["--json", "/proc/x.json"], "--json '/proc/x.json': cannot write in '/proc'"),
    (["--pinning", "--pin-chunks", "4096,0"],
     "--pin-chunks must be positive integers separated by commas, got '4096,0'"),
    (["--pinning", "--pin-mib", "0"], "--pin-mib must be at least 1 (MiB of host pool), got 0"),
    (["--pinning", "--pin-mib", "100000000"], "bench --pinning --pin-mib 100000000 needs about"),
])
def test_bench_refuses_a_bad_value_in_one_line_before_measuring(args, message):
    done = _run("bench", "--backend", "cpu", *args, timeout=120)
    assert done.returncode == 2 and message in _one_line_error(done) and done.stdout == ""


def test_conformance_refuses_a_file_as_report_folder_before_running(tmp_path):
    (tmp_path / "afile").write_text("")
    done = _run("conformance", "--backend", "cpu", "-k", "test_probe", "--report", str(tmp_path / "afile"))
    assert done.returncode == 2 and "is an existing file" in _one_line_error(done)
    assert "INTERNALERROR" not in done.stdout


def test_conformance_refuses_a_folder_as_junit_file_before_running(tmp_path):
    done = _run("conformance", "--backend", "cpu", "--junit", str(tmp_path))
    assert done.returncode == 2 and "--junit" in _one_line_error(done) and "is a folder" in done.stderr


def test_scenario_refuses_a_folder_as_json_file_before_starting_ranks(tmp_path):
    done = _run("scenario", "--backend", "cpu", "--ranks", "2", "--steps", "5", "--json", str(tmp_path))
    assert done.returncode == 2 and "--json" in _one_line_error(done) and done.stdout == ""


def test_scenario_refuses_more_ranks_than_the_pool_holds():
    done = _run("scenario", "--ranks", "500")
    assert done.returncode == 2 and "--ranks must be at most 127" in _one_line_error(done)


def test_a_bad_cache_ops_variable_is_an_environment_error_naming_it():
    done = _run("info", env={"HISPARSE_HAL_CACHE_OPS": "bogus"})
    line = _one_line_error(done)
    assert done.returncode == 2 and "HISPARSE_HAL_CACHE_OPS must be one of" in line and "'bogus'" in line


def test_a_bad_event_timeout_fails_conformance_before_any_test():
    done = _run("conformance", "--backend", "cpu", env={"HISPARSE_HAL_EVENT_TIMEOUT_S": "-3"})
    assert done.returncode == 2 and "HISPARSE_HAL_EVENT_TIMEOUT_S must be" in _one_line_error(done)


def test_an_unknown_backend_is_a_usage_error_in_info_as_everywhere():
    done = _run("info", "--backend", "nvidia")
    assert done.returncode == 2 and "unknown backend 'nvidia'" in _one_line_error(done)


def test_info_json_fails_like_info_when_no_backend_can_be_chosen():
    done = _run("info", "--json", env={"HISPARSE_HAL_BACKEND": "cuda"})
    assert done.returncode == 2 and json.loads(done.stdout)["chosen"] is None


@pytest.mark.parametrize("how", [["--backend", "cuda"], []])
def test_info_with_an_unavailable_named_backend_exits_2_like_every_command(how):
    done = _run("info", *how, env={} if how else {"HISPARSE_HAL_BACKEND": "CUDA"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "chosen: none" in done.stdout and "hint: install a build of torch for 'cuda'" in done.stdout


def test_info_exit_statuses_are_in_the_help():
    text = " ".join(_run("--help").stdout.split())
    assert "info prints its table in every case and exits 2 when the backend named by --backend or" in text


def test_info_shows_the_cache_ops_choice():
    done = _run("info")
    assert done.returncode == 0 and "cache ops: host" in done.stdout


def test_debug_shows_the_traceback():
    done = _run("--debug", "bench", "--repeats", "0")
    assert done.returncode == 2 and "Traceback" in done.stderr and "--repeats must be at least 1" in done.stderr


def test_kernels_without_triton_names_the_extra():
    code = ("import sys; sys.modules['triton'] = None; from hisparse_hal.cli import main; "
            "sys.exit(main(['kernels', '--targets', 'sm_90']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "pip install -e '.[triton]'" in _one_line_error(done)


def test_pytest_args_may_start_with_a_dash(tmp_path):
    done = _run("conformance", "--backend", "cpu", "-k", "probe", "--expectations", "none",
                "--pytest-args", "-q", "--report", str(tmp_path / "r"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    selection = json.loads((tmp_path / "r" / "results.json").read_text())["selection"]
    assert selection["pytest_args"] == "-q" and selection["keyword"] == "probe"
    assert selection["deselected"] > 100 and selection["full_suite"] is False
    assert "PASS (partial)" in (tmp_path / "r" / "summary.md").read_text().splitlines()[0]


def test_a_keyword_that_matches_nothing_is_a_usage_error():
    done = _run("conformance", "--backend", "cpu", "-k", "no_such_test_anywhere", "--expectations", "none")
    assert done.returncode == 2


def test_kernels_reports_progress_off_a_terminal(capsys):
    from types import SimpleNamespace

    from hisparse_hal.kernels.command import _progress

    with _progress(4) as on_result:
        for i in range(4):
            on_result(SimpleNamespace(name=f"k[{i}]", target="sm_90"))  # type: ignore[arg-type]
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "  compiled 1/4 (last: k[0] for sm_90)" and lines[-1] == "  compiled 4/4 (last: k[3] for sm_90)"


def test_an_unknown_hisparse_variable_is_named_in_a_warning():
    done = _run("--debug", "bench", "--repeats", "0", env={"HISPARSE_HAL_BAKEND": "cpu"})
    assert "warning: HISPARSE_HAL_BAKEND is set but hisparse-hal reads no such variable" in done.stderr


@pytest.mark.parametrize(("name", "value", "default"), [
    ("HISPARSE_HAL_PIN_CHUNK_BYTES", "abc", "256 GiB"),
    ("HISPARSE_HAL_PIN_CHUNK_BYTES", "0", "256 GiB"),
    ("HISPARSE_HAL_CUDA_MAX_BATCH", "-1", "8192"),
])
def test_a_bad_number_setting_names_the_real_default(name, value, default):
    from hisparse_hal.environment_check import check_environment

    with pytest.raises(InvalidArgumentError) as caught:
        check_environment({name: value})
    assert str(caught.value).endswith(f"got {value!r}; unset it for the default ({default})")


def test_every_name_setting_is_read_case_insensitively(monkeypatch):
    from hisparse_hal.cache_ops.selection import implementation_for
    from hisparse_hal.integrations.vllm import requested_backend
    from hisparse_hal.registry import select_backend

    monkeypatch.setenv("HISPARSE_HAL_BACKEND", " CPU ")
    monkeypatch.setenv("HISPARSE_HAL_CACHE_OPS", "HOST")
    selection = select_backend()
    assert selection.chosen is not None and selection.chosen.name == "cpu"
    assert "HISPARSE_HAL_BACKEND='cpu'" in selection.explanation
    assert implementation_for("cpu").implementation == "host"
    assert requested_backend({"HISPARSE_HAL_VLLM_BACKEND": "Cpu"}) == "cpu"


@pytest.mark.parametrize(("args", "line"), [
    (["--ranks", "1"], "--ranks must be an int >= 2, got 1"),
    (["--steps", "0"], "--steps must be an int >= 1, got 0"),
    (["--kill", "5:10"], "--kill 5:10 names a rank outside [0, 2) or a step outside [0, 1000)"),
    (["--timeout", "0"], "--timeout must be a positive, finite number of seconds, got 0.0"),
    (["--timeout", "nan"], "--timeout must be a positive, finite number of seconds, got nan"),
    (["--timeout", "2e6"], "--timeout must be under 1e6 seconds, got 2000000.0"),
    (["--host-chunk-bytes", "0"], "--host-chunk-bytes must be a positive int, got 0"),
])
def test_scenario_errors_name_the_option_not_the_field(args, line, capsys):
    from hisparse_hal import cli

    assert cli.main(["scenario", "--backend", "cpu", *args]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.splitlines() == ["hisparse-hal scenario: " + line]
