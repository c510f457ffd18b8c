"""The ``hisparse-hal`` command: ``info``, ``conformance``, ``bench``, ``kernels``, ``scenario`` and ``vllm-check``.

Every subcommand exits with the same codes (:data:`EXIT_CODES`): an error of the package (``HalError``) or of
the system (``OSError``) is one line on stderr and exit 2, with the traceback only under ``--debug`` or
``HISPARSE_HAL_DEBUG=1``; SIGINT or SIGTERM is one line and exit 130. Parsing imports no torch: each subcommand's
options are added only when it is the one asked for, and its modules are imported only then.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from types import FrameType

from .errors import BackendUnavailableError, HalError, InvalidArgumentError
from .settings import name_setting

__all__ = ["main", "build_parser", "EXIT_CODES"]

#: The exit codes of every subcommand.
EXIT_CODES = {0: "success", 1: "tests or checks failed", 2: "usage or environment error",
              130: "interrupted (SIGINT or SIGTERM)"}
EPILOG = ("exit status: 0 success; 1 tests or checks failed; 2 usage or environment error (bad option, unwritable "
          "output, missing extra, bad HISPARSE_HAL_* value, no usable backend); 130 interrupted (SIGINT, SIGTERM). "
          "info prints its table in every case and exits 2 when the backend named by --backend or "
          "HISPARSE_HAL_BACKEND is unknown or unavailable, 1 when none was named and none can be chosen. "
          "--debug (or HISPARSE_HAL_DEBUG=1) shows the traceback of an error.")
#: What an interrupt of each subcommand leaves behind, for its one line.
_AFTER_INTERRUPT = {
    "info": "nothing was written",
    "bench": "no --json or --plot file was written",
    "kernels": "no --json or --dump output was written",
    "scenario": "the ranks were stopped and the shared pool removed; no --json file was written",
    "vllm-check": "nothing was written",
}


def _cmd_info(args: argparse.Namespace) -> int:
    from .registry import BACKEND_ENV, format_probe_table, probe_backends, select_backend

    results = probe_backends()
    requested = args.backend if args.backend is not None else name_setting(BACKEND_ENV)
    if requested is not None and requested not in {r.name for r in results}:
        names = [r.name for r in results]
        where = "--backend" if args.backend is not None else BACKEND_ENV
        raise InvalidArgumentError(f"unknown backend {requested!r} ({where}); registered: {names}")
    try:
        selection = select_backend(args.backend, results)
        chosen, explanation = selection.chosen.name if selection.chosen else None, selection.explanation
    except BackendUnavailableError as exc:
        chosen, explanation = None, str(exc).split("\n\n", 1)[0]
    cache_ops = _cache_ops_choice(chosen, results)
    if args.json:
        payload = {
            "version": _version(),
            "chosen": chosen,
            "explanation": explanation,
            "cache_ops": cache_ops,
            "backends": [r.as_dict() for r in results],
        }
        print(json.dumps(payload, indent=2, sort_keys=False, default=str))
        return _info_status(chosen, requested)
    print(format_probe_table(results, chosen))
    for r in results:
        if r.facts:
            facts = ", ".join(f"{k}={v}" for k, v in r.facts.items())
            print(f"  {r.name}: {facts}")
    print()
    print(f"chosen: {chosen or 'none'} ({explanation})")
    if cache_ops is not None:
        print(f"cache ops: {cache_ops['implementation']} ({cache_ops['reason']})")
    if not chosen and requested:
        print(f"hint: install a build of torch for {requested!r}, or unset {BACKEND_ENV} / drop --backend")
    return _info_status(chosen, requested)


def _info_status(chosen: str | None, requested: str | None) -> int:
    """``info``'s exit status: 0 a backend is chosen; 2 the named one is unusable (as every command); 1 none is."""
    if chosen:
        return 0
    return 2 if requested else 1


def _cache_ops_choice(chosen: str | None, results: Sequence[object]) -> dict[str, str] | None:
    """The cache-ops implementation the chosen backend's device would run (its spec's ``device_type``), and why
    (None without a backend)."""
    if chosen is None:
        return None
    from .cache_ops.selection import implementation_for

    spec = next((getattr(r, "spec", None) for r in results if getattr(r, "name", None) == chosen), None)
    choice = implementation_for(spec.device_type if spec is not None else "cpu")
    return {"implementation": choice.implementation, "reason": choice.reason}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hisparse-hal")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _cmd_conformance(args: argparse.Namespace) -> int:
    from .conformance import runner

    return runner.run(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import command
    from .bench.arguments import validate

    validate(args)
    return command.run(args)


def _fault(text: str) -> tuple[int, int]:
    rank, sep, step = text.partition(":")
    if not sep or not rank.isdigit() or not step.isdigit():
        raise argparse.ArgumentTypeError(f"expected RANK:STEP (two non-negative ints), got {text!r}")
    return int(rank), int(step)


def _cmd_scenario(args: argparse.Namespace) -> int:
    import logging

    from .scenario import run_scenario
    from .scenario.arguments import config_from_options, validate
    from .shm_sweep import SWEPT, sweep_shared_files

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    config = config_from_options(args)
    validate(config, args.json)
    from .registry import select_backend

    select_backend(args.backend)  # an unknown or unavailable name fails here, with the probe table (exit 2)
    for path in sweep_shared_files():
        print(f"hisparse-hal scenario: removed {path}, {SWEPT}", file=sys.stderr)
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
        sweep_shared_files()  # the event files of ranks the driver had to SIGKILL
    print(f"backend: {result.backend}; "
          f"sync: {result.sync} ({result.sync_reason})")
    rate = (f"{result.steps_per_s:.1f} steps/s (rank 0's step loop)" if result.steps_per_s
            else "steps/s unknown (rank 0's step loop did not run)")
    print(f"{config.ranks} ranks x {config.steps} steps in {result.wall_s:.1f} s wall; {rate}; "
          f"{result.bytes_moved / 2**20:.1f} MiB moved")
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
        with open(args.json, "w", encoding="utf-8") as f:  # checked before the run (scenario.arguments)
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


def _vllm_check_json_error(argv: Sequence[str], exc: BaseException) -> None:
    """``vllm-check --json`` prints its report on stdout also when a setting is bad (the exit status stays 2)."""
    if "vllm-check" in argv and "--json" in argv:
        from .integrations import vllm as vllm_plugin

        print(json.dumps(vllm_plugin.error_report(exc), indent=2))


#: Each subcommand's one-line help, also its description in ``hisparse-hal SUBCOMMAND --help``.
SUBCOMMANDS = {
    "info": "probe every backend and show which one is chosen, and why",
    "conformance": "run the conformance suite against a backend and write its report",
    "verify": "check a conformance report folder: CONFORMANT or NOT CONFORMANT, with every reason (exit 0 or 1)",
    "bench": "measure swaps and gathers (or, with a mode option, the cache ops, pinning or submission cost) "
             "against the plain alternatives",
    "kernels": "compile the Triton cache-ops kernels for GPU targets, offline, and report",
    "scenario": "run the tensor-parallel shared-pool offload scenario across processes",
    "vllm-check": "can vLLM 0.34.0's HiSparse run here: its backend, whose cache ops, what blocks it",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of the ``hisparse-hal`` command.

    Args:
        only: add the options of this subcommand only (``""``: of none, for the top-level help), so that parsing
            imports only that subcommand's modules; None adds every subcommand's options.
    """
    parser = argparse.ArgumentParser(
        prog="hisparse-hal",
        description="Vendor-neutral device layer for HiSparse KV-cache offload.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error (HISPARSE_HAL_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    for name, summary in SUBCOMMANDS.items():
        command = sub.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".")
        if only is None or only == name:
            _OPTIONS[name](command)
    return parser


def _info_options(info: argparse.ArgumentParser) -> None:
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    info.add_argument("--backend", default=None, help="explain the choice of this backend (strict)")
    info.set_defaults(func=_cmd_info)


def _conformance_options(conformance: argparse.ArgumentParser) -> None:
    from .conformance import runner

    runner.add_arguments(conformance)
    conformance.set_defaults(func=_cmd_conformance)


def _verify_options(verify: argparse.ArgumentParser) -> None:
    from .conformance import verify as verify_command

    verify_command.add_arguments(verify)
    verify.set_defaults(func=verify_command.run)


def _bench_options(bench: argparse.ArgumentParser) -> None:
    from .bench import command as bench_command

    bench_command.add_arguments(bench)
    bench.set_defaults(func=_cmd_bench)


def _kernels_options(kernels: argparse.ArgumentParser) -> None:
    from .kernels import command, report

    report.add_arguments(kernels)
    kernels.set_defaults(func=command.run)


def _scenario_options(scenario: argparse.ArgumentParser) -> None:
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


def _vllm_check_options(vllm_check: argparse.ArgumentParser) -> None:
    vllm_check.add_argument("--json", action="store_true", help="print JSON instead of text")
    vllm_check.set_defaults(func=_cmd_vllm_check)


_OPTIONS = {"info": _info_options, "conformance": _conformance_options, "verify": _verify_options,
            "bench": _bench_options, "kernels": _kernels_options, "scenario": _scenario_options,
            "vllm-check": _vllm_check_options}


def _joined_option_values(argv: Sequence[str]) -> list[str]:
    """``--pytest-args -q`` -> ``--pytest-args=-q``: argparse would take a value that starts with ``-`` for an
    option of its own."""
    out: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        if items[i] == "--pytest-args" and i + 1 < len(items):
            out.append(f"--pytest-args={items[i + 1]}")
            i += 2
            continue
        out.append(items[i])
        i += 1
    return out


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _debug_wanted(argv: Sequence[str]) -> bool:
    return "--debug" in argv or os.environ.get("HISPARSE_HAL_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hisparse-hal`` console script; returns one of :data:`EXIT_CODES`."""
    raw = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in raw if not a.startswith("-")), "hisparse-hal")
    prefix = f"hisparse-hal {command}" if command != "hisparse-hal" else "hisparse-hal"
    debug = _debug_wanted(raw)
    if _is_main_thread():
        signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM unwinds like Ctrl-C: every cleanup runs
    starting = True
    try:
        args = build_parser(only=command if command in SUBCOMMANDS else "").parse_args(_joined_option_values(raw))
        _finish_package_import()
        starting = False
        from .environment_check import check_environment, unknown_variables

        check_environment()
        for name in unknown_variables():
            print(f"{prefix}: warning: {name} is set but hisparse-hal reads no such variable", file=sys.stderr)
        return int(args.func(args) or 0)
    except KeyboardInterrupt as exc:
        how = str(exc) or "SIGINT"
        if starting:
            print(f"\nhisparse-hal: interrupted ({how}) while starting; nothing was done", file=sys.stderr)
            return 130
        after = getattr(exc, "kept", None) or _AFTER_INTERRUPT.get(command, "nothing was written")
        print(f"\n{prefix}: interrupted ({how}); {after}", file=sys.stderr)
        return 130
    except BackendUnavailableError as exc:
        if debug:
            traceback.print_exc()
        _vllm_check_json_error(raw, exc)
        from .registry import BACKEND_ENV

        hint = ""
        if os.environ.get(BACKEND_ENV) and "--backend" not in raw:
            hint = f"\nhint: install a build of torch for that backend, or unset {BACKEND_ENV}"
        print(f"{prefix}: {exc}{hint}", file=sys.stderr)
        return 2
    except (HalError, OSError) as exc:
        if debug:
            traceback.print_exc()
        _vllm_check_json_error(raw, exc)
        what = str(exc) if isinstance(exc, HalError) else f"{type(exc).__name__}: {exc} (--debug shows where)"
        print(f"{prefix}: {what}", file=sys.stderr)
        return 2


def _finish_package_import() -> None:
    """Run the package's ``__init__`` (torch, the cache ops) if the console script deferred it until the command
    line had been parsed (``hisparse_hal_launcher``); nothing otherwise."""
    package = sys.modules[__package__ or "hisparse_hal"]
    deferred = package.__dict__.pop("_deferred_init", None)
    if deferred is not None:
        deferred()


def _is_main_thread() -> bool:
    """Whether this is the main thread (signal handlers can only be installed there)."""
    import threading

    return threading.current_thread() is threading.main_thread()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
