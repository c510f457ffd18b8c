"""``hisparse-hal bench --pinning``: pin and unpin one host pool on the CPU device at several chunk sizes.

Each case sets ``HISPARSE_HAL_PIN_CHUNK_BYTES`` (the chunk cap every backend reads) for a fresh ``CpuBackend`` and
times one ``pin_tensor`` and one ``unpin_tensor`` of a ``--pin-mib`` pool, so the cost per chunk shows whether
pinning stays linear in the chunk count (issue 30 item 8).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import torch

from ..host_registration import CHUNK_ENV
from .options import add_pinning_options

__all__ = ["PinFigures", "add_arguments", "measure", "run"]



@dataclasses.dataclass(frozen=True)
class PinFigures:
    """One case: pool bytes, chunk cap, chunks made, seconds to pin and to unpin, whether mlock held."""

    pool_bytes: int
    chunk_bytes: int
    chunks: int
    pin_s: float
    unpin_s: float
    page_locked: bool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``bench --pinning`` (:func:`.options.add_pinning_options`)."""
    add_pinning_options(parser)


def measure(pool: torch.Tensor, chunk_bytes: int) -> PinFigures:
    """Pin and unpin ``pool`` once on a fresh CPU backend built with chunk cap ``chunk_bytes``."""
    from ..probing import registered_specs

    (cpu,) = [spec for spec in registered_specs() if spec.name == "cpu"]  # the reference device, through its spec
    previous = os.environ.get(CHUNK_ENV)
    os.environ[CHUNK_ENV] = str(chunk_bytes)
    try:
        backend = cpu.load_class()()
    finally:
        if previous is None:
            os.environ.pop(CHUNK_ENV, None)
        else:
            os.environ[CHUNK_ENV] = previous
    start = time.perf_counter()
    backend.pin_tensor(pool)
    pinned = time.perf_counter()
    record = backend.host_registration(pool)
    backend.unpin_tensor(pool)
    done = time.perf_counter()
    nbytes = pool.numel() * pool.element_size()
    return PinFigures(nbytes, chunk_bytes, len(record.chunks), pinned - start, done - pinned, record.page_locked)


def format_figures(figures: list[PinFigures]) -> list[str]:
    """The table ``run`` prints: one line per chunk size."""
    lines = [f"{'pool':>8} {'chunk':>9} {'chunks':>8} {'pin s':>8} {'unpin s':>8} {'us/chunk':>9} locked"]
    for f in figures:
        per_chunk = (f.pin_s + f.unpin_s) / f.chunks * 1e6
        lines.append(f"{f.pool_bytes >> 20:>5} MiB {f.chunk_bytes >> 10:>5} KiB {f.chunks:>8} {f.pin_s:>8.3f} "
                     f"{f.unpin_s:>8.3f} {per_chunk:>9.1f} {'yes' if f.page_locked else 'no'}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Time every chunk size of ``--pin-chunks`` on a ``--pin-mib`` pool and print the table."""
    from .arguments import positive_ints

    chunks = positive_ints(args.pin_chunks, "--pin-chunks")
    pool = torch.zeros(args.pin_mib << 20, dtype=torch.uint8)
    print(f"pin_tensor + unpin_tensor of {args.pin_mib} MiB on the CPU device (torch {torch.__version__}, "
          f"load {os.getloadavg()[0]:.2f}); one run per chunk size")
    figures = [measure(pool, chunk) for chunk in chunks]
    for line in format_figures(figures):
        print(line)
    return 0
