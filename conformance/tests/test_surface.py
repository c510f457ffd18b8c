"""Surface tier (right after the probe tier): the backend has vLLM 0.34.0's 14 ``HiSparseBackend`` members with vLLM's
parameter counts, its two class attributes have the types vLLM reads, and the ops ``create_cache_ops(runtime)`` returns
take vLLM's four calls positionally (23/5/5/6 arguments), refuse one argument too many or too few without writing
anything, and are defined by schemas equal to vLLM's. Facts are cited ``path:line`` in the vLLM 0.34.0 sdist."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from hisparse_hal.cache_ops import oracle
from hisparse_hal.cache_ops.library import SCHEMAS
from hisparse_hal.conformance.arenas import synchronize
from hisparse_hal.conformance.contracts import typed_refusals
from hisparse_hal.conformance.vllm_contract import VLLM_METHOD_PARAMETERS, VllmContractView, suite_runtime
from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.testing.sequences import SHAPES, SequenceRun, build_sequence, run_sequence

#: This tier (read by conformance/tiers.py, without importing this module): its area, its place in the
#: run and its title in the reports.
AREA = "surface"
ORDER = 20
TITLE = "vLLM surface"

# vLLM 0.34.0 csrc/torch_bindings.cpp:1070-1114 (`ops.def` of the four HiSparse ops; whitespace collapsed).
VLLM_SCHEMAS = {
    "resolve_residency": (  # torch_bindings.cpp:1070-1093
        "(Tensor host_cache, Tensor! hot_cache, Tensor hot_block_table, Tensor global_indices, "
        "Tensor! hot_indices, Tensor! device_global_indices, Tensor! lru_slots, Tensor? request_state_indices, "
        "int region_stride, int max_union_rows, Tensor(a!)? stats=None, Tensor(b!)? attention_indices=None, "
        "int attention_block_stride=0, Tensor? request_ids=None, Tensor? source_block_table=None, "
        "int source_block_size=0, Tensor(c!)? valid_counts=None, Tensor(d!)? swap_host_physical_rows=None, "
        "Tensor(e!)? swap_device_physical_rows=None, Tensor(f!)? swap_counts=None, "
        "Tensor? resident_block_table=None, int resident_block_size=0, Tensor? num_valid_rows=None) -> ()"
    ),
    "invalidate_written_slots": (  # torch_bindings.cpp:1095-1101
        "(Tensor device_global_indices_ptrs, Tensor request_state_indices, Tensor req_id_per_token, "
        "Tensor written_slots, int num_state_rows, int region_stride) -> ()"
    ),
    "gather_plan": (  # torch_bindings.cpp:1103-1108
        "(Tensor host_cache, Tensor! hot_cache, Tensor global_indices, Tensor hot_indices, Tensor miss_mask) -> ()"
    ),
    "gather_compact": (  # torch_bindings.cpp:1110-1114
        "(Tensor host_cache, Tensor! hot_cache, Tensor miss_global_indices, Tensor miss_hot_indices, "
        "Tensor miss_counts) -> ()"
    ),
}
#: vLLM's op name -> (arguments vLLM passes positionally, arguments without a default in the schema above).
#: vLLM calls resolve with all 23 (runtime.py:904-930), the others with all theirs (runtime.py:808-814, 935-941).
ARITIES = {"resolve_residency": (23, 10), "gather_compact": (5, 5), "gather_plan": (5, 5),
           "invalidate_written_slots": (6, 6)}
#: Members vLLM always calls, which vLLM's base class leaves raising NotImplementedError (backend.py:24-79); the three
#: IPC members are needed where ``supports_shared_host_pool`` is True (worker.py:172-183).
ALWAYS_CALLED = ("check_available", "pin_tensor", "unpin_tensor", "create_cache_ops", "is_current_stream_capturing",
                 "swap_blocks_batch")
IPC_MEMBERS = ("create_ipc_event", "export_event", "import_event")
VLLM_BASE = ("vllm.v1.hisparse.backend", "HiSparseBackend")


def _implementation(backend: Any) -> Any:
    """The object vLLM would hold: the vLLM-contract instance, or hisparse-hal's backend itself."""
    return backend.impl if isinstance(backend, VllmContractView) else backend


def _positional_capacity(function: Any) -> tuple[int, float]:
    """(fewest, most) positional arguments ``function`` (bound) accepts; most is inf with ``*args``."""
    params = list(inspect.signature(function).parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        most: float = float("inf")
    else:
        most = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    fewest = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty for p in params)
    return fewest, most


# ------------------------------------------------------------------------------------------ the 14 members
@pytest.mark.parametrize("member", sorted(VLLM_METHOD_PARAMETERS))
def test_member_takes_vllms_positional_arguments(backend, member):
    count, line = VLLM_METHOD_PARAMETERS[member]
    impl = _implementation(backend)
    function = getattr(impl, member, None)
    assert callable(function), f"{member} is missing or not callable (vllm/v1/hisparse/backend.py:{line})"
    fewest, most = _positional_capacity(function)
    assert fewest <= count <= most, (
        f"{member} takes {fewest}..{most} positional arguments; vLLM 0.34.0 passes {count} "
        f"(vllm/v1/hisparse/backend.py:{line})"
    )


@pytest.mark.smoke
def test_members_vllm_calls_are_implemented(backend):
    """A subclass of vLLM's base that leaves a member vLLM calls as the base's NotImplementedError stub fails here."""
    impl = _implementation(backend)
    base = next((k for k in type(impl).__mro__ if (k.__module__, k.__qualname__) == VLLM_BASE), None)
    if base is None:
        return  # not derived from vLLM's base: nothing can be inherited from its stubs (the test above ran)
    needed = ALWAYS_CALLED + (IPC_MEMBERS if impl.supports_shared_host_pool is True else ())
    stubs = [m for m in needed if inspect.getattr_static(type(impl), m) is inspect.getattr_static(base, m)]
    assert not stubs, (
        f"{', '.join(stubs)}: left as vLLM's NotImplementedError stub (vllm/v1/hisparse/backend.py:24-79); "
        "vLLM calls it"
    )


def test_supports_shared_host_pool_is_a_bool(backend):
    value = _implementation(backend).supports_shared_host_pool
    assert type(value) is bool, (
        f"supports_shared_host_pool is {value!r} ({type(value).__name__}), not a bool "
        "(vllm/v1/hisparse/backend.py:21; read by the planner, vllm/v1/hisparse/runtime.py:295)"
    )


def test_stats_dtype_is_a_dtype_whose_host_counter_reads_as_two_ints(backend):
    dtype = _implementation(backend).stats_dtype
    assert isinstance(dtype, torch.dtype), f"stats_dtype is {dtype!r}, not a torch.dtype (backend.py:22)"
    host = torch.zeros(2, dtype=dtype)  # vLLM: device zeros and a pinned host twin of this dtype (runtime.py:623-627)
    values = host.tolist()
    assert values == [0, 0] and all(type(v) is int for v in values), (
        f"stats_dtype {dtype}: the host counter reads {values!r}, not two ints"
    )


# ------------------------------------------------------------------------------------------ the four ops
def test_schemas_equal_vllms():
    assert SCHEMAS == VLLM_SCHEMAS


def _torch_schema(op: Any) -> str | None:
    """The argument list of a torch op (an ``OpOverloadPacket`` or ``OpOverload``), None for a Python method."""
    schema = getattr(getattr(op, "default", op), "_schema", None)
    if schema is None:
        return None
    text = str(schema)
    return text[text.index("("):]


@pytest.mark.parametrize("name", sorted(VLLM_SCHEMAS))
def test_an_op_with_a_torch_schema_has_vllms(backend, name):
    ops = backend.create_cache_ops(suite_runtime(backend.device))
    op = getattr(ops, f"hisparse_{name}", None)
    assert callable(op), f"create_cache_ops(runtime) has no hisparse_{name} (vLLM calls it, design note rows B9-B16)"
    found = _torch_schema(op)
    if found is not None:
        assert " ".join(found.split()) == VLLM_SCHEMAS[name], f"hisparse_{name} is registered as {found}"


class _Recorder:
    """Forwards vLLM's four op names (un-prefixed, as the sequence driver calls them) and keeps each call's
    arguments and outcome."""

    def __init__(self, ops: Any) -> None:
        self.ops = ops
        self.calls: dict[str, tuple[Any, ...]] = {}
        self.errors: dict[str, BaseException] = {}

    def __getattr__(self, name: str) -> Any:
        if name not in ARITIES:
            raise AttributeError(name)

        def call(*args: Any) -> None:
            self.calls[name] = args
            try:
                getattr(self.ops, f"hisparse_{name}")(*args)
            except Exception as exc:  # noqa: BLE001 - reported by the test of this op
                self.errors[name] = exc

        return call


def _first_clean_seed(start: int = 64_000) -> int:
    """A seed whose sequence's first step raises nothing in the oracle."""
    seed = start
    while run_sequence(oracle, build_sequence(seed, SHAPES[0]))[0].error is not None:
        seed += 1
    return seed


@pytest.fixture(scope="module")
def recorded(backend) -> Iterator[tuple[_Recorder, SequenceRun]]:
    """One step of a generated sequence through the backend's ops with vLLM's positional calls (host pinned)."""
    sequence = build_sequence(_first_clean_seed(), SHAPES[0])
    sequence = dataclasses.replace(sequence, steps=sequence.steps[:1])
    runtime = suite_runtime(backend.device)
    recorder = _Recorder(backend.create_cache_ops(runtime))
    run = SequenceRun(sequence, backend.device, host_device="cpu")
    backend.pin_tensor(run.host)
    try:
        step = sequence.steps[0]
        io = run.tensors(step)
        run.resolve(recorder, step, io)
        run.gather(recorder, io)
        run.plan(recorder, step)
        run.mirror_and_invalidate(recorder, step, 0)
        synchronize(backend.device)
        yield recorder, run
    finally:
        synchronize(backend.device)
        backend.unpin_tensor(run.host)


@pytest.mark.parametrize("name", sorted(ARITIES))
def test_op_runs_with_vllms_positional_arguments(recorded, name):
    recorder, _ = recorded
    count = ARITIES[name][0]
    assert len(recorder.calls[name]) == count
    error = recorder.errors.get(name)
    assert error is None, (
        f"hisparse_{name} with vLLM's {count} positional arguments raised {type(error).__name__}: {error}"
    )


def _snapshot(args: tuple[Any, ...], run: SequenceRun) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copies of every tensor argument and of the run's state, to compare after a refused call."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    tensors += [run.slab, run.dgi, run.lru, run.stats, run.staging, run.host, *run.other_tables]
    return [(t, t.detach().to("cpu").clone()) for t in tensors]


@pytest.mark.parametrize("extra", [1, -1], ids=["one_too_many", "one_too_few"])
@pytest.mark.parametrize("name", sorted(ARITIES))
def test_op_refuses_a_wrong_argument_count_and_writes_nothing(backend, recorded, name, extra):
    recorder, run = recorded
    args = recorder.calls[name]
    total, required = ARITIES[name]
    wrong = (*args, args[-1]) if extra > 0 else args[:required - 1]
    what = f"hisparse_{name} with {len(wrong)} positional arguments (vLLM's schema takes {required}..{total})"
    before = _snapshot(args, run)
    refusal = (TypeError, InvalidArgumentError) if typed_refusals(backend) else Exception  # vLLM's: any exception
    try:
        getattr(recorder.ops, f"hisparse_{name}")(*wrong)
        accepted = True
    except refusal:
        accepted = False
    synchronize(backend.device)
    changed = [i for i, (t, copy) in enumerate(before) if not torch.equal(t.detach().to("cpu"), copy)]
    written = f" and wrote tensors (positions {changed} of the arguments and state)" if changed else ""
    assert not accepted, f"{what} was accepted{written}"
    assert not changed, f"{what} was refused but wrote tensors (positions {changed} of the arguments and state)"
