"""Starting the command: ``--help`` and usage errors import no torch (each subcommand's options are added only
when it is asked for), every subcommand has a description, and ``python -m hisparse_hal`` is the same command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

_NO_TORCH = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch was imported while the command line was parsed")
        return None
sys.meta_path.insert(0, _NoTorch())
"""


def _script() -> str:
    found = shutil.which("hisparse-hal", path=str(Path(sys.executable).parent)) or shutil.which("hisparse-hal")
    assert found, "the hisparse-hal console script is not installed (pip install -e '.[test]')"
    return found


def _without_torch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """The console script with torch made unimportable (a sitecustomize on PYTHONPATH)."""
    (tmp_path / "sitecustomize.py").write_text(_NO_TORCH)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HISPARSE_HAL_")}
    env["PYTHONPATH"] = str(tmp_path)
    return subprocess.run([_script(), *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", [["--help"], ["info", "--help"], ["conformance", "--help"], ["bench", "--help"],
                                  ["scenario", "--help"], ["vllm-check", "--help"], ["--version"]])
def test_help_imports_no_torch(tmp_path, args):
    done = _without_torch(tmp_path, *args)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
    assert "usage: hisparse-hal" in done.stdout or "hisparse-hal " in done.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["bench", "--repeats", "x"], "argument --repeats: invalid int value: 'x'"),
    (["nosuch"], "invalid choice: 'nosuch'"),
])
def test_a_parse_error_imports_no_torch(tmp_path, args, message):
    done = _without_torch(tmp_path, *args)
    assert done.returncode == 2 and message in done.stderr and "torch was imported" not in done.stderr


def test_the_command_runs_the_package_init_after_parsing(tmp_path):
    done = _without_torch(tmp_path, "info")
    assert done.returncode != 0 and "torch was imported while the command line was parsed" in done.stderr


def test_every_subcommand_has_a_description():
    from hisparse_hal.cli import SUBCOMMANDS, build_parser

    parser = build_parser()
    actions = next(a for a in parser._actions if a.dest == "command")
    for name, summary in SUBCOMMANDS.items():
        assert actions.choices[name].description == summary[0].upper() + summary[1:] + "."  # type: ignore[index]
    text = " ".join(parser.format_help().split())
    assert all(" ".join(summary.split()) in text for summary in SUBCOMMANDS.values())


def test_python_dash_m_hisparse_hal_is_the_command():
    env = {k: v for k, v in os.environ.items() if not k.startswith("HISPARSE_HAL_")}
    done = subprocess.run([sys.executable, "-m", "hisparse_hal", "bench", "--requests", "64"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["hisparse-hal bench: --requests is an option of --cache-ops; add --cache-ops "
                                        "or drop --requests"]
    version = subprocess.run([sys.executable, "-m", "hisparse_hal", "--version"], env=env, capture_output=True,
                             text=True, timeout=120)
    assert version.returncode == 0 and version.stdout.startswith("hisparse-hal ")
