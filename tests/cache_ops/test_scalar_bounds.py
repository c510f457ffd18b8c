"""Every integer scalar of the four cache ops against the bound its arithmetic can hold (issue 30 item 2).

For each scalar: the boundary value is accepted (outputs and state equal the oracle's), one past it is refused
with ``ScalarRangeError`` naming the argument, the value and the bound, and every tensor is left as it was.
Bools, floats, NaN, ``None`` and strings are refused as non-ints; ``-1`` and ``2**63`` everywhere.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from hisparse_hal.cache_ops import arguments, host_impl, oracle, tables, torch_impl
from hisparse_hal.cache_ops.arguments import INT32_MAX, INT64_MAX, attention_stride_bound
from hisparse_hal.errors import InvalidArgumentError, ScalarRangeError, UnknownTableError
from tests.cache_ops.model import I32, Model
from tests.cache_ops.poisoned_outputs import ResolveOutputs

#: Positions of the resolve scalars in vLLM 0.34.0's 23 positional arguments.
REGION_STRIDE, MAX_UNION_ROWS, ATTENTION_BLOCK_STRIDE, SOURCE_BLOCK_SIZE, RESIDENT_BLOCK_SIZE = 8, 9, 12, 15, 21
SCALARS = {REGION_STRIDE: "region_stride", MAX_UNION_ROWS: "max_union_rows",
           ATTENTION_BLOCK_STRIDE: "attention_block_stride", SOURCE_BLOCK_SIZE: "source_block_size",
           RESIDENT_BLOCK_SIZE: "resident_block_size"}
#: decode_world's hot cache: 64 blocks of 4 rows (tests/cache_ops/model.py).
HOT_BLOCKS, BLOCK = 64, 4
ATTENTION_MAX = attention_stride_bound(HOT_BLOCKS, BLOCK)


@pytest.fixture(params=[torch_impl, host_impl], ids=["torch", "host"])
def ops(request: pytest.FixtureRequest) -> Any:
    return request.param


def _world(resident: bool = False, source: list | None = None) -> Model:
    """One request on state row 1 of 2; hot blocks 1, 2; source pages -> host blocks (block 0 is null)."""
    return Model(block=BLOCK, top_k=4, hot_size=8, union=4, states=2, hot_table=[[1, 2]],
                 source=source or [[0, 2, 3, 5]], request_state_indices=[1],
                 resident=[[0, 0], [0, 3]] if resident else None)


def _snapshot(world: Model, out: ResolveOutputs) -> dict[str, Any]:
    """Everything a resolve call may write, plus the inputs it must not."""
    dgi, lru, stats = world.state()
    return {**out.snapshot(), "dgi": dgi, "lru": lru, "stats": stats, "hot_cache": world.hot_cache.tolist(),
            "host": world.host.tolist(), "hot_table": world.hot_table.tolist(), "source": world.source.tolist()}


def _call(ops: Any, position: int, value: object, *, resident: bool = False, topk: list | None = None,
          source: list | None = None, drop: tuple[int, ...] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run one resolve step with argument ``position`` set to ``value``; the state before and after."""
    world = _world(resident, source)
    rows = topk if topk is not None else [[4, 5, 9, -1]]
    out = ResolveOutputs(len(rows), len(rows[0]))
    args = list(world.args(rows, [0] * len(rows), out, num_valid_rows=len(rows)))
    for index in drop:
        args[index] = None
    args[position] = value
    before = _snapshot(world, out)
    ops.resolve_residency(*args)
    return before, _snapshot(world, out)


_LAST: dict[str, Any] = {}


def _try(ops: Any, position: int, value: object, **kwargs: Any) -> dict[str, Any]:
    """Like :func:`_call`, keeping the state before and after in ``_LAST`` even when the call raises."""
    world = _world(kwargs.pop("resident", False), kwargs.pop("source", None))
    rows = kwargs.pop("topk", None) or [[4, 5, 9, -1]]
    out = ResolveOutputs(len(rows), len(rows[0]))
    args = list(world.args(rows, [0] * len(rows), out, num_valid_rows=len(rows)))
    for index in kwargs.pop("drop", ()):
        args[index] = None
    args[position] = value
    _LAST.clear()
    _LAST["before"] = _snapshot(world, out)
    _LAST["world"], _LAST["out"] = world, out
    try:
        ops.resolve_residency(*args)
    finally:
        _LAST["after"] = _snapshot(world, out)
    return _LAST["before"]


def assert_refused(ops: Any, position: int, value: int, low: int, high: int, **kwargs: Any) -> None:
    """The call raises ScalarRangeError naming argument, value and bounds, and writes nothing."""
    name = SCALARS[position]
    with pytest.raises(ScalarRangeError, match=rf"^{name} is {value}; expected an int in \[{low}, {high}\]") as info:
        _try(ops, position, value, **kwargs)
    assert (info.value.argument, info.value.value, info.value.low, info.value.high) == (name, value, low, high)
    assert _LAST["after"] == _LAST["before"], f"{name} = {value} was refused but something was written"


def assert_accepted(ops: Any, position: int, value: int, **kwargs: Any) -> dict[str, Any]:
    """The call runs and leaves what the oracle leaves; returns the state after."""
    before, after = _call(ops, position, value, **kwargs)
    want_before, want = _call(oracle, position, value, **kwargs)
    assert before == want_before and after == want, f"{SCALARS[position]} = {value}: differs from the oracle"
    return after


# (position, low, high, what the call needs): the bounds of each scalar where the call uses it.
USED = [
    pytest.param(REGION_STRIDE, 8, 8, {}, id="region_stride"),
    pytest.param(MAX_UNION_ROWS, 1, 8, {"topk": [[4, 4, 0, -1]]}, id="max_union_rows"),  # one host row
    pytest.param(ATTENTION_BLOCK_STRIDE, BLOCK, ATTENTION_MAX, {}, id="attention_block_stride"),
    pytest.param(SOURCE_BLOCK_SIZE, 1, INT32_MAX, {}, id="source_block_size"),
    pytest.param(RESIDENT_BLOCK_SIZE, BLOCK, BLOCK, {"resident": True}, id="resident_block_size"),
]


@pytest.mark.parametrize(("position", "low", "high", "needs"), USED)
def test_a_used_scalar_is_accepted_at_its_bounds_and_refused_one_past_them(ops: Any, position: int, low: int,
                                                                            high: int, needs: dict) -> None:
    for value in (low, high):
        assert_accepted(ops, position, value, **needs)
    for value in (low - 1, high + 1):
        assert_refused(ops, position, value, low, high, **needs)


# Scalars the call does not use still cross the op boundary as int64 sizes or strides: [0, 2**63 - 1].
UNUSED = [
    pytest.param(ATTENTION_BLOCK_STRIDE, {"drop": (11,)}, id="attention_block_stride-without-attention_indices"),
    pytest.param(SOURCE_BLOCK_SIZE, {"drop": (13, 14, 22)}, id="source_block_size-without-source_block_table"),
    pytest.param(RESIDENT_BLOCK_SIZE, {}, id="resident_block_size-without-resident_block_table"),
    pytest.param(MAX_UNION_ROWS, {"topk": [[]]}, id="max_union_rows-of-an-empty-batch"),
]


@pytest.mark.parametrize(("position", "needs"), UNUSED)
def test_an_unused_scalar_is_an_int64_size(ops: Any, position: int, needs: dict) -> None:
    if needs.get("topk") == [[]]:  # an empty batch: the op writes nothing at all, whatever the scalar
        for value in (0, INT64_MAX):
            before, after = _call(ops, position, value, **needs)
            assert after == before
    else:
        for value in (0, INT64_MAX):
            assert_accepted(ops, position, value, **needs)
    for value in (-1, INT64_MAX + 1, 1 << 64):
        assert_refused(ops, position, value, 0, INT64_MAX, **needs)


@pytest.mark.parametrize("position", list(SCALARS))
@pytest.mark.parametrize("value", [True, False, 4.0, math.nan, math.inf, None, "4", torch.tensor(4)],
                         ids=["True", "False", "4.0", "nan", "inf", "None", "str", "tensor"])
def test_a_scalar_that_is_not_an_int_is_refused_naming_its_type(ops: Any, position: int, value: object) -> None:
    name = SCALARS[position]
    with pytest.raises(InvalidArgumentError, match=rf"^{name} is {type(value).__name__} .*expected a Python int"):
        _try(ops, position, value, resident=True)
    assert _LAST["after"] == _LAST["before"]


def test_source_block_size_2_to_the_32_is_refused_before_anything_is_written(ops: Any) -> None:
    """The reproducer: 2**32 (and larger) crossed the int32 kernel arithmetic unchecked."""
    for value in (1 << 32, (1 << 32) + 4):
        assert_refused(ops, SOURCE_BLOCK_SIZE, value, 1, INT32_MAX)


def test_a_source_block_size_that_wrapped_int64_planned_a_host_row_the_oracle_does_not(ops: Any) -> None:
    """Host block 2**30 times 2**40 is 2**70, which int64 wraps to 0: torch and host planned rows 4, 5, 9 (swap
    counts ``[3]``) where the oracle, in Python ints, plans none. Now refused, with nothing written."""
    source = [[1 << 30, 3, 5, 6]]
    assert_refused(ops, SOURCE_BLOCK_SIZE, 1 << 40, 1, INT32_MAX, source=source)
    assert _LAST["out"].swap_counts.tolist() == [ResolveOutputs(1, 4).swap_counts.item()]
    # At the bound the same table plans nothing either: 2**30 * (2**31 - 1) is past every host row.
    after = assert_accepted(ops, SOURCE_BLOCK_SIZE, INT32_MAX, source=source)
    assert after["swap_counts"] == [0] and after["hot"] == [[-1, -1, -1, -1]]


def test_attention_block_stride_at_its_bound_gives_attention_indices_that_fit_int32() -> None:
    """The last hot block's last row at the bound is the largest int32 index or just under it."""
    def largest(stride: int) -> int:
        return (HOT_BLOCKS - 1) * stride + BLOCK - 1

    assert largest(ATTENTION_MAX) <= INT32_MAX < largest(ATTENTION_MAX + 1)
    assert attention_stride_bound(1, BLOCK) == INT64_MAX  # one block: the stride never multiplies
    for blocks, block in ((2, 1), (1 << 16, 1 << 14), ((1 << 31) - 1, 1)):  # hot_rows < 2**31 always fits
        assert attention_stride_bound(blocks, block) >= block


def test_the_worked_example_at_the_attention_bound_writes_the_oracle_indices(ops: Any) -> None:
    after = assert_accepted(ops, ATTENTION_BLOCK_STRIDE, ATTENTION_MAX)
    hot = after["hot"][0]
    assert after["attention"] == [[-1 if x < 0 else x // BLOCK * ATTENTION_MAX + x % BLOCK for x in hot]]
    assert any(x >= BLOCK for x in hot)  # a row past block 0, so the stride multiplied something


TABLE = torch.tensor([[5, 6]], dtype=I32)


def _invalidate(ops: Any, num_state_rows: object, region_stride: object) -> tuple[list, list]:
    """Invalidate host row 5 for one token of request 0 (state row 0) in a fresh registered ``[1, 2]`` table,
    kept in ``_LAST["table"]`` so a refused call's table can be checked."""
    table = _LAST["table"] = TABLE.clone()
    tables.register_table(table)
    before = table.tolist()
    pointers = torch.tensor([table.data_ptr()], dtype=torch.int64)
    ops.invalidate_written_slots(pointers, torch.tensor([0], dtype=I32), torch.zeros(1, dtype=I32),
                                 torch.full((1,), 5, dtype=torch.int64), num_state_rows, region_stride)
    return before, table.tolist()


@pytest.mark.parametrize(("name", "position", "high"), [
    ("num_state_rows", 0, INT64_MAX), ("region_stride", 1, arguments.MAX_HOT_SLOTS),
])
def test_invalidate_scalars_are_bounded(ops: Any, name: str, position: int, high: int) -> None:
    scalars: list[object] = [1, 2]
    for value in (0, high):  # past the bound check: the table lookup finds no table of that shape
        scalars[position] = value
        shape = rf"\[{scalars[0]}, {scalars[1]}\]"
        with pytest.raises(UnknownTableError, match=rf"is no registered {shape} int32"):
            _invalidate(ops, *scalars)
    for value in (-1, high + 1, 1 << 64):
        scalars[position] = value
        with pytest.raises(ScalarRangeError, match=rf"^{name} is {value}; expected an int in \[0, {high}\]"):
            _invalidate(ops, *scalars)
        assert _LAST["table"].tolist() == TABLE.tolist()
    for wrong in (True, 2.0, None):
        scalars[position] = wrong
        with pytest.raises(InvalidArgumentError, match=rf"^{name} is {type(wrong).__name__} .*expected a Python int"):
            _invalidate(ops, *scalars)
        assert _LAST["table"].tolist() == TABLE.tolist()


def test_invalidate_at_the_real_shape_still_writes(ops: Any) -> None:
    """The bounds do not get in the way of the ordinary call: the named entry is invalidated."""
    before, after = _invalidate(ops, 1, 2)
    assert before == [[5, 6]] and after == [[-1, 6]]


def test_the_triton_implementation_refuses_through_the_same_check() -> None:
    """Refused before any launch, so this runs without the interpreter's kernels ever starting."""
    pytest.importorskip("triton", reason="triton is not installed")
    from hisparse_hal.cache_ops import triton_impl

    for position, value, low, high in ((SOURCE_BLOCK_SIZE, 1 << 32, 1, INT32_MAX),
                                       (ATTENTION_BLOCK_STRIDE, ATTENTION_MAX + 1, BLOCK, ATTENTION_MAX),
                                       (MAX_UNION_ROWS, 9, 1, 8)):
        assert_refused(triton_impl, position, value, low, high)


def test_a_hot_cache_of_int32_max_rows_is_refused_as_vllm_does(ops: Any) -> None:
    """vLLM checks ``hot_rows < INT32_MAX`` (hisparse_kernels.cu:1097); an expanded view costs no memory."""
    row = torch.zeros(1, 1, 16, dtype=torch.uint8)
    for rows, refused in ((INT32_MAX - 1, False), (INT32_MAX, True)):
        hot = row.expand(rows, 1, 16)
        if refused:
            with pytest.raises(InvalidArgumentError, match=rf"^hot_cache is {INT32_MAX} rows; expected fewer than "
                               rf"{INT32_MAX} rows"):
                _try(ops, 1, hot)
            assert _LAST["after"] == _LAST["before"]
        else:  # past the row bound, the next bound is the attention stride's: 2**31 - 2 one-row blocks allow 1
            with pytest.raises(ScalarRangeError, match=r"^attention_block_stride is 4; expected an int in \[1, 1\]"):
                _try(ops, 1, hot)
