"""``hisparse-hal bench --cache-ops``: one decode step of vLLM 0.34.0's cache ops at DeepSeek-V3.2 HiSparse shapes.

Per case (656-byte fp8_ds_mla rows, top-k 2048, Q token rows per request with (Q + 1) x K hot slots, 64 to 512
requests) it times resolve_residency + gather_compact in each implementation on the same warmed state, checks
that they agree bit for bit, sets gather_compact against one copy of the same bytes, and measures each call's
peak extra memory and kernel launches (untimed). Figures are medians of device-synchronized repeats.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hisparse_hal.cache_ops.shapes import BLOCK, ROW_BYTES, TOP_K
from hisparse_hal.errors import InvalidArgumentError

from .arguments import positive_ints
from .options import DEFAULT_REQUESTS, add_cache_ops_options
from .table import Column, InterruptedWithFigures, format_header, format_row, write_json
from .timing import on_accelerator, time_runs

if TYPE_CHECKING:
    from hisparse_hal.backend import HiSparseBackend

__all__ = ["CacheOpsCase", "CacheOpsFigure", "bench_case", "add_arguments", "run", "DEFAULT_REQUESTS"]

#: Implementation modules measured, in table order.
IMPLEMENTATIONS = ("oracle", "host_impl", "torch_impl", "triton_impl")


@dataclasses.dataclass(frozen=True)
class CacheOpsCase:
    """One benchmark shape: ``requests`` decode requests of ``queries`` token rows and ``context`` tokens each.

    ``slots`` (hot slots per request) defaults to vLLM's device_buffer_size, ``(queries + 1) * top_k``.
    """

    requests: int
    context: int = 8192
    top_k: int = TOP_K
    slots: int | None = None
    churn: float = 0.1  # share of each row's top-k that changes between two steps
    queries: int = 1

    @property
    def hot_slots(self) -> int:
        return self.slots if self.slots is not None else (self.queries + 1) * self.top_k


@dataclasses.dataclass(frozen=True)
class CacheOpsFigure:
    """Median seconds of one step (resolve + compact) per implementation, with its memory and launches.

    ``*_peak_bytes``: the most bytes the call had allocated beyond what existed before it (torch's CUDA
    allocator statistics on a GPU; on CPU the allocation events of torch's profiler memory view).
    ``launches``: kernels one step dispatches (resolve + compact); None where the implementation offers no
    counter (the oracle).
    """

    case: CacheOpsCase
    implementation: str
    resolve_s: float
    compact_s: float
    repeats: int
    rows_copied: int
    one_copy_s: float
    matches_torch: bool | None
    resolve_peak_bytes: int | None = None
    compact_peak_bytes: int | None = None
    launches: int | None = None

    @property
    def step_s(self) -> float:
        return self.resolve_s + self.compact_s

    @property
    def bytes_copied(self) -> int:
        return self.rows_copied * ROW_BYTES


class _Step:
    """The tensors of one warmed decode step; :meth:`restore` puts the replacement state back."""

    def __init__(self, case: CacheOpsCase, backend: HiSparseBackend, seed: int = 0) -> None:
        device = backend.device
        r, q, k, h = case.requests, case.queries, case.top_k, case.hot_slots
        if case.context < k or case.context % BLOCK or h % BLOCK or q < 1:
            raise InvalidArgumentError(
                f"context ({case.context}) must be >= top_k ({k}) and, like slots ({h}), a multiple of {BLOCK}; "
                f"queries ({q}) must be >= 1"
            )
        generator = torch.Generator().manual_seed(seed)
        pages = case.context // BLOCK
        host_rows = (1 + r * pages) * BLOCK  # host block 0 is the null block
        host = torch.empty(host_rows, ROW_BYTES, dtype=torch.uint8)
        host.view(-1)[::4096] = 1  # touch every page once so first-touch faults stay out of the timing
        self.backend = backend
        self.pinned = host
        if device.type != "cpu":
            backend.pin_tensor(host)
        self.host = backend.device_view_of_host(host)  # what CacheOps hands the implementations
        self.source = (1 + torch.arange(r * pages, dtype=torch.int32).view(r, pages)).to(device)
        hot_blocks = r * (h // BLOCK)
        # vLLM 0.34.0's hot view: as_strided over a slab that interleaves two layers' blocks (runtime.py:81-107),
        # so the block stride is twice a block and dimension 0 is not contiguous.
        self.slab = torch.zeros(hot_blocks, 2, BLOCK, ROW_BYTES, dtype=torch.uint8, device=device)
        self.hot = self.slab[:, 0]
        self.hot_table = torch.arange(hot_blocks, dtype=torch.int32).view(r, h // BLOCK).to(device)
        self.dgi = torch.full((r, h), -1, dtype=torch.int32, device=device)
        self.lru = torch.arange(h, dtype=torch.int16).repeat(r, 1).to(device)
        self.states = torch.arange(r, dtype=torch.int32, device=device)
        self.request_ids = torch.arange(r, dtype=torch.int32).repeat_interleave(q).to(device)
        self.stats = torch.zeros(2, dtype=torch.uint64, device=device)
        # Warm step: every row of a request selects the request's base top-k. Next step: each row replaces
        # its own `churn` share with rows of the context it did not select (so MTP rows differ a little).
        base = torch.stack([torch.randperm(case.context, generator=generator)[:k] for _ in range(r)])
        changed = int(k * case.churn)
        second = base.repeat_interleave(q, dim=0).clone()
        for row in range(r * q):
            unused = torch.ones(case.context, dtype=torch.bool)
            unused[second[row]] = False
            fresh = unused.nonzero().squeeze(1)
            second[row, :changed] = fresh[torch.randperm(fresh.numel(), generator=generator)[:changed]]
        self.warm_topk = base.repeat_interleave(q, dim=0).to(torch.int32).to(device)
        self.topk = second.to(torch.int32).to(device)
        n = r * q
        self.outputs = {
            name: torch.full((n, k), -1, dtype=torch.int32, device=device)
            for name in ("hot", "attention", "swap_host", "swap_device")
        }
        self.num_valid_rows = torch.tensor([n], dtype=torch.int32, device=device)
        self.valid = torch.zeros(n, dtype=torch.int32, device=device)
        self.swap_counts = torch.zeros(n, dtype=torch.int32, device=device)
        self.case = case
        self.saved: tuple[torch.Tensor, torch.Tensor] | None = None

    def resolve(self, ops: object, topk: torch.Tensor) -> None:
        """vLLM 0.34.0's call (``runtime.py:904-930``): 23 positional arguments, max_union_rows = Q x top-k."""
        out = self.outputs
        ops.resolve_residency(  # type: ignore[attr-defined]
            self.host, self.hot, self.hot_table, topk, out["hot"], self.dgi, self.lru, self.states,
            self.case.hot_slots, self.case.queries * self.case.top_k, self.stats, out["attention"], 2 * BLOCK,
            self.request_ids, self.source, BLOCK, self.valid, out["swap_host"], out["swap_device"],
            self.swap_counts, None, 0, self.num_valid_rows,
        )

    def compact(self, ops: object) -> None:
        out = self.outputs
        ops.gather_compact(self.host, self.hot, out["swap_host"], out["swap_device"], self.swap_counts)  # type: ignore[attr-defined]

    def release(self) -> None:
        if self.backend.device.type != "cpu":
            self.backend.unpin_tensor(self.pinned)

    def save(self) -> None:
        self.saved = (self.dgi.clone(), self.lru.clone())

    def restore(self) -> None:
        assert self.saved is not None
        self.dgi.copy_(self.saved[0])
        self.lru.copy_(self.saved[1])

    def result(self) -> tuple[torch.Tensor, ...]:
        return (self.outputs["hot"].clone(), self.dgi.clone(), self.lru.clone(), self.swap_counts.clone())


class _KernelCounter(TorchDispatchMode):
    """Counts the aten kernels dispatched inside it; view and metadata-only ops launch nothing, so they are
    not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.launches = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not func.is_view and func.overloadpacket not in _NO_KERNEL:
            self.launches += 1
        return func(*args, **(kwargs or {}))


_NO_KERNEL = {torch.ops.aten.detach, torch.ops.aten.lift_fresh, torch.ops.aten.empty, torch.ops.aten.empty_like,
              torch.ops.aten.sym_size, torch.ops.aten.sym_stride, torch.ops.aten.sym_numel}


@contextlib.contextmanager
def _counting_launches(name: str, ops: object) -> Iterator[Callable[[], int | None]]:
    """Yield a callable giving the kernel launches made inside the block.

    torch-based implementations: counted with a TorchDispatchMode. Triton: ``triton_impl.counting_launches()``
    (a counter of launches by kernel name). The oracle is Python loops: None.
    """
    if name in ("torch_impl", "host_impl"):
        counter = _KernelCounter()
        with counter:
            yield lambda: counter.launches
        return
    hook = getattr(ops, "counting_launches", None)
    if hook is None:
        yield lambda: None
        return
    with hook() as counted:
        yield lambda: sum(counted.values())


@contextlib.contextmanager
def _quiet_kineto() -> Iterator[None]:
    """Keep Kineto's start/stop markers ("USDT: ... profiler_start", printed at level 5 whatever level is asked
    for) out of the table: ``KINETO_LOG_LEVEL=6`` while the profiler starts (Kineto reads it then), a value the
    user set kept, and the caller's environment as it was afterwards (a library caller inherits nothing)."""
    if "KINETO_LOG_LEVEL" in os.environ:
        yield
        return
    os.environ["KINETO_LOG_LEVEL"] = "6"
    try:
        yield
    finally:
        os.environ.pop("KINETO_LOG_LEVEL", None)


def _peak_extra_bytes(
    fn: Callable[[], object], device: torch.device, synchronize: Callable[[], object] | None = None
) -> int:
    """The most bytes ``fn`` held allocated beyond what existed before it.

    On an accelerator: its caching allocator's peak statistics (``torch.accelerator`` memory functions, torch 2.9),
    read after ``synchronize`` (the backend's). On CPU: the running sum of the allocation events torch's profiler
    records with ``profile_memory=True`` (its memory view; each event carries the signed size of one allocation or
    free), so only torch's own allocations count, which is what the ops allocate.
    """
    if on_accelerator(device):
        wait = synchronize if synchronize is not None else functools.partial(torch.accelerator.synchronize, device)
        wait()
        before = torch.accelerator.memory_allocated(device)
        torch.accelerator.reset_peak_memory_stats(device)
        fn()
        wait()
        return int(torch.accelerator.max_memory_allocated(device) - before)
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with _quiet_kineto(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events: list[Any] = []
    pending = list(prof.profiler.kineto_results.experimental_event_tree())
    while pending:
        node = pending.pop()
        pending.extend(node.children)
        if node.tag == _EventType.Allocation and node.typed[1].device.type == "cpu":
            events.append(node)
    events.sort(key=lambda node: (node.start_time_ns, node.typed[1].id))
    held = peak = 0
    for node in events:
        held += node.typed[1].alloc_size
        peak = max(peak, held)
    return peak


def _implementation(name: str) -> object:
    return importlib.import_module(f"hisparse_hal.cache_ops.{name}")


def _median(fn: Callable[[], object], before: Callable[[], object], synchronize: Callable[[], object],
            repeats: int) -> float:
    return time_runs(fn, repeats, synchronize, warmup=0, before=before).median_s


def bench_case(
    case: CacheOpsCase, backend: HiSparseBackend, implementations: dict[str, int]
) -> list[CacheOpsFigure]:
    """Time each implementation (module name -> repeats) on one case, on ``backend``'s device; the torch
    implementation's result is the comparison point.

    Returns:
        One figure per implementation, in the order given.
    """
    step = _Step(case, backend)
    try:
        return _bench_step(step, backend, implementations)
    finally:
        step.release()


def _bench_step(step: _Step, backend: HiSparseBackend, implementations: dict[str, int]) -> list[CacheOpsFigure]:
    case, device, wait = step.case, backend.device, backend.synchronize
    torch_ops = _implementation("torch_impl")
    step.resolve(torch_ops, step.warm_topk)  # warm the state: every request's first top-k is resident
    step.save()
    step.resolve(torch_ops, step.topk)
    reference = step.result()
    rows = int(step.swap_counts.sum())
    src = torch.empty(rows * ROW_BYTES, dtype=torch.uint8, pin_memory=on_accelerator(device))
    dst = torch.empty(rows * ROW_BYTES, dtype=torch.uint8, device=device)
    one_copy = _median(lambda: dst.copy_(src, non_blocking=True), lambda: None, wait, 5)
    figures = []
    for name, repeats in implementations.items():
        ops = _implementation(name)
        step.restore()
        step.resolve(ops, step.topk)  # warm-up (compiles Triton kernels) and correctness check
        result = step.result()
        matches = all(torch.equal(a, b) for a, b in zip(result, reference, strict=True))
        resolve_s = _median(functools.partial(step.resolve, ops, step.topk), step.restore, wait, repeats)
        compact_s = _median(functools.partial(step.compact, ops), lambda: None, wait, repeats)
        resolve_peak = compact_peak = launches = None
        if name != "oracle":  # Python loops over lists: torch allocations say nothing about its cost
            step.restore()
            resolve_peak = _peak_extra_bytes(functools.partial(step.resolve, ops, step.topk), device, wait)
            compact_peak = _peak_extra_bytes(functools.partial(step.compact, ops), device, wait)
            step.restore()
            with _counting_launches(name, ops) as counted:
                step.resolve(ops, step.topk)
                step.compact(ops)
            launches = counted()
        figures.append(CacheOpsFigure(case, name, resolve_s, compact_s, repeats, rows, one_copy, matches,
                                      resolve_peak, compact_peak, launches))
    return figures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options ``hisparse-hal bench`` gains for the cache ops (:func:`.options.add_cache_ops_options`)."""
    add_cache_ops_options(parser)


def _mib(value: int | None) -> str:
    return f"{'-':>8}" if value is None else f"{value / 2**20:>8.1f}"


@dataclasses.dataclass(frozen=True)
class _TableRow:
    """One printed row: a figure and the oracle's and torch's figures of the same case, for the ratios."""

    figure: CacheOpsFigure
    oracle: CacheOpsFigure | None
    torch: CacheOpsFigure

    def versus_oracle(self) -> str:
        return f"{self.oracle.step_s / self.figure.step_s:.1f}x" if self.oracle else "-"


FIGURE_COLUMNS = (
    Column("req", 4, lambda r: r.figure.case.requests),
    Column("Q", 2, lambda r: r.figure.case.queries),
    Column("impl", 7, lambda r: r.figure.implementation.removesuffix("_impl")),
    Column("resolve ms", 11, lambda r: r.figure.resolve_s * 1e3, ".2f"),
    Column("compact ms", 11, lambda r: r.figure.compact_s * 1e3, ".2f"),
    Column("step ms", 9, lambda r: r.figure.step_s * 1e3, ".2f"),
    Column("x oracle", 9, lambda r: r.versus_oracle()),
    Column("x torch", 8, lambda r: f"{r.torch.step_s / r.figure.step_s:.2f}x"),
    Column("rows", 7, lambda r: r.figure.rows_copied),
    Column("MB", 7, lambda r: r.figure.bytes_copied / 1e6, ".2f"),
    Column("1 copy ms", 10, lambda r: r.figure.one_copy_s * 1e3, ".3f"),
    Column("compact/copy", 13, lambda r: f"{r.figure.compact_s / r.figure.one_copy_s:.1f}x"),
    Column("res MiB", 8, lambda r: _mib(r.figure.resolve_peak_bytes).strip()),
    Column("cmp MiB", 8, lambda r: _mib(r.figure.compact_peak_bytes).strip()),
    Column("launch", 7, lambda r: "-" if r.figure.launches is None else r.figure.launches),
    Column("same", 5, lambda r: "yes" if r.figure.matches_torch else "NO"),
)


def run(args: argparse.Namespace) -> int:
    """Run the cache-ops benchmark on the selected backend's device and print the table."""
    from hisparse_hal.cache_ops.selection import implementation_for, probe_triton
    from hisparse_hal.registry import get_backend

    backend = get_backend(args.backend)
    device = backend.device
    counts = sorted(positive_ints(args.requests, "--requests"))
    queries = sorted(positive_ints(getattr(args, "queries", "1"), "--queries"))
    chosen = implementation_for(device)
    choice, reason = chosen.implementation, chosen.reason
    interpreted = not on_accelerator(device)  # triton compiles for the accelerator, interprets elsewhere
    if interpreted:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are first defined
    triton = probe_triton()
    print(f"cache ops on {backend.name} ({device}), torch {torch.__version__}; capability picks {choice}: {reason}")
    print(f"rows {ROW_BYTES} B, top-k {TOP_K}, Q token rows per request, (Q + 1) x {TOP_K} hot slots per request, "
          f"context {args.context} tokens, 10% of each row's top-k new each step; resolve + gather_compact per "
          "step, median of repeats")
    print("peak MiB: extra memory one call held at most (CPU: torch profiler memory events; GPU: allocator "
          "peak); launches: kernels per step (torch: aten kernels dispatched; triton: its hook, '-' if absent)")
    if os.name == "posix":
        print("load average (1, 5, 15 min): " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    if triton.version is None:
        print(f"triton is not measured: it does not import ({triton.error})")
    elif interpreted:
        print(f"triton runs in its CPU interpreter (TRITON_INTERPRET=1), so only on the smallest case "
              f"({counts[0]} requests, Q = {queries[0]}) and once: its time says nothing about a GPU")
    print()
    print(format_header(FIGURE_COLUMNS))
    figures: list[CacheOpsFigure] = []
    cases = [(r, q) for r in counts for q in queries]
    done = 0
    try:
        for index, (requests, q) in enumerate(cases):
            plan: dict[str, int] = {}
            if not args.no_oracle:
                plan["oracle"] = 1
            plan["host_impl"] = args.repeats
            plan["torch_impl"] = args.repeats
            if triton.version is not None and (not interpreted or index == 0):
                plan["triton_impl"] = args.repeats if not interpreted else 1
            case = CacheOpsCase(requests, context=args.context, queries=q)
            rows = bench_case(case, backend, plan)
            figures.extend(rows)
            done += 1
            by_name = {f.implementation: f for f in rows}
            for f in rows:
                print(format_row(FIGURE_COLUMNS, _TableRow(f, by_name.get("oracle"), by_name["torch_impl"])),
                      flush=True)
    except KeyboardInterrupt as exc:
        raise _keep_measured(args.json, device, figures, f"interrupted ({str(exc) or 'SIGINT'}) after {done} of "
                             f"{len(cases)} cases", str(exc) or "SIGINT", done) from None
    if args.json:
        write_json(args.json, _document(device, figures))
    return 0 if all(f.matches_torch for f in figures) else 1


def _document(device: torch.device, figures: list[CacheOpsFigure], incomplete: str | None = None) -> dict[str, Any]:
    """The ``--json`` document; an interrupted run's says ``"incomplete": true`` and why."""
    payload = [dict(dataclasses.asdict(f), step_s=f.step_s, bytes_copied=f.bytes_copied) for f in figures]
    load = list(os.getloadavg()) if os.name == "posix" else None
    doc: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "load_average": load,
                           "figures": payload}
    if incomplete is not None:
        doc.update(incomplete=True, incomplete_reason=incomplete)
    return doc


def _keep_measured(json_path: str | None, device: torch.device, figures: list[CacheOpsFigure], why: str,
                   how: str, done: int) -> InterruptedWithFigures:
    """Write the cases measured before an interrupt to ``--json`` (marked incomplete); the interrupt to raise."""
    if not figures:
        return InterruptedWithFigures(how, "no case had finished; no --json file was written")
    if json_path is None:
        return InterruptedWithFigures(how, f"the {done} case(s) measured so far are printed above (no --json asked)")
    write_json(json_path, _document(device, figures, incomplete=why))
    return InterruptedWithFigures(how, f"the {done} case(s) measured so far are in {json_path}, marked incomplete")
