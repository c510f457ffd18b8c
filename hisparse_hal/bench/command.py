"""``hisparse-hal bench``: its options and which benchmark each mode runs (swaps and gathers by default)."""

from __future__ import annotations

import argparse
import os

import torch

from ..registry import get_backend
from .arguments import Given
from .table import write_json

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hisparse-hal bench`` (every mode)."""
    from . import cache_ops, pinning

    parser.add_argument("--backend", default=None, help="backend name (strict); default: the selected one")
    parser.add_argument("--swap-mib", type=int, default=64, action=Given,
                        help="bytes per swap case, in MiB (default 64)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed repeats per path, median reported (default 5; --submission uses at least 50)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--plot", default=None, metavar="FILE.png", action=Given,
                        help="also draw swap GB/s against block size (needs the [plot] extra: matplotlib)")
    parser.add_argument("--submission", action="store_true",
                        help="instead: host cost from swap_blocks_batch to the vendor batch call, through the "
                        "SIMULATED CUDA driver and HIP runtime of a source checkout, beside plain Python marshalling "
                        "(raises --repeats to at least 50)")
    cache_ops.add_arguments(parser)
    pinning.add_arguments(parser)


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
    from . import swaps as bench

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
