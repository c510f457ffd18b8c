"""Generate CI jobs from the hardware matrix (``ci/matrix.toml``), the matrix's one source.

Usage: ``python ci/jobs.py [--matrix FILE] [--report-root DIR] [--merge-inputs]`` prints ``{"include": [...]}``
(the shape CI matrix strategies take; .github/workflows/hardware-matrix.yml consumes it): one job per machine with
its runner label, backend, install and the command that runs the GPU check (or, on the CPU row, the conformance
run) into ``DIR/<machine>``; ``--merge-inputs`` prints the merge step's ``LABEL=path`` arguments.
Invariant: names are unique and every backend named is one the project registers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

__all__ = ["load_matrix", "jobs", "merge_inputs", "main"]

KNOWN_BACKENDS = ("cpu", "cuda", "rocm")
FIELDS = ("name", "backend", "runner", "arch", "torch")
DEFAULT_MATRIX = Path(__file__).with_name("matrix.toml")


def load_matrix(path: Path) -> list[dict[str, str]]:
    """The machines of a matrix file.

    Raises:
        SystemExit: unreadable TOML, a machine missing a field, an unknown backend, or a duplicate name
            (each message names the machine and the value).
    """
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SystemExit(f"jobs: cannot read matrix {path}: {exc}") from None
    machines = doc.get("machine", [])
    if not machines:
        raise SystemExit(f"jobs: matrix {path} lists no [[machine]]")
    seen: set[str] = set()
    for i, machine in enumerate(machines):
        missing = [f for f in FIELDS if not isinstance(machine.get(f), str) or not machine[f]]
        if missing:
            raise SystemExit(f"jobs: machine {i} ({machine.get('name', '?')}) lacks {missing}")
        if machine["backend"] not in KNOWN_BACKENDS:
            raise SystemExit(
                f"jobs: machine {machine['name']!r} names unknown backend {machine['backend']!r}; "
                f"known: {list(KNOWN_BACKENDS)}"
            )
        if machine["name"] in seen:
            raise SystemExit(f"jobs: machine name {machine['name']!r} appears twice")
        seen.add(machine["name"])
    return machines


def jobs(machines: list[dict[str, str]], report_root: str) -> list[dict[str, Any]]:
    """One CI job per machine: where it runs, how the package is installed there, the command that writes its
    report folder, and where in that folder the conformance ``results.json`` and JUnit file land."""
    out = []
    for machine in machines:
        folder = f"{report_root}/{machine['name']}"
        if machine["backend"] == "cpu":
            results = folder
            install = "pip install torch==2.13.0 && pip install '.[test]'"
            command = f"hisparse-hal conformance --backend cpu --report {folder} --junit {folder}/junit.xml"
        else:
            results = f"{folder}/conformance"  # ci/gpu-check.sh writes the suite's report there
            install = f"pip install '.[test,{machine['backend']}]'"  # next to the runner image's GPU build of torch
            command = f"ci/gpu-check.sh {machine['backend']} {folder}"
        out.append({**machine, "report": folder, "results": results, "junit": f"{results}/junit.xml",
                    "install": install, "command": command})
    return out


def merge_inputs(job_list: list[dict[str, Any]]) -> list[str]:
    """The ``LABEL=path`` arguments of ``ci/merge_reports.py`` for these jobs' results, one per machine."""
    return [f"{job['name']}={job['results']}" for job in job_list]


def main(argv: Sequence[str] | None = None) -> int:
    """Print the jobs as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", type=Path, default=DEFAULT_MATRIX)
    parser.add_argument("--report-root", default="reports")
    parser.add_argument("--merge-inputs", action="store_true",
                        help="print merge_reports.py's LABEL=path arguments instead, one per line")
    args = parser.parse_args(argv)
    job_list = jobs(load_matrix(args.matrix), args.report_root)
    if args.merge_inputs:
        print("\n".join(merge_inputs(job_list)))
    else:
        print(json.dumps({"include": job_list}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
