"""Must-pass lists (one per contract: every suite test id the contract takes) and the suite's hash.

Invariant: ``mustpass/<contract id>.txt`` equals what a collection of the installed suite gives for that contract
(the hisparse-hal contract: every test; a contract with an ``excludes_marker``: the tests without it). Regenerate
both with ``python -m hisparse_hal.conformance.mustpass --write``. The suite hash covers the test files and the
lists as installed, so a report records exactly which suite it ran.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hisparse_hal.errors import InvalidArgumentError

from . import SUITE_VERSION
from .contracts import CONTRACTS, MUSTPASS_DIR, Contract

__all__ = [
    "REGENERATE",
    "collect_suite",
    "contract_ids",
    "read_mustpass",
    "write_mustpass",
    "suite_files",
    "suite_digest",
    "file_sha256",
    "main",
]

#: The one command that rewrites every committed must-pass list from the installed suite.
REGENERATE = "python -m hisparse_hal.conformance.mustpass --write"
CONFORMANCE_DIR = Path(__file__).resolve().parent
COLLECT_TIMEOUT_S = 600.0

# Run in a child interpreter: collects the suite (on the CPU device, no expectations) and writes
# [[suite id, [marker names]], ...] as JSON to the file named by argv[1].
_COLLECT = """
import json, sys
import pytest
from hisparse_hal.conformance import runner
from hisparse_hal.conformance.report import suite_test_id

class Recorder:
    items = []
    def pytest_collection_finish(self, session):
        Recorder.items = [[suite_test_id(i.nodeid), sorted({m.name for m in i.iter_markers()})]
                          for i in session.items]

argv = ["-p", runner.PLUGIN, "-c", str(runner.SETTINGS), "--rootdir", str(runner.SETTINGS.parent),
        "-p", "no:cacheprovider", "-p", "no:xdist", "--pyargs", runner.TESTS, "--collect-only", "-q",
        "--hal-backend", "cpu", "--hal-expectations", "none"]
code = pytest.main(argv, plugins=[Recorder()])
with open(sys.argv[1], "w", encoding="utf-8") as out:
    json.dump({"exit": int(code), "items": Recorder.items}, out)
"""


def collect_suite() -> list[tuple[str, frozenset[str]]]:
    """Every test of the installed suite with its marker names, in collection order (a child pytest run).

    Raises:
        InvalidArgumentError: the collection failed (its output is in the message).
    """
    from hisparse_hal.python_child import python_command, python_environment

    with tempfile.TemporaryDirectory(prefix="hisparse-mustpass-") as scratch:
        out = Path(scratch) / "collected.json"
        done = subprocess.run(python_command(code=_COLLECT, args=[str(out)]), env=python_environment(),
                              cwd=scratch, capture_output=True, text=True, timeout=COLLECT_TIMEOUT_S)
        try:
            found = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            found = {"exit": done.returncode, "items": []}
    if found["exit"] != 0 or not found["items"]:
        tail = (done.stdout[-2000:] + done.stderr[-2000:]).strip()
        raise InvalidArgumentError(f"collecting the conformance suite failed (pytest exit {found['exit']}): {tail}")
    return [(test_id, frozenset(markers)) for test_id, markers in found["items"]]


def contract_ids(contract: Contract, collected: Sequence[tuple[str, frozenset[str]]]) -> list[str]:
    """The ids of ``collected`` that ``contract`` takes, sorted."""
    return sorted(test_id for test_id, markers in collected
                  if contract.excludes_marker is None or contract.excludes_marker not in markers)


def read_mustpass(contract: Contract, directory: Path | None = None) -> list[str]:
    """The committed must-pass list of ``contract`` (one id a line; blank lines and ``#`` comments ignored).

    Raises:
        InvalidArgumentError: the list is missing.
    """
    path = (directory or MUSTPASS_DIR) / f"{contract.id}.txt"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidArgumentError(f"the must-pass list of {contract.id!r} cannot be read ({path}): {exc}; "
                                   f"regenerate it: {REGENERATE}") from None
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def write_mustpass(contract: Contract, ids: Sequence[str], directory: Path | None = None) -> Path:
    """Write the must-pass list of ``contract`` (sorted ids, one a line); returns its path."""
    target = (directory or MUSTPASS_DIR) / f"{contract.id}.txt"
    target.parent.mkdir(parents=True, exist_ok=True)
    header = f"# must-pass list of the {contract.id} contract ({contract.title}); regenerate: {REGENERATE}\n"
    target.write_text(header + "".join(f"{test_id}\n" for test_id in sorted(ids)), encoding="utf-8")
    return target


def suite_files(root: Path | None = None) -> list[Path]:
    """The files the suite hash covers, relative to the conformance folder: ``tests/*.py`` and ``mustpass/*.txt``,
    sorted by relative path."""
    base = root or CONFORMANCE_DIR
    found = [*base.glob("tests/*.py"), *base.glob("mustpass/*.txt")]
    return sorted((p.relative_to(base) for p in found), key=lambda p: p.as_posix())


def file_sha256(path: str | Path) -> str:
    """The hex sha256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def suite_digest(root: Path | None = None) -> dict[str, Any]:
    """The ``suite`` entry of ``results.json``: version, sha256 and files of the suite as installed.

    The hash runs over each file in :func:`suite_files` order: its relative path, a NUL, its byte count, a NUL,
    its bytes.
    """
    base = root or CONFORMANCE_DIR
    digest = hashlib.sha256()
    files = suite_files(base)
    for rel in files:
        data = (base / rel).read_bytes()
        digest.update(rel.as_posix().encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return {"version": SUITE_VERSION, "sha256": digest.hexdigest(), "files": [p.as_posix() for p in files]}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hisparse_hal.conformance.mustpass [--write]``: compare (or rewrite) the committed lists."""
    parser = argparse.ArgumentParser(prog="python -m hisparse_hal.conformance.mustpass", description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite the committed lists from the installed suite")
    args = parser.parse_args(argv)
    collected = collect_suite()
    stale = 0
    for contract in CONTRACTS.values():
        ids = contract_ids(contract, collected)
        if args.write:
            print(f"wrote {write_mustpass(contract, ids)} ({len(ids)} tests)")
            continue
        try:
            committed = read_mustpass(contract)
        except InvalidArgumentError as exc:
            print(exc, file=sys.stderr)
            stale += 1
            continue
        if committed != ids:
            stale += 1
            print(f"{contract.id}: the committed list differs from the suite ({len(committed)} listed, {len(ids)} "
                  f"collected); regenerate: {REGENERATE}", file=sys.stderr)
        else:
            print(f"{contract.id}: {len(ids)} tests, as committed")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
