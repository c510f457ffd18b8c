"""Merge the conformance reports of a hardware matrix into one compatibility table and page.

Usage: ``python ci/merge_reports.py --out DIR REPORT [REPORT ...]`` where each REPORT is a
``results.json``, a directory holding one (and maybe a ``bench.json``), or ``LABEL=path``. Writes
``DIR/compatibility.md``, ``DIR/compatibility.json`` and ``DIR/index.html`` (hisparse_hal.conformance.matrix_page).
The exit status is 0 only when every row is a full PASS (``--allow-partial``: partial passes count).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hisparse_hal.conformance.matrix_page import load_report, merge, render_markdown, write_outputs
from hisparse_hal.errors import InvalidArgumentError

__all__ = ["load_report", "merge", "render_markdown", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns 0 when every row passes, 1 when a row does not, 2 (one line on stderr naming
    it, nothing written) when a REPORT cannot be read or is not a conformance report, as every hisparse-hal command
    exits 2 for bad input."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for compatibility.md, compatibility.json, index.html")
    parser.add_argument(
        "reports", nargs="+", metavar="REPORT", help="results.json, a directory with one, or LABEL=path"
    )
    parser.add_argument("--allow-partial", action="store_true",
                        help="exit 0 when every row passes, even rows that ran a selection of the suite")
    args = parser.parse_args(argv)
    try:
        merged = merge([load_report(spec) for spec in args.reports])
    except InvalidArgumentError as exc:
        print(f"merge_reports: {exc}", file=sys.stderr)
        return 2
    paths = write_outputs(args.out, merged)
    print(render_markdown(merged))
    print(f"page: {paths['html']}")
    passing = ("PASS", "PASS (partial)") if args.allow_partial else ("PASS",)
    return 0 if all(row["verdict"] in passing for row in merged["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
