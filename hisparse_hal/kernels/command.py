"""``hisparse-hal kernels``: compile every Triton kernel offline for GPU targets, or check the device's own compile."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hisparse_hal.errors import InvalidArgumentError, UnsupportedCapabilityError

from . import device_check, report
from .page import generated_part, load_payload, render, replace_generated
from .report import KernelFacts
from .specs import all_cases, production_cases

__all__ = ["run"]


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Callable[[KernelFacts], None]]:
    """A progress bar on a terminal (the kernel and target being compiled); elsewhere, a line every 10%."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=total, unit="compile", file=sys.stderr, dynamic_ncols=True)
        def advance(facts: KernelFacts) -> None:
            bar.set_postfix_str(f"{facts.name} {facts.target}", refresh=False)
            bar.update(1)

        try:
            yield advance
        finally:
            bar.close()
        return
    done = [0]

    def line(facts: KernelFacts) -> None:
        done[0] += 1
        if done[0] == total or done[0] % max(1, total // 10) == 0:
            print(f"  compiled {done[0]}/{total} (last: {facts.name} for {facts.target})", file=sys.stderr, flush=True)

    yield line


def run(args: argparse.Namespace) -> int:
    """``hisparse-hal kernels``: exit 0 when every case compiled for every target, else 1 (2: bad targets)."""
    from hisparse_hal.output_checks import require_module, writable_directory, writable_file

    page = _checked_page(args)
    if args.from_json and page is not None:  # _checked_page refused --from-json without --page
        return _render_page(load_payload(args.from_json), page)
    require_module("triton", "triton", "compiling the kernels")
    if args.json:
        writable_file(args.json, "--json")
    if args.dump:
        writable_directory(args.dump, "--dump")
    if args.against_device:
        return _run_against_device(args)
    try:
        targets = report.targets_of(args.targets)
    except InvalidArgumentError as exc:
        print(f"hisparse-hal kernels: {exc}", file=sys.stderr)
        return 2
    cases = production_cases() if args.production_only else all_cases()
    total = len(cases) * len(targets)
    print(f"compiling {len(cases)} kernel cases for {', '.join(targets)} ({total} compiles, offline; "
          "minutes on an empty triton cache)", flush=True)
    with report.quiet_triton(), _progress(total) as on_result:
        results = report.compile_cases(cases, targets, on_result=on_result)
    print(report.format_table(results))
    print()
    totals = report.summary(results)
    for target, line in totals.items():
        print(f"{target}: {line['compiled']}/{line['cases']} compiled; max shared {line['max_shared_bytes']} B "
              f"(limit {line['shared_limit_bytes']}); max registers {line['max_registers']}; "
              f"max spill {line['max_spill_bytes']} B; 32-bit pointer offsets {line['narrow_offsets']}")
    print("compiled, not run: these figures say what a GPU would be asked for, not that the kernels work there")
    if args.dump:
        for note in report.dump(results, Path(args.dump)):
            print(note)
        print(f"wrote {args.dump}")
    if args.json:
        import triton

        today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        payload = {"triton": triton.__version__, "date": today, "command": _command_line(args), "targets": targets,
                   "summary": totals, "results": [f.as_dict() for f in results]}
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json}")
        if page is not None:
            _render_page(payload, page)
    return 0 if all(f.compiled for f in results) else 1


def _checked_page(args: argparse.Namespace) -> Path | None:
    """``--page`` checked before any compiling: it needs ``--json`` or ``--from-json`` and a writable page that
    holds the generated-part markers; ``--from-json`` needs ``--page`` and no compile option.

    Raises:
        InvalidArgumentError: a bad combination or page (the option named).
    """
    if args.from_json:
        others = [name for name, given in (("--json", args.json), ("--dump", args.dump),
                                           ("--against-device", args.against_device),
                                           ("--production-only", args.production_only),
                                           ("--targets", args.targets != ",".join(report.TARGETS)))
                  if given]
        if others or not args.page:
            raise InvalidArgumentError(
                f"--from-json renders an earlier document into --page without compiling: it takes --page and "
                f"nothing else ({', '.join(others) if others else 'no --page'} given)")
    if args.page is None:
        return None
    if not (args.json or args.from_json) or args.against_device:
        raise InvalidArgumentError("--page is rendered from the --json document of an offline compile: give --json "
                                   "FILE (not --against-device), or --from-json FILE")
    from hisparse_hal.output_checks import writable_file

    page = writable_file(args.page, "--page")
    try:
        text = page.read_text()
    except OSError as exc:
        raise InvalidArgumentError(f"--page {args.page!r} cannot be read: {exc}") from exc
    generated_part(text, f"--page {args.page!r}")
    return page


def _render_page(payload: dict[str, Any], page: Path) -> int:
    """Rewrite ``page``'s generated part from ``payload``; exit status 0."""
    text = page.read_text()
    page.write_text(replace_generated(text, render(payload), f"--page {str(page)!r}"))
    print(f"wrote the generated part of {page}")
    return 0


def _command_line(args: argparse.Namespace) -> str:
    """The ``hisparse-hal kernels`` command that wrote a --json document, as the page quotes it."""
    words = ["hisparse-hal", "kernels"]
    if args.targets != ",".join(report.TARGETS):
        words += ["--targets", args.targets]
    if args.production_only:
        words.append("--production-only")
    words += ["--json", args.json]
    if args.page:
        words += ["--page", args.page]
    return " ".join(words)


def _run_against_device(args: argparse.Namespace) -> int:
    """``--against-device``: exit 0 when the device's compile agrees with the offline one on every case,
    1 on a mismatch, 2 without a GPU triton can use."""
    with report.quiet_triton():
        try:
            rows = device_check.compare_with_device(production_cases() if args.production_only else all_cases())
        except UnsupportedCapabilityError as exc:
            print(f"hisparse-hal kernels --against-device: {exc}", file=sys.stderr)
            return 2
    for row in rows:
        verdict = "; ".join(row.mismatches) or "agree"
        print(f"{row.kernel}[{row.shape}] {row.target}: device {row.device} offline {row.offline}: {verdict}")
    bad = [row for row in rows if row.mismatches]
    print(f"{len(rows) - len(bad)}/{len(rows)} cases agree between the device's compile and the offline report")
    if args.json:
        import triton

        Path(args.json).write_text(json.dumps({"triton": triton.__version__, "rows": [r.as_dict() for r in rows]},
                                              indent=2))
        print(f"wrote {args.json}")
    return 1 if bad else 0
