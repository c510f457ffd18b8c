"""The ``hisparse-hal`` command: ``info``, ``conformance``, ``bench``, ``scenario`` and ``vllm-check``.

The library returns values; only this module prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

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
    from .bench import command

    return command.run(args)


def _fault(text: str) -> tuple[int, int]:
    rank, sep, step = text.partition(":")
    if not sep or not rank.isdigit() or not step.isdigit():
        raise argparse.ArgumentTypeError(f"expected RANK:STEP (two non-negative ints), got {text!r}")
    return int(rank), int(step)


def _cmd_scenario(args: argparse.Namespace) -> int:
    import logging

    from .errors import HalError
    from .scenario import FaultPlan, ScenarioConfig, run_scenario

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        config = ScenarioConfig(
            ranks=args.ranks, steps=args.steps, backend=args.backend, sync=args.sync, timeout_s=args.timeout,
            host_chunk_bytes=args.host_chunk_bytes, kill=FaultPlan(*args.kill) if args.kill else None,
        )
    except HalError as exc:
        print(f"hisparse-hal scenario: {exc}", file=sys.stderr)
        return 2
    select_backend(args.backend)  # an unknown or unavailable name fails here, with the probe table (exit 2)
    bar = None
    if sys.stdout.isatty():
        from tqdm import tqdm

        bar = tqdm(total=config.steps, unit="step", desc=f"{config.ranks} ranks", dynamic_ncols=True)

    def progress(done: int) -> None:
        if bar is not None:
            bar.update(done - bar.n)

    try:
        result = run_scenario(config, on_progress=progress)
    finally:
        if bar is not None:
            bar.close()
    print(f"backend: {result.backend}; "
          f"sync: {result.sync} ({result.sync_reason})")
    print(f"{config.ranks} ranks x {config.steps} steps in {result.wall_s:.1f} s wall; "
          f"{result.steps_per_s:.1f} steps/s (rank 0's step loop); {result.bytes_moved / 2**20:.1f} MiB moved")
    print(f"{'rank':>4} {'steps':>7} {'p50 ms':>8} {'p99 ms':>8} {'MiB':>8} {'mismatch':>8}  outcome")
    for rank in result.ranks:
        outcome = "ok" if rank.ok else (f"{rank.error_type}: {rank.error}" if rank.error_type else "FAILED")
        print(f"{rank.rank:>4} {rank.steps_done:>7} {rank.step_p50_s * 1e3:>8.2f} {rank.step_p99_s * 1e3:>8.2f} "
              f"{rank.bytes_moved / 2**20:>8.1f} {rank.mismatches:>8}  {outcome}")
        for example in rank.mismatch_examples:
            print(f"       mismatch: {example}")
        for check, verdict in rank.preflight.items():
            if not verdict.startswith(("refused", "skipped")):
                print(f"       preflight {check}: {verdict}")
        if rank.registrations_left:
            print(f"       {rank.registrations_left} host registration(s) left pinned")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result.as_dict(), f, indent=2, default=str)
        print(f"wrote {args.json}")
    print("PASS" if result.ok else "FAIL")
    return 0 if result.ok else 1


def _cmd_vllm_check(args: argparse.Namespace) -> int:
    from .integrations import vllm as vllm_plugin

    report = vllm_plugin.check()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        plugin = report["plugin"]
        print(f"vLLM: {report['vllm_version'] or 'not installed'}; entry point registered: "
              f"{report['entry_point_registered']}")
        print(f"plugin: {plugin['state']} ({plugin['reason']})")
        print(f"vLLM resolves HiSparse backend: {report['backend_cls']}")
        if report["backend_error"]:
            print(f"backend error: {report['backend_error']}")
        print(f"cache ops: {report['cache_ops']}")
        for blocker in report["blockers"]:
            print(f"blocker: {blocker}")
        print(f"HiSparse can run: {report['hisparse_can_run']}")
    return 0 if report["hisparse_can_run"] else 1


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
    from .bench import command as bench_command

    bench_command.add_arguments(bench)
    bench.set_defaults(func=_cmd_bench)

    kernels = sub.add_parser(
        "kernels", help="compile the Triton cache-ops kernels for GPU targets, offline, and report"
    )
    from .cache_ops import kernel_report, kernels_command

    kernel_report.add_arguments(kernels)
    kernels.set_defaults(func=kernels_command.run)

    scenario = sub.add_parser("scenario", help="run the tensor-parallel shared-pool offload scenario across processes")
    scenario.add_argument("--ranks", type=int, default=2, help="processes; rank 0 writes the shared pool (default 2)")
    scenario.add_argument("--steps", type=int, default=1000, help="engine steps (default 1000)")
    scenario.add_argument("--backend", default=None,
                          help="registry name of the backend (strict); default: the selected one")
    scenario.add_argument("--sync", choices=("auto", "events", "barrier"), default="auto",
                          help="synchronization path; auto chooses by capability (default)")
    scenario.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                          help="bound of every wait on another rank (default HISPARSE_HAL_EVENT_TIMEOUT_S, else 30)")
    scenario.add_argument("--host-chunk-bytes", type=int, default=None, metavar="BYTES",
                          help="largest single host registration (small values split the pool)")
    scenario.add_argument("--kill", type=_fault, default=None, metavar="RANK:STEP",
                          help="fault injection: SIGKILL this rank at this step")
    scenario.add_argument("--json", default=None, metavar="FILE", help="also write the full result as JSON")
    scenario.add_argument("-v", "--verbose", action="store_true", help="log at INFO (the sync path's reason, cleanup)")
    scenario.set_defaults(func=_cmd_scenario)

    vllm_check = sub.add_parser(
        "vllm-check", help="can vLLM 0.34.0's HiSparse run here: its backend, whose cache ops, what blocks it"
    )
    vllm_check.add_argument("--json", action="store_true", help="print JSON instead of text")
    vllm_check.set_defaults(func=_cmd_vllm_check)
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
