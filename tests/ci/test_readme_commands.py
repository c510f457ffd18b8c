"""CI runs the README's commands as written: ``.ci/run`` reads the ``main`` and ``tests`` blocks out of README.md
with ci/readme_commands.py, so the text a reader copies is the text CI runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _command(label: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "ci" / "readme_commands.py"), label], capture_output=True,
                          text=True, timeout=60)


def test_ci_runs_the_readmes_main_and_test_commands_verbatim():
    main, tests = _command("main"), _command("tests")
    assert main.returncode == tests.returncode == 0, main.stderr + tests.stderr
    assert main.stdout.strip() == "pip install torch==2.13.0 && pip install '.[test]' && hisparse-hal conformance"
    assert "pip install -e '.[test,lint,triton]'" in tests.stdout and "python -m pytest" in tests.stdout
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert 'bash -euo pipefail -c "$tests_command"' in ci and 'bash -euo pipefail -c "$main_command"' in ci
    assert ci.index("deactivate") < ci.index('-c "$main_command"'), "the main command must run in the second venv"


def test_an_unknown_label_fails_naming_the_known_ones():
    done = _command("nope")
    assert done.returncode != 0 and "no block labelled 'nope'" in done.stderr and "'main'" in done.stderr


def test_a_label_marking_two_blocks_is_an_error():
    sys.path.insert(0, str(REPO / "ci"))
    try:
        import readme_commands
    finally:
        sys.path.remove(str(REPO / "ci"))
    text = "<!-- ci: a -->\n```sh\necho 1\n```\n<!-- ci: a -->\n```sh\necho 2\n```\n"
    with pytest.raises(SystemExit, match="label 'a' marks two blocks"):
        readme_commands.commands(text)
    assert readme_commands.commands(text.replace("ci: a -->\n```sh\necho 2", "ci: b -->\n```sh\necho 2")) == {
        "a": "echo 1", "b": "echo 2"}
