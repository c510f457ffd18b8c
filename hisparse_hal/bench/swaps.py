"""``hisparse-hal bench``: swap and gather throughput against the plain alternative and the physical limit.

Every row compares, in one run on one backend: our path, the plain alternative (a per-copy loop for
swaps, the reference implementation for gathers), and a single contiguous copy of the same bytes.
Figures are medians of repeated runs, each between two ``backend.synchronize()`` calls.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
from collections.abc import Callable

import torch

from ..backend import HiSparseBackend
from ..gather import reference_gather_rows
from .table import Column, format_table
from .timing import on_accelerator, time_runs

__all__ = [
    "SwapFigure",
    "GatherFigure",
    "bench_swaps",
    "bench_gathers",
    "side_stream",
    "print_figures",
    "figures_as_json",
]

SWAP_BLOCK_BYTES = (656, 4096, 65536, 1 << 20)
GATHER_ROWS = (2048, 16384, 131072)
DS_MLA_ROW = 656


def side_stream(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """Swaps run on a side stream on GPUs: the batch call rejects the legacy default stream (handle 0)
    and falls back to the per-copy loop there (vLLM cache_kernels.cu; cudf #20800), as engines must.
    The stream is the device module's (``torch.get_device_module(device)``); the host has none."""
    if not on_accelerator(device):
        return contextlib.nullcontext()
    module = torch.get_device_module(device)
    return module.stream(module.Stream(device))


def _median_seconds(fn: Callable[[], object], synchronize: Callable[[], object] | None, repeats: int) -> float:
    return time_runs(fn, repeats, synchronize).median_s


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


def _loop_alternative(
    backend: HiSparseBackend, src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor
) -> tuple[Callable[[], None], str]:
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
            ours = _median_seconds(
                functools.partial(backend.swap_blocks_batch, src, dst, sizes), backend.synchronize, repeats
            )
            loop_fn, loop_kind = _loop_alternative(backend, src, dst, sizes)
            loop = _median_seconds(loop_fn, backend.synchronize, repeats)
            one = _median_seconds(functools.partial(host.copy_, source, non_blocking=True), backend.synchronize,
                                  repeats)
            check_batch = functools.partial(backend.regions.check_swap_batch, src, dst, sizes)
            check = _median_seconds(check_batch, None, repeats)  # host work only
            expected = source.cpu().view(count, block)[torch.argsort(order)]
            backend.swap_blocks_batch(src, dst, sizes)
            backend.synchronize()
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
        source = torch.randint(0, 256, (num_blocks, block_size, DS_MLA_ROW), dtype=torch.uint8, generator=generator).to(
            backend.device
        )
        ids = torch.randperm(num_blocks * block_size, generator=generator)[:rows].to(backend.device)
        ids[::97] = -1
        ours_out = torch.empty(rows, DS_MLA_ROW, dtype=torch.uint8, device=backend.device)
        ref_out = torch.empty_like(ours_out)
        flat = source.view(-1)[: rows * DS_MLA_ROW].view(rows, DS_MLA_ROW)
        wait = backend.synchronize
        ours = _median_seconds(functools.partial(backend.gather_resident_rows, source, ours_out, ids), wait, repeats)
        ref = _median_seconds(functools.partial(reference_gather_rows, source, ref_out, ids), wait, repeats)
        one = _median_seconds(functools.partial(ours_out.copy_, flat), wait, repeats)
        backend.gather_resident_rows(source, ours_out, ids)
        reference_gather_rows(source, ref_out, ids)
        backend.synchronize()
        if not torch.equal(ours_out, ref_out):
            raise AssertionError("benchmark gather differs from the reference implementation")
        nbytes = rows * DS_MLA_ROW
        figures.append(GatherFigure(rows, DS_MLA_ROW, nbytes / ours / 1e9, nbytes / ref / 1e9, nbytes / one / 1e9))
    return figures


SWAP_COLUMNS = (
    Column("block", 8, lambda f: f.block_bytes),
    Column("count", 7, lambda f: f.descriptors),
    Column("ours", 8, lambda f: f.ours_gbps, ".2f"),
    Column("loop", 8, lambda f: f.loop_gbps, ".2f"),
    Column("one copy", 9, lambda f: f.one_copy_gbps, ".2f"),
    Column("x loop", 7, lambda f: f"{f.speedup_vs_loop:.1f}x"),
    Column("of limit", 8, lambda f: f.fraction_of_limit, ".0%"),
    Column("check us", 9, lambda f: f.check_us, ".0f"),
    Column(" loop kind", 0, lambda f: f" {f.loop_kind}", align="<"),
)
GATHER_COLUMNS = (
    Column("rows", 8, lambda g: g.rows),
    Column("ours", 8, lambda g: g.ours_gbps, ".2f"),
    Column("reference", 10, lambda g: g.reference_gbps, ".2f"),
    Column("one copy", 9, lambda g: g.one_copy_gbps, ".2f"),
    Column("x ref", 7, lambda g: f"{g.speedup_vs_reference:.1f}x"),
)


def print_figures(swaps: list[SwapFigure], gathers: list[GatherFigure]) -> None:
    """Print the swap and gather tables (GB/s; ratios against the loop, the reference and one copy)."""
    print("swap_blocks_batch: device->host, permuted destinations")
    print("\n".join(format_table(SWAP_COLUMNS, swaps)))
    print()
    print("gather_resident_rows: 656-byte rows (fp8_ds_mla), random ids, 1% of them -1")
    print("\n".join(format_table(GATHER_COLUMNS, gathers)))


def figures_as_json(swaps: list[SwapFigure], gathers: list[GatherFigure]) -> dict[str, list[dict[str, object]]]:
    """The figures with their ratios, JSON-ready."""
    return {
        "swaps": [dict(dataclasses.asdict(f), speedup_vs_loop=f.speedup_vs_loop, fraction_of_limit=f.fraction_of_limit)
                  for f in swaps],
        "gathers": [dict(dataclasses.asdict(g), speedup_vs_reference=g.speedup_vs_reference) for g in gathers],
    }
