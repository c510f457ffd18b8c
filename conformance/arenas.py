"""Byte ranges guarded by canaries, on the backend's device or pinned in host memory, for the suite.

Invariant: every range a test hands to a backend sits between two canary bands of a known pattern in
the same allocation; a test reads the range back only after synchronizing the device, and checks that
the canaries are intact, so a copy that runs even one byte long or short is caught.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterator, Sequence

import torch

from hisparse_hal.backend import HiSparseBackend
from hisparse_hal.kv_cache import KV_FORMAT_SPECS, KVCacheConfig, LayerSpec
from hisparse_hal.regions import Region

__all__ = [
    "CANARY_BYTES",
    "GuardedBytes",
    "synchronize",
    "random_bytes",
    "allocate_guarded",
    "pinned_host_pool",
    "device_caches",
    "cache_format_for_arenas",
    "park_cache_regions",
    "first_difference",
    "describe_mismatch",
]

CANARY_BYTES = 256
PAGE_BYTES = mmap.PAGESIZE


def synchronize(device: torch.device) -> None:
    """Block until all work queued on ``device`` has finished (nothing to do for host memory)."""
    if device.type == "cpu":
        return
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and accelerator.is_available():
        accelerator.synchronize(device)
    else:
        getattr(torch, device.type).synchronize(device)


def random_bytes(count: int, seed: int) -> torch.Tensor:
    """``count`` reproducible random bytes on the CPU."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (count,), dtype=torch.uint8, generator=generator)


def _canary(count: int, salt: int) -> torch.Tensor:
    return ((torch.arange(count, dtype=torch.int64) * 151 + 89 + salt) % 251 + 3).to(torch.uint8)


class GuardedBytes:
    """``size`` bytes of a larger 1-D uint8 allocation, with canary bands before and after."""

    def __init__(self, storage: torch.Tensor, start: int, size: int, label: str) -> None:
        self.storage = storage
        self.start = start
        self.size = size
        self.label = label
        self.inner = storage[start : start + size]
        #: The swap region a test registered over these bytes with ``register_region``, until it unregisters it.
        self.region: Region | None = None
        self._front = _canary(start, 1)
        self._back = _canary(storage.numel() - start - size, 2)
        storage[:start].copy_(self._front)
        storage[start + size :].copy_(self._back)

    @property
    def device(self) -> torch.device:
        """Where the bytes live."""
        return self.storage.device

    @property
    def address(self) -> int:
        """Address of the first guarded byte."""
        return self.inner.data_ptr()

    def fill(self, data: torch.Tensor) -> None:
        """Overwrite the guarded bytes with ``data`` (CPU uint8, ``size`` bytes) and wait for it."""
        self.inner.copy_(data)
        synchronize(self.device)

    def read(self) -> torch.Tensor:
        """A CPU copy of the guarded bytes, after synchronizing the device."""
        synchronize(self.device)
        return self.inner.to("cpu", copy=True)

    def assert_canaries_intact(self) -> None:
        """Fail naming the first overwritten canary byte, if any."""
        synchronize(self.device)
        front = self.storage[: self.start].to("cpu")
        back = self.storage[self.start + self.size :].to("cpu")
        for band, want, where in ((front, self._front, "before"), (back, self._back, "after")):
            diff = first_difference(band, want)
            if diff is not None:
                offset = diff - band.numel() if where == "before" else diff
                raise AssertionError(
                    f"{self.label}: canary byte {where} the range was overwritten at offset {offset} "
                    f"relative to the range's {'start' if where == 'before' else 'end'} "
                    f"({int((band != want).sum())} canary bytes changed): a copy ran outside its descriptor"
                )


def first_difference(actual: torch.Tensor, expected: torch.Tensor) -> int | None:
    """Index of the first differing element of two equal-length 1-D tensors, or None."""
    if actual.shape != expected.shape:
        raise AssertionError(f"length differs: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    diff = (actual != expected).nonzero()
    return int(diff[0]) if diff.numel() else None


def allocate_guarded(
    size: int, device: torch.device, label: str, *, align: int = 1, pad: int = CANARY_BYTES
) -> GuardedBytes:
    """A new guarded range of ``size`` bytes on ``device`` whose first byte is ``align``-aligned."""
    storage = torch.empty(pad + size + pad + align, dtype=torch.uint8, device=device)
    start = pad + (-(storage.data_ptr() + pad)) % align
    return GuardedBytes(storage, start, size, label)


@contextlib.contextmanager
def pinned_host_pool(
    backend: HiSparseBackend, size: int, *, block_bytes: int | None = None, label: str = "host pool"
) -> Iterator[GuardedBytes]:
    """A page-aligned host range pinned with ``backend.pin_tensor`` (as ``[n, block_bytes]`` when given).

    Unpins on exit and checks the canaries.
    """
    arena = allocate_guarded(size, torch.device("cpu"), label, align=PAGE_BYTES)
    tensor = arena.inner if block_bytes is None else arena.inner.view(-1, block_bytes)
    backend.pin_tensor(tensor)
    arena.pinned = tensor  # type: ignore[attr-defined]
    try:
        yield arena
    finally:
        backend.unpin_tensor(tensor)
    arena.assert_canaries_intact()


def cache_format_for_arenas(backend: HiSparseBackend) -> str | None:
    """The supported KV format with the finest row granularity, or None when the backend declares none."""
    supported = backend.capabilities.kv_formats
    for name in ("fp8_e4m3fn", "fp8_e4m3fnuz", "bf16", "fp8_ds_mla"):
        if name in supported:
            return name
    return None


def _row_bytes(fmt: str) -> int:
    spec = KV_FORMAT_SPECS[fmt]
    return spec.fixed_row_bytes or 64


def _row_width(fmt: str) -> int:
    spec = KV_FORMAT_SPECS[fmt]
    return _row_bytes(fmt) // torch.empty((), dtype=spec.dtype).element_size()


_parking: dict[int, tuple[HiSparseBackend, KVCacheConfig, torch.Tensor]] = {}
_active_caches: set[int] = set()


def park_cache_regions(backend: HiSparseBackend) -> None:
    """Replace the backend's cache regions by one small cache that lives as long as the process, so a
    range freed by a finished test is never left registered."""
    fmt = cache_format_for_arenas(backend)
    if fmt is None:
        return
    entry = _parking.get(id(backend))
    if entry is None or entry[0] is not backend:
        row = _row_bytes(fmt)
        config = KVCacheConfig(fmt, 1, 1, _row_width(fmt), (LayerSpec("conformance.parking", 0),))
        entry = (backend, config, torch.zeros(row, dtype=torch.uint8, device=backend.device))
        _parking[id(backend)] = entry
    _, config, tensor = entry
    backend.prepare_kv_cache_views(config, {"conformance.parking": tensor}, {})


@contextlib.contextmanager
def device_caches(
    backend: HiSparseBackend, count: int, size: int, label: str = "device cache"
) -> Iterator[list[GuardedBytes]]:
    """``count`` guarded ranges of at least ``size`` bytes on ``backend.device``, made swap regions the
    way an engine does it: as layers handed to ``prepare_kv_cache_views`` (or, for a backend that
    declares no KV format, through ``register_region``). Released on exit; canaries checked."""
    if id(backend) in _active_caches:
        raise RuntimeError(
            "suite bug: device_caches() entered while another set is active; prepare_kv_cache_views "
            "replaces a backend's cache regions, so ask for every cache at once (count=...)"
        )
    fmt = cache_format_for_arenas(backend)
    row = _row_bytes(fmt) if fmt else 1
    size = max(row, -(-size // row) * row)
    pad = -(-CANARY_BYTES // row) * row
    arenas = [allocate_guarded(size, backend.device, f"{label} {i}", pad=pad) for i in range(count)]
    explicit = []
    if fmt is None:
        explicit = [backend.register_region(a.address, a.size, a.label, device=backend.device) for a in arenas]
    else:
        layers = tuple(LayerSpec(f"conformance.{i}", a.start) for i, a in enumerate(arenas))
        config = KVCacheConfig(fmt, size // row, 1, _row_width(fmt), layers)
        kv_caches = {f"conformance.{i}": a.storage for i, a in enumerate(arenas)}
        backend.prepare_kv_cache_views(config, kv_caches, {})
    _active_caches.add(id(backend))
    try:
        yield arenas
    finally:
        _active_caches.discard(id(backend))
        for region in explicit:
            backend.unregister_region(region)
        if fmt is not None:
            park_cache_regions(backend)
    for arena in arenas:
        arena.assert_canaries_intact()


def describe_mismatch(
    actual: torch.Tensor, expected: torch.Tensor, what: str, ranges: Sequence[tuple[int, int, int]] = ()
) -> str:
    """A message naming the first differing byte, how many differ, and the descriptor covering it.

    ``ranges`` holds ``(descriptor index, offset, size)`` of the copies that wrote into this range.
    """
    first = first_difference(actual, expected)
    if first is None:
        return f"{what}: equal"
    count = int((actual != expected).sum())
    owner = next(
        (f"descriptor {i} (bytes [{o}, {o + s}))" for i, o, s in ranges if o <= first < o + s), "no descriptor"
    )
    return (
        f"{what}: {count} of {actual.numel()} bytes differ; first at offset {first} "
        f"(got {int(actual[first])}, expected {int(expected[first])}), inside {owner}"
    )
