"""``hisparse-hal bench``: its options and which benchmark each mode runs (swaps and gathers by default)."""

from __future__ import annotations

import argparse
import os

from .options import add_options

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hisparse-hal bench`` (every mode; defined in :mod:`.options`, which imports no torch)."""
    add_options(parser)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark mode ``args`` asks for and print its tables; returns the exit code."""
    if getattr(args, "cache_ops", False):
        from . import cache_ops

        return cache_ops.run(args)
    if getattr(args, "pinning", False):
        from . import pinning

        return pinning.run(args)
    if getattr(args, "submission", False):
        from . import submission

        return submission.run(args)
    return _run_swaps(args)


def _run_swaps(args: argparse.Namespace) -> int:
    import torch

    from ..registry import get_backend
    from . import swaps as bench
    from .table import write_json

    backend = get_backend(args.backend)
    with bench.side_stream(backend.device):
        swaps = bench.bench_swaps(backend, args.swap_mib << 20, args.repeats)
    gathers = bench.bench_gathers(backend, args.repeats)
    print(f"backend {backend.name} on {backend.device} (torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load {os.getloadavg()[0]:.2f}); GB/s, median of {args.repeats}")
    print()
    bench.print_figures(swaps, gathers)
    if getattr(args, "plot", None):
        from .plot import plot_swaps

        plot_swaps(swaps, args.plot, f"swap_blocks_batch on {backend.name} ({backend.device}), device->host, "
                   f"{args.swap_mib} MiB per case, permuted destinations; torch {torch.__version__}")
        print(f"plot written to {args.plot}")
    if args.json:
        write_json(args.json, {"backend": backend.name, "device": str(backend.device), "torch": torch.__version__,
                               "capabilities": backend.capabilities.as_dict(), **bench.figures_as_json(swaps, gathers)})
    return 0
