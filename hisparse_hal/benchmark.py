"""``hisparse-hal bench``: swap and gather throughput against the plain alternative and the physical limit.

Every row compares, in one run on one backend: our path, the plain alternative (a per-copy loop for
swaps, the reference implementation for gathers), and a single contiguous copy of the same bytes.
Figures are medians of repeated runs, device-synchronized.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import functools
import json
import os
import statistics
import time
from collections.abc import Callable

import torch

from .backend import HiSparseBackend
from .gather import reference_gather_rows
from .registry import get_backend

__all__ = ["SwapFigure", "GatherFigure", "bench_swaps", "bench_gathers", "add_arguments", "run"]

SWAP_BLOCK_BYTES = (656, 4096, 65536, 1 << 20)
GATHER_ROWS = (2048, 16384, 131072)
DS_MLA_ROW = 656


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _side_stream(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """Swaps run on a side stream on GPUs: the batch call rejects the legacy default stream (handle 0)
    and falls back to the per-copy loop there (vLLM cache_kernels.cu; cudf #20800), as engines must."""
    if device.type == "cuda":
        return torch.cuda.stream(torch.cuda.Stream(device))
    return contextlib.nullcontext()


def _median_seconds(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclasses.dataclass(frozen=True)
class SwapFigure:
    """One swap measurement: descriptors of ``block_bytes`` each, GB/s for each path."""

    block_bytes: int
    descriptors: int
    ours_gbps: float
    loop_gbps: float
    loop_kind: str
    one_copy_gbps: float
    check_us: float

    @property
    def speedup_vs_loop(self) -> float:
        """Our throughput over the per-copy loop's."""
        return self.ours_gbps / self.loop_gbps

    @property
    def fraction_of_limit(self) -> float:
        """Our throughput over one contiguous copy of the same bytes."""
        return self.ours_gbps / self.one_copy_gbps


@dataclasses.dataclass(frozen=True)
class GatherFigure:
    """One gather measurement: ``rows`` rows of ``row_bytes``, GB/s for each path."""

    rows: int
    row_bytes: int
    ours_gbps: float
    reference_gbps: float
    one_copy_gbps: float

    @property
    def speedup_vs_reference(self) -> float:
        """Our throughput over the reference implementation's."""
        return self.ours_gbps / self.reference_gbps


def _loop_alternative(backend: HiSparseBackend, src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor) -> tuple[Callable[[], None], str]:
    """The plain per-copy alternative: the backend's own loop mode where it has one (GPU runtimes),
    else a Python loop of memmoves (host memory)."""
    if hasattr(backend, "batch_copy_mode") and backend.device.type != "cpu":
        def loop() -> None:
            previous = backend.batch_copy_mode
            backend.batch_copy_mode = "loop"
            try:
                backend.swap_blocks_batch(src, dst, sizes)
            finally:
                backend.batch_copy_mode = previous
        return loop, "runtime per-copy loop"
    triples = list(zip(src.tolist(), dst.tolist(), sizes.tolist(), strict=True))

    def memmoves() -> None:
        for s, d, n in triples:
            ctypes.memmove(d, s, n)
    return memmoves, "python memmove loop"


def bench_swaps(backend: HiSparseBackend, total_bytes: int, repeats: int) -> list[SwapFigure]:
    """Measure device-to-host swaps of ``total_bytes`` per block size, permuted destinations."""
    figures = []
    generator = torch.Generator().manual_seed(0)
    for block in SWAP_BLOCK_BYTES:
        count = max(1, total_bytes // block)
        nbytes = count * block
        source = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=generator).to(backend.device)
        host = torch.empty(nbytes, dtype=torch.uint8)
        backend.pin_tensor(host)
        region = backend.register_region(source.data_ptr(), nbytes, "bench source")
        try:
            order = torch.randperm(count, generator=generator)
            src = source.data_ptr() + torch.arange(count, dtype=torch.int64) * block
            dst = host.data_ptr() + order.to(torch.int64) * block
            sizes = torch.full((count,), block, dtype=torch.int64)
            ours = _median_seconds(functools.partial(backend.swap_blocks_batch, src, dst, sizes), backend.device, repeats)
            loop_fn, loop_kind = _loop_alternative(backend, src, dst, sizes)
            loop = _median_seconds(loop_fn, backend.device, repeats)
            one = _median_seconds(functools.partial(host.copy_, source, non_blocking=True), backend.device, repeats)
            check_batch = functools.partial(backend.regions.check_swap_batch, src, dst, sizes)
            check = _median_seconds(check_batch, torch.device("cpu"), repeats)
            expected = source.cpu().view(count, block)[torch.argsort(order)]
            backend.swap_blocks_batch(src, dst, sizes)
            _sync(backend.device)
            if not torch.equal(host.view(count, block), expected):
                raise AssertionError(f"benchmark swap of {block}-byte blocks moved wrong bytes")
        finally:
            backend.unregister_region(region)
            backend.unpin_tensor(host)
        figures.append(SwapFigure(block, count, nbytes / ours / 1e9, nbytes / loop / 1e9, loop_kind,
                                  nbytes / one / 1e9, check * 1e6))
    return figures


def bench_gathers(backend: HiSparseBackend, repeats: int) -> list[GatherFigure]:
    """Measure gathers of 656-byte ``fp8_ds_mla`` rows into staging, ours against the reference."""
    figures = []
    generator = torch.Generator().manual_seed(1)
    block_size = 64
    for rows in GATHER_ROWS:
        num_blocks = 2 * rows // block_size
        source = torch.randint(0, 256, (num_blocks, block_size, DS_MLA_ROW), dtype=torch.uint8, generator=generator).to(backend.device)
        ids = torch.randperm(num_blocks * block_size, generator=generator)[:rows].to(backend.device)
        ids[::97] = -1
        ours_out = torch.empty(rows, DS_MLA_ROW, dtype=torch.uint8, device=backend.device)
        ref_out = torch.empty_like(ours_out)
        flat = source.view(-1)[: rows * DS_MLA_ROW].view(rows, DS_MLA_ROW)
        ours = _median_seconds(functools.partial(backend.gather_resident_rows, source, ours_out, ids), backend.device,
                               repeats)
        ref = _median_seconds(functools.partial(reference_gather_rows, source, ref_out, ids), backend.device, repeats)
        one = _median_seconds(functools.partial(ours_out.copy_, flat), backend.device, repeats)
        backend.gather_resident_rows(source, ours_out, ids)
        reference_gather_rows(source, ref_out, ids)
        _sync(backend.device)
        if not torch.equal(ours_out, ref_out):
            raise AssertionError("benchmark gather differs from the reference implementation")
        nbytes = rows * DS_MLA_ROW
        figures.append(GatherFigure(rows, DS_MLA_ROW, nbytes / ours / 1e9, nbytes / ref / 1e9, nbytes / one / 1e9))
    return figures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``hisparse-hal bench``."""
    parser.add_argument("--backend", default=None, help="backend name (strict); default: the selected one")
    parser.add_argument("--swap-mib", type=int, default=64, help="bytes per swap case, in MiB (default 64)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per path (median reported)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--plot", default=None, metavar="FILE.png",
                        help="also draw swap GB/s against block size (needs the [plot] extra: matplotlib)")
    parser.add_argument("--submission", action="store_true",
                        help="instead: host cost from swap_blocks_batch to the vendor batch call, through the "
                        "SIMULATED CUDA driver and HIP runtime of a source checkout, beside plain Python marshalling")


def _run_submission(args: argparse.Namespace) -> int:
    from .submission_bench import bench_submission, marginal_ns

    repeats = max(args.repeats, 50)
    figures = bench_submission(repeats)
    print(f"swap submission host cost, SIMULATED vendor libraries, vendor batch call stubbed out (torch {torch.__version__}, "
          f"load {os.getloadavg()[0]:.2f}); us per swap_blocks_batch, {repeats} runs")
    print()
    print(f"{'backend':<52} {'count':>6} {'calls':>5} {'best us':>8} {'median us':>9} {'plain us':>9} {'x plain':>8}")
    for f in figures:
        print(f"{f.backend:<52} {f.descriptors:>6} {f.vendor_calls:>5} {f.ours_best_us:>8.1f} {f.ours_median_us:>9.1f} "
              f"{f.plain_us:>9.0f} {f.speedup_vs_plain:>7.0f}x")
    print()
    for name in dict.fromkeys(f.backend for f in figures):
        extra = marginal_ns(figures, name)
        if extra is not None:
            print(f"{name}: {extra:.1f} ns per extra descriptor (fastest runs, smallest to largest batch)")
    print("plain = a Python loop checking each descriptor against the regions and building three ctypes arrays")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"submission": [dict(dataclasses.asdict(f), speedup_vs_plain=f.speedup_vs_plain) for f in figures]},
                      handle, indent=2)
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and print a table; returns the exit code."""
    if getattr(args, "submission", False):
        return _run_submission(args)
    backend = get_backend(args.backend)
    with _side_stream(backend.device):
        swaps = bench_swaps(backend, args.swap_mib << 20, args.repeats)
    gathers = bench_gathers(backend, args.repeats)
    print(f"backend {backend.name} on {backend.device} (torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load {os.getloadavg()[0]:.2f}); GB/s, median of {args.repeats}")
    print()
    print("swap_blocks_batch: device->host, permuted destinations")
    print(f"{'block':>8} {'count':>7} {'ours':>8} {'loop':>8} {'one copy':>9} {'x loop':>7} {'of limit':>8} {'check us':>9}  loop kind")
    for f in swaps:
        print(f"{f.block_bytes:>8} {f.descriptors:>7} {f.ours_gbps:>8.2f} {f.loop_gbps:>8.2f} {f.one_copy_gbps:>9.2f} "
              f"{f.speedup_vs_loop:>6.1f}x {f.fraction_of_limit:>7.0%} {f.check_us:>9.0f}  {f.loop_kind}")
    print()
    print("gather_resident_rows: 656-byte rows (fp8_ds_mla), random ids, 1% of them -1")
    print(f"{'rows':>8} {'ours':>8} {'reference':>10} {'one copy':>9} {'x ref':>7}")
    for g in gathers:
        print(f"{g.rows:>8} {g.ours_gbps:>8.2f} {g.reference_gbps:>10.2f} {g.one_copy_gbps:>9.2f} {g.speedup_vs_reference:>6.1f}x")
    if getattr(args, "plot", None):
        from .bench_plot import plot_swaps

        plot_swaps(swaps, args.plot, f"swap_blocks_batch on {backend.name} ({backend.device}), device->host, "
                   f"{args.swap_mib} MiB per case, permuted destinations; torch {torch.__version__}")
        print(f"plot written to {args.plot}")
    if args.json:
        payload = {
            "backend": backend.name,
            "device": str(backend.device),
            "torch": torch.__version__,
            "capabilities": backend.capabilities.as_dict(),
            "swaps": [dict(dataclasses.asdict(f), speedup_vs_loop=f.speedup_vs_loop, fraction_of_limit=f.fraction_of_limit) for f in swaps],
            "gathers": [dict(dataclasses.asdict(g), speedup_vs_reference=g.speedup_vs_reference) for g in gathers],
        }
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=2, default=str)
    return 0
