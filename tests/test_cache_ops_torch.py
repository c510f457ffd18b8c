"""The vectorized torch cache ops: worked examples, differential runs against the oracle, no host sync."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from hisparse_hal.cache_ops import torch_impl

I32 = torch.int32
POISON = -999


# --------------------------------------------------------------------------------------------------------------
# Worked examples of docs/design/cache-ops.md (research §2.7 and §2.8), with the expected values written out.
# --------------------------------------------------------------------------------------------------------------


class _Step:
    """Poisoned outputs of one resolve call over ``rows`` batch rows of top-k ``top_k``."""

    def __init__(self, rows: int, top_k: int) -> None:
        self.hot = torch.full((rows, top_k), POISON, dtype=I32)
        self.attention = self.hot.clone()
        self.miss_mask = self.hot.clone()
        self.resolved = self.hot.clone()
        self.swap_host = self.hot.clone()
        self.swap_device = self.hot.clone()
        self.valid_counts = torch.full((rows,), POISON, dtype=I32)
        self.swap_counts = self.valid_counts.clone()


class _ExampleA:
    """Two single-row requests A (batch row 0, state 2) and B (batch row 1, state 3); B=4, K=3, H=6."""

    block, top_k, hot_size = 4, 3, 6

    def __init__(self) -> None:
        self.host = torch.zeros(64, 16, dtype=torch.uint8)
        self.hot_cache = torch.zeros(40, self.block, 16, dtype=torch.uint8)
        self.hot_block_table = torch.tensor([[20, 21], [30, 31]], dtype=I32)
        self.source = torch.tensor([[5, 9, 3], [7, 2, 11]], dtype=I32)
        self.resident = torch.zeros(4, 3, dtype=I32)
        self.resident[0, 2] = 10  # A's page 2 lives in GPU block 10 (row 0 = batch row, row 2 = state row)
        self.resident[2, 2] = 10
        self.state_of_request = torch.tensor([2, 3, -1, -1], dtype=I32)
        self.dgi = torch.full((4, self.hot_size), -1, dtype=I32)
        self.lru = torch.arange(self.hot_size, dtype=torch.int16).repeat(4, 1)
        self.stats = torch.zeros(2, dtype=torch.uint64)
        self.flags = torch.zeros(1, dtype=I32)

    def step(self, topk: list[list[int]]) -> _Step:
        out = _Step(2, self.top_k)
        torch_impl.resolve_residency(
            self.host, self.hot_cache, self.hot_block_table, torch.tensor(topk, dtype=I32), out.hot, self.dgi,
            self.lru, self.state_of_request, self.hot_size, 3, out.miss_mask, self.stats, out.attention, 4,
            torch.tensor([0, 1], dtype=I32), self.source, self.block, out.resolved, out.valid_counts,
            out.swap_host, out.swap_device, out.swap_counts, self.resident, self.block, 0, error_flags=self.flags,
        )
        return out


def _stats(stats: torch.Tensor) -> list[int]:
    return stats.view(torch.int64).tolist()


def test_resolve_example_a_step_one_loads_misses_into_oldest_slots_and_serves_resident_page() -> None:
    example = _ExampleA()
    out = example.step([[1, 6, 9], [0, 5, -1]])
    assert out.hot.tolist() == [[80, 81, 41], [120, 121, -1]]
    assert out.attention.tolist() == [[80, 81, 41], [120, 121, -1]]
    assert out.resolved.tolist() == [[21, 38, 13], [28, 9, -1]]
    assert out.valid_counts.tolist() == [3, 2]
    assert out.miss_mask.tolist() == [[1, 1, 0], [1, 1, 0]]
    assert out.swap_counts.tolist() == [2, 2]
    assert out.swap_host[:, :2].tolist() == [[21, 38], [28, 9]]
    assert out.swap_device[:, :2].tolist() == [[80, 81], [120, 121]]
    assert out.swap_host[:, 2].tolist() == [POISON, POISON], "entries past the count must stay untouched"
    assert example.dgi[2:].tolist() == [[21, 38, -1, -1, -1, -1], [28, 9, -1, -1, -1, -1]]
    assert example.lru[2:].tolist() == [[2, 3, 4, 5, 0, 1], [2, 3, 4, 5, 0, 1]]
    assert example.dgi[:2].tolist() == [[-1] * 6] * 2, "state rows 0 and 1 belong to nobody this step"
    assert _stats(example.stats) == [0, 4]
    assert example.flags.tolist() == [0]


def test_resolve_example_a_three_steps_keep_hits_and_rotate_lru() -> None:
    example = _ExampleA()
    example.step([[1, 6, 9], [0, 5, -1]])
    second = example.step([[6, 2, 1], [5, 4, 0]])
    assert second.hot.tolist() == [[81, 82, 80], [121, 122, 120]]
    assert second.swap_counts.tolist() == [1, 1]
    assert second.swap_host[:, 0].tolist() == [22, 8]
    assert second.swap_device[:, 0].tolist() == [82, 122]
    assert example.lru[2:].tolist() == [[3, 4, 5, 2, 0, 1], [3, 4, 5, 2, 0, 1]]
    assert _stats(example.stats) == [4, 6]
    third = example.step([[3, 0, 7], [8, 9, 5]])
    assert third.hot.tolist() == [[83, 84, 85], [123, 124, 121]]
    assert third.swap_counts.tolist() == [3, 2]
    assert example.dgi[2:].tolist() == [[21, 38, 22, 23, 20, 39], [28, 9, 8, 44, 45, -1]]
    assert example.lru[2:].tolist() == [[2, 0, 1, 3, 4, 5], [5, 2, 0, 3, 4, 1]]
    assert _stats(example.stats) == [5, 11]


def _example_b_step(state: dict[str, torch.Tensor], topk: list[list[int]]) -> _Step:
    out = _Step(3, 3)
    torch_impl.resolve_residency(
        state["host"], state["hot"], torch.tensor([[6, 7, 8]], dtype=I32), torch.tensor(topk, dtype=I32), out.hot,
        state["dgi"], state["lru"], torch.tensor([1], dtype=I32), 9, 6, out.miss_mask, state["stats"], None, 0,
        torch.tensor([0, 0, -1], dtype=I32), torch.tensor([[1, 2, 3, 4]], dtype=I32), 4, None, None, out.swap_host,
        out.swap_device, out.swap_counts, None, 0, 0,
    )
    return out


def test_resolve_example_b_mtp_rows_share_one_union_and_spill_swaps_into_later_rows() -> None:
    state = {
        "host": torch.zeros(64, 16, dtype=torch.uint8),
        "hot": torch.zeros(16, 4, 16, dtype=torch.uint8),
        "dgi": torch.full((2, 9), -1, dtype=I32),
        "lru": torch.arange(9, dtype=torch.int16).repeat(2, 1),
        "stats": torch.zeros(2, dtype=torch.uint64),
    }
    first = _example_b_step(state, [[2, 3, 4], [3, 5, 6], [7, 7, 7]])
    assert first.hot.tolist() == [[24, 25, 26], [25, 27, 28], [-1, -1, -1]]
    assert first.miss_mask.tolist() == [[1, 1, 1], [0, 1, 1], [POISON] * 3], "padding rows keep miss_mask"
    assert first.swap_host[:2].tolist() == [[6, 7, 8], [9, 10, POISON]]
    assert first.swap_device[:2].tolist() == [[24, 25, 26], [27, 28, POISON]]
    assert first.swap_counts.tolist() == [3, 2, 0]
    assert state["lru"][1].tolist() == [5, 6, 7, 8, 0, 1, 2, 3, 4]
    assert _stats(state["stats"]) == [1, 5]
    second = _example_b_step(state, [[3, 8, 2], [5, 9, -1], [7, 7, 7]])
    assert second.hot.tolist() == [[25, 29, 24], [27, 30, -1], [-1, -1, -1]]
    assert second.swap_counts.tolist() == [2, 0, 0]
    assert second.swap_host[0, :2].tolist() == [12, 13]
    assert second.swap_device[0, :2].tolist() == [29, 30]
    assert state["lru"][1].tolist() == [7, 8, 2, 4, 5, 6, 0, 1, 3]
    assert state["dgi"][0].tolist() == [-1] * 9
    assert _stats(state["stats"]) == [4, 7]


# --------------------------------------------------------------------------------------------------------------
# No host synchronisation: what a CUDA/HIP graph capture needs, checked on the CPU.
# --------------------------------------------------------------------------------------------------------------


class HostSyncError(AssertionError):
    """An op read a device value on the host, which a graph capture cannot do."""


_SYNCING_ATEN_OPS = frozenset({
    "aten._local_scalar_dense", "aten.item", "aten.is_nonzero", "aten.equal", "aten.allclose",
    "aten.nonzero", "aten.nonzero_numpy", "aten.argwhere", "aten.masked_select", "aten.masked_scatter",
    "aten.unique", "aten._unique", "aten._unique2", "aten.unique_dim", "aten.unique_consecutive",
    "aten.unique_dim_consecutive", "aten.bincount", "aten.histc",
})
_SYNCING_TENSOR_METHODS = frozenset({
    "item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "__complex__",
})
_INDEXING_OPS = frozenset({"aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"})


class _NoHostSync(TorchDispatchMode):
    """Fails on every aten op that reads a tensor value back to the host (or has a data-dependent shape).

    Boolean-mask indexing is caught by its index dtype: its kernel calls ``nonzero`` below the Python key.
    """

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func.overloadpacket)
        if name in _SYNCING_ATEN_OPS:
            raise HostSyncError(f"{func} reads device values on the host")
        if name in _INDEXING_OPS:
            indices = args[1] if len(args) > 1 else ()
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
                raise HostSyncError(f"{func} with a boolean mask has a data-dependent shape")
        return func(*args, **(kwargs or {}))


class _NoHostReadback(TorchFunctionMode):
    """Fails on Tensor methods that hand a value to Python (``.tolist()`` never reaches the dispatcher)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if getattr(func, "__name__", "") in _SYNCING_TENSOR_METHODS:
            raise HostSyncError(f"Tensor.{func.__name__} reads a device value on the host")
        return func(*args, **(kwargs or {}))


class no_host_sync:
    """Context manager: any host read of a tensor value inside raises :class:`HostSyncError`."""

    def __enter__(self) -> None:
        self._modes = (_NoHostReadback(), _NoHostSync())
        for mode in self._modes:
            mode.__enter__()

    def __exit__(self, *exc: Any) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


_mask = torch.tensor([True, False, True])
_values = torch.tensor([3, 1, 2])


@pytest.mark.parametrize(
    ("pattern", "call"),
    [
        ("item", lambda: _values[0].item()),
        ("tolist", lambda: _values.tolist()),
        ("branch on a value", lambda: bool(_values.any())),
        ("int of a value", lambda: int(_values.sum())),
        ("nonzero", lambda: _values.nonzero()),
        ("single-argument where", lambda: torch.where(_mask)),
        ("unique", lambda: torch.unique(_values)),
        ("boolean-mask indexing", lambda: _values[_mask]),
        ("boolean-mask assignment", lambda: _values.clone().__setitem__(_mask, 0)),
        ("masked_select", lambda: torch.masked_select(_values, _mask)),
    ],
)
def test_no_host_sync_guard_catches_each_syncing_pattern(pattern: str, call: Any) -> None:
    with pytest.raises(HostSyncError, match="host|data-dependent"):
        with no_host_sync():
            call()


def test_no_host_sync_guard_lets_fixed_shape_ops_through() -> None:
    with no_host_sync():
        out = torch.where(_mask, _values, -1).cumsum(0)
    assert out.tolist() == [3, 2, 4]


def test_torch_ops_read_no_device_value_on_the_host_over_three_steps() -> None:
    example = _ExampleA()
    rows = [[[1, 6, 9], [0, 5, -1]], [[6, 2, 1], [5, 4, 0]], [[3, 0, 7], [8, 9, 5]]]
    with no_host_sync():
        for topk in rows:
            out = example.step(topk)
            torch_impl.gather_compact(example.host, example.hot_cache, out.swap_host, out.swap_device,
                                      out.swap_counts)
            torch_impl.gather_plan(example.host, example.hot_cache, out.resolved, out.hot, out.miss_mask,
                                   example.state_of_request, out.attention, 4)
        torch_impl.invalidate_written_slots(example.dgi, example.state_of_request, torch.tensor([0, 1], dtype=I32),
                                            torch.tensor([21, 9]))
    assert example.dgi[2:].tolist() == [[-1, 38, 22, 23, 20, 39], [28, -1, 8, 44, 45, -1]]
