"""``hisparse-hal bench --submission``: host cost from ``swap_blocks_batch`` to the vendor batch call.

Drives the real GPU backends (``CudaBackend`` + ``CudaDriver``, ``RocmBackend`` + ``HipRuntime``) over the
SIMULATED vendor libraries shipped in :mod:`hisparse_hal.testing`, so it runs from an installed wheel too.
The vendor batch call is replaced by a stub that only counts, so the figure is validation plus descriptor
marshalling plus binding overhead, excluding the copy itself. Nothing here runs on, or says anything about, a GPU.
"""

from __future__ import annotations

import argparse
import bisect
import ctypes
import dataclasses
import functools
import os
from collections.abc import Callable
from typing import Any

import torch

from ..backend import HiSparseBackend
from ..errors import InvalidDescriptorError
from .table import Column, format_table, write_json
from .timing import time_runs

__all__ = [
    "SubmissionFigure",
    "bench_submission",
    "marginal_ns",
    "plain_marshalling",
    "SUBMISSION_COUNTS",
    "ENGINE_LAYERS",
]

SUBMISSION_COUNTS = (8192, 16384, 65536)
#: Layer regions of the engine-shaped rows: DeepSeek-V3.2 has 61 layers, each with its own KV-cache tensor.
ENGINE_LAYERS = 61
_BLOCK = 656
_STREAM = 0x5A00  # any non-legacy stream handle: the batch call refuses the legacy one


@dataclasses.dataclass(frozen=True)
class SubmissionFigure:
    """Host microseconds for one batch of ``descriptors`` on ``backend``: ours (fastest and median run)
    and the plain alternative (median)."""

    backend: str
    descriptors: int
    vendor_calls: int
    ours_best_us: float
    ours_median_us: float
    plain_us: float

    @property
    def speedup_vs_plain(self) -> float:
        """The plain Python marshalling's median time over ours."""
        return self.plain_us / self.ours_median_us


class _CountingStub:
    """Stands in for the vendor batch call once the real (simulated) call has been proven: counts, returns 0."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args: Any) -> int:
        self.calls += 1
        return 0


def _cuda_backend(device_memory: torch.Tensor) -> tuple[HiSparseBackend, Callable[[_CountingStub], None]]:
    from ..testing.sim_cuda_driver import SimulatedCudaDriver
    from ..testing.sim_device_module import SimulatedDeviceModule
    from ..vendors.cuda.backend import CudaBackend
    from ..vendors.cuda.runtime import CudaDriver

    sim = SimulatedCudaDriver(12080)
    start = device_memory.data_ptr()
    sim._device_memory.append((start, start + device_memory.numel(), device_memory))  # as allocate_device does
    runtime = CudaDriver(0, sim)
    # torch's stream and capture state replaced (no GPU device module on the CPU): a fixed non-legacy stream.
    backend = CudaBackend.for_device(0, 12080, "sm_90", runtime=runtime, device=torch.device("cpu"),
                                     device_module=SimulatedDeviceModule(_STREAM))

    def install(stub: _CountingStub) -> None:
        runtime.has_batch_copy()
        runtime._batch = stub  # benchmark only: exclude the vendor call
        # In a real process torch's runtime has made the primary context current on this thread, so
        # each swap costs one cuCtxGetCurrent, not a push and a pop; set the simulation up the same way.
        sim.cuCtxPushCurrent_v2(runtime._primary_context())

    return backend, install


def _rocm_backend(device_memory: torch.Tensor) -> tuple[HiSparseBackend, Callable[[_CountingStub], None]]:
    from ..testing.sim_hip_runtime import SimulatedHipRuntime, simulated_rocm_backend

    sim = SimulatedHipRuntime("7.14", run_copies_immediately=True)
    sim.adopt_device_memory(device_memory)
    backend = simulated_rocm_backend(sim, "gfx950", stream=_STREAM)

    def install(stub: _CountingStub) -> None:
        backend.runtime._functions["hipMemcpyBatchAsync"] = stub  # benchmark only: exclude the vendor call

    return backend, install


def plain_marshalling(
    regions: list[tuple[int, int]], src: list[int], dst: list[int], sizes: list[int]
) -> tuple[Any, Any, Any]:
    """The plain alternative: a Python loop checking each descriptor against sorted ``(start, end)``
    regions and building the three ``uint64`` arrays a vendor batch call takes.

    Raises:
        InvalidDescriptorError: a descriptor outside every region (naming it).
    """
    starts = [start for start, _ in regions]
    out_dst, out_src, out_sizes = [], [], []
    for i, (s, d, n) in enumerate(zip(src, dst, sizes, strict=True)):
        for address in (s, d):
            k = bisect.bisect_right(starts, address) - 1
            if n < 0 or k < 0 or address + n > regions[k][1]:
                raise InvalidDescriptorError(
                    f"swap descriptor {i} at {address:#x} ({n} bytes) is outside every region", i
                )
        if n:
            out_dst.append(d)
            out_src.append(s)
            out_sizes.append(n)
    array = ctypes.c_uint64 * len(out_sizes)
    return array(*out_dst), array(*out_src), array(*out_sizes)


def _times_us(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """``(fastest, median)`` host microseconds of ``repeats`` timed runs after one warm-up."""
    timing = time_runs(fn, repeats)
    return timing.best_s * 1e6, timing.median_s * 1e6


def _time_batch(
    backend: HiSparseBackend,
    stub: _CountingStub,
    row: str,
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    repeats: int,
) -> SubmissionFigure:
    """Time ``swap_blocks_batch(*batch)`` on ``backend`` (vendor call stubbed) and the plain marshalling of
    the same descriptors against ``backend``'s regions."""
    stub.calls = 0
    best, median = _times_us(functools.partial(backend.swap_blocks_batch, *batch), repeats)
    calls = stub.calls // (repeats + 1)
    table = sorted((r.start, r.end) for r in backend.regions)
    lists = tuple(t.tolist() for t in batch)
    _, plain = _times_us(functools.partial(plain_marshalling, table, *lists), max(3, repeats // 20))
    return SubmissionFigure(row, batch[0].numel(), calls, best, median, plain)


def bench_submission(repeats: int = 200, counts: tuple[int, ...] = SUBMISSION_COUNTS) -> list[SubmissionFigure]:
    """Measure, per simulated GPU backend and batch size, the host time of ``swap_blocks_batch`` with the
    vendor batch call stubbed out, beside the plain Python marshalling of the same descriptors.

    Three region layouts of the same device memory: one region; four (sources over four cache layers, the
    smallest batch only); and :data:`ENGINE_LAYERS` layer regions with a gap of one block between them, as an
    engine registers one KV-cache tensor per layer (DeepSeek-V3.2 has 61), at every batch size.

    The first swap of each backend goes through the simulated vendor call and its bytes are checked, so
    the stubbed runs time the path that is proven to copy correctly.

    Raises:
        AssertionError: the proving swap moved wrong bytes.
    """
    largest = max(counts)
    per_layer = -(-largest // ENGINE_LAYERS)  # blocks per layer region: all layers hold the largest batch
    seeded = torch.Generator().manual_seed(3)
    # Room for the layer regions and the one-block gaps between them; the other layouts use the front.
    blocks = ENGINE_LAYERS * (per_layer + 1)
    device_memory = torch.randint(0, 256, (blocks * _BLOCK,), dtype=torch.uint8, generator=seeded)
    host = torch.zeros(largest * _BLOCK, dtype=torch.uint8)
    generator = torch.Generator().manual_seed(4)
    base = device_memory.data_ptr()
    gpu = torch.device("cuda", 0)
    figures = []
    for label, build in (("cuda (simulated driver 12.8)", _cuda_backend), ("rocm (simulated HIP 7.14)", _rocm_backend)):
        backend, install_stub = build(device_memory)
        region = backend.register_region(base, largest * _BLOCK, "bench device memory", device=gpu)
        backend.pin_tensor(host)
        try:
            proof = torch.arange(64, dtype=torch.int64)
            host.zero_()
            backend.swap_blocks_batch(base + proof * _BLOCK,
                                      host.data_ptr() + proof.flip(0) * _BLOCK,
                                      torch.full((64,), _BLOCK, dtype=torch.int64))
            moved, wanted = host[: 64 * _BLOCK].view(64, _BLOCK).flip(0), device_memory[: 64 * _BLOCK].view(64, _BLOCK)
            if not torch.equal(moved, wanted):
                raise AssertionError(f"{label}: the proving swap moved wrong bytes")
            stub = _CountingStub()
            install_stub(stub)

            def spill(count: int, layer_count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
                """``count`` spills from distinct device blocks (over the layer regions when ``layer_count``
                is more than one) to distinct host blocks."""
                block = torch.randperm(largest, generator=generator)[:count]
                if layer_count > 1:
                    block = torch.div(block, per_layer, rounding_mode="floor") * (per_layer + 1) + block % per_layer
                dst = host.data_ptr() + torch.randperm(largest, generator=generator)[:count] * _BLOCK
                return base + block * _BLOCK, dst, torch.full((count,), _BLOCK, dtype=torch.int64)

            for count in counts:
                figures.append(_time_batch(backend, stub, label, spill(count, 1), repeats))
            backend.unregister_region(region)
            # Sources spread over four regions (four cache layers, say).
            quarter = largest * _BLOCK // 4
            layers = [backend.register_region(base + i * quarter, quarter, f"bench layer {i}", device=gpu)
                      for i in range(4)]
            figures.append(_time_batch(backend, stub, f"{label}, sources in 4 regions", spill(min(counts), 1),
                                       repeats))
            for layer in layers:
                backend.unregister_region(layer)
            # An engine's layout: one region per layer, a block apart; a batch spills from every layer.
            layers = [backend.register_region(base + i * (per_layer + 1) * _BLOCK, per_layer * _BLOCK,
                                              f"bench layer {i}", device=gpu) for i in range(ENGINE_LAYERS)]
            for count in counts:
                figures.append(_time_batch(backend, stub, f"{label}, sources in {ENGINE_LAYERS} regions",
                                           spill(count, ENGINE_LAYERS), repeats))
        finally:
            backend.unpin_tensor(host)
            for known in list(backend.regions):
                if known.label.startswith("bench "):
                    backend.unregister_region(known)
    return figures


def marginal_ns(figures: list[SubmissionFigure], backend: str) -> float | None:
    """Nanoseconds per descriptor beyond the smallest batch (fastest runs of the smallest and largest
    batch measured on ``backend``); None with fewer than two sizes."""
    rows = sorted((f for f in figures if f.backend == backend), key=lambda f: f.descriptors)
    if len(rows) < 2:
        return None
    a, b = rows[0], rows[-1]
    return (b.ours_best_us - a.ours_best_us) * 1e3 / (b.descriptors - a.descriptors)


SUBMISSION_COLUMNS = (
    Column("backend", 52, lambda f: f.backend, align="<"),
    Column("count", 6, lambda f: f.descriptors),
    Column("calls", 5, lambda f: f.vendor_calls),
    Column("best us", 8, lambda f: f.ours_best_us, ".1f"),
    Column("median us", 9, lambda f: f.ours_median_us, ".1f"),
    Column("plain us", 9, lambda f: f.plain_us, ".0f"),
    Column("x plain", 8, lambda f: f"{f.speedup_vs_plain:.0f}x"),
)


def run(args: argparse.Namespace) -> int:
    """``bench --submission``: measure and print the table (and ``--json``); returns the exit code."""
    repeats = max(args.repeats, 50)
    figures = bench_submission(repeats)
    print(f"swap submission host cost, SIMULATED vendor libraries, vendor batch call stubbed out "
          f"(torch {torch.__version__}, load {os.getloadavg()[0]:.2f}); us per swap_blocks_batch, {repeats} runs")
    print()
    print("\n".join(format_table(SUBMISSION_COLUMNS, figures)))
    print()
    for name in dict.fromkeys(f.backend for f in figures):
        extra = marginal_ns(figures, name)
        if extra is not None:
            print(f"{name}: {extra:.1f} ns per extra descriptor (fastest runs, smallest to largest batch)")
    print("plain = a Python loop checking each descriptor against the regions and building three ctypes arrays")
    if args.json:
        write_json(args.json, {"submission": [dict(dataclasses.asdict(f), speedup_vs_plain=f.speedup_vs_plain)
                                              for f in figures]})
    return 0
