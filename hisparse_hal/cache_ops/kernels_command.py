"""``hisparse-hal kernels``: compile every Triton kernel offline for GPU targets, or check the device's own compile."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hisparse_hal.errors import InvalidArgumentError, UnsupportedCapabilityError

from . import kernel_device_check, kernel_report
from .kernel_specs import all_cases, production_cases

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """``hisparse-hal kernels``: exit 0 when every case compiled for every target, else 1 (2: bad targets)."""
    if args.against_device:
        return _run_against_device(args)
    try:
        targets = kernel_report.targets_of(args.targets)
    except InvalidArgumentError as exc:
        print(f"hisparse-hal kernels: {exc}", file=sys.stderr)
        return 2
    with kernel_report.quiet_triton():
        cases = production_cases() if args.production_only else all_cases()
        results = kernel_report.compile_cases(cases, targets)
    print(kernel_report.format_table(results))
    print()
    totals = kernel_report.summary(results)
    for target, line in totals.items():
        print(f"{target}: {line['compiled']}/{line['cases']} compiled; max shared {line['max_shared_bytes']} B "
              f"(limit {line['shared_limit_bytes']}); max registers {line['max_registers']}; "
              f"max spill {line['max_spill_bytes']} B; 32-bit pointer offsets {line['narrow_offsets']}")
    print("compiled, not run: these figures say what a GPU would be asked for, not that the kernels work there")
    if args.dump:
        for note in kernel_report.dump(results, Path(args.dump)):
            print(note)
        print(f"wrote {args.dump}")
    if args.json:
        import triton

        payload = {"triton": triton.__version__, "targets": targets, "summary": totals,
                   "results": [f.as_dict() for f in results]}
        Path(args.json).write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")
    return 0 if all(f.compiled for f in results) else 1


def _run_against_device(args: argparse.Namespace) -> int:
    """``--against-device``: exit 0 when the device's compile agrees with the offline one on every case,
    1 on a mismatch, 2 without a GPU triton can use."""
    with kernel_report.quiet_triton():
        try:
            rows = kernel_device_check.compare_with_device(production_cases() if args.production_only else all_cases())
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
