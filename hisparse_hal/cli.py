"""The ``hisparse-hal`` command: ``info`` (probe table and choice), ``conformance`` and ``bench``.

The library returns values; only this module prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from .errors import BackendUnavailableError
from .registry import format_probe_table, probe_backends, select_backend

__all__ = ["main", "build_parser"]


def _cmd_info(args: argparse.Namespace) -> int:
    results = probe_backends()
    try:
        selection = select_backend(args.backend, results)
        chosen, explanation = selection.chosen.name if selection.chosen else None, selection.explanation
    except BackendUnavailableError as exc:
        chosen, explanation = None, str(exc).split("\n\n", 1)[0]
    if args.json:
        payload = {
            "chosen": chosen,
            "explanation": explanation,
            "backends": [r.as_dict() for r in results],
        }
        print(json.dumps(payload, indent=2, sort_keys=False, default=str))
        return 0
    print(format_probe_table(results, chosen))
    for r in results:
        if r.facts:
            facts = ", ".join(f"{k}={v}" for k, v in r.facts.items())
            print(f"  {r.name}: {facts}")
    print()
    print(f"chosen: {chosen or 'none'} ({explanation})")
    return 0 if chosen else 1


def _cmd_conformance(args: argparse.Namespace) -> int:
    from .conformance import runner

    return runner.run(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.cache_ops:
        from .cache_ops import benchmark as cache_ops_benchmark

        return cache_ops_benchmark.run(args)
    from . import benchmark

    return benchmark.run(args)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``hisparse-hal`` command."""
    parser = argparse.ArgumentParser(
        prog="hisparse-hal",
        description="Vendor-neutral device layer for HiSparse KV-cache offload.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="probe every backend and show which one is chosen, and why")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    info.add_argument("--backend", default=None, help="explain the choice of this backend (strict)")
    info.set_defaults(func=_cmd_info)

    conformance = sub.add_parser("conformance", help="run the conformance suite against a backend")
    from .conformance import runner

    runner.add_arguments(conformance)
    conformance.set_defaults(func=_cmd_conformance)

    bench = sub.add_parser("bench", help="measure swaps and gathers against the plain alternatives")
    from . import benchmark

    benchmark.add_arguments(bench)
    from .cache_ops import benchmark as cache_ops_benchmark

    cache_ops_benchmark.add_arguments(bench)
    bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hisparse-hal`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BackendUnavailableError as exc:
        print(f"hisparse-hal: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
