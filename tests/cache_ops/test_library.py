"""``torch.ops.hisparse_hal.*``: vLLM 0.34.0's schemas (derived once from ``vllm034``, one registry entry per vLLM
release), dispatch per device, fake kernels, torch.compile."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from hisparse_hal.cache_ops import (
    arguments,
    bound,
    host_impl,
    library,
    oracle,
    selection,
    signatures,
    tables,
    torch_impl,
    vllm034,
)
from hisparse_hal.cache_ops.signatures import OpSignature, SchemaRegistry, VllmSchemas, schemas_from_module
from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.testing.sequences import SHAPES, SequenceShape, build_sequence, run_sequence

I32 = torch.int32
OPS = torch.ops.hisparse_hal

# The schema strings vLLM 0.34.0 registers (design note §3.1: `strings` on the wheel's _C_stable_libtorch.abi3.so,
# identical to csrc/torch_bindings.cpp:1070-1114), whitespace collapsed. Our ops take the same arguments, in the
# same order, with the same annotations, and nothing more.
VLLM_SCHEMAS = {
    "resolve_residency": (
        "hisparse_resolve_residency(Tensor host_cache, Tensor! hot_cache, Tensor hot_block_table, "
        "Tensor global_indices, Tensor! hot_indices, Tensor! device_global_indices, Tensor! lru_slots, "
        "Tensor? request_state_indices, int region_stride, int max_union_rows, Tensor(a!)? stats=None, "
        "Tensor(b!)? attention_indices=None, int attention_block_stride=0, Tensor? request_ids=None, "
        "Tensor? source_block_table=None, int source_block_size=0, Tensor(c!)? valid_counts=None, "
        "Tensor(d!)? swap_host_physical_rows=None, Tensor(e!)? swap_device_physical_rows=None, "
        "Tensor(f!)? swap_counts=None, Tensor? resident_block_table=None, int resident_block_size=0, "
        "Tensor? num_valid_rows=None) -> ()"
    ),
    "invalidate_written_slots": (
        "hisparse_invalidate_written_slots(Tensor device_global_indices_ptrs, Tensor request_state_indices, "
        "Tensor req_id_per_token, Tensor written_slots, int num_state_rows, int region_stride) -> ()"
    ),
    "gather_plan": (
        "hisparse_gather_plan(Tensor host_cache, Tensor! hot_cache, Tensor global_indices, Tensor hot_indices, "
        "Tensor miss_mask) -> ()"
    ),
    "gather_compact": (
        "hisparse_gather_compact(Tensor host_cache, Tensor! hot_cache, Tensor miss_global_indices, "
        "Tensor miss_hot_indices, Tensor miss_counts) -> ()"
    ),
}


def _arguments(schema: Any) -> list[tuple[str, str, bool, Any, bool]]:
    """(name, type, written, default, keyword-only) of every argument."""
    return [
        (a.name, str(a.type), bool(a.alias_info and a.alias_info.is_write), a.default_value, a.kwarg_only)
        for a in schema.arguments
    ]


@pytest.mark.parametrize("name", sorted(VLLM_SCHEMAS))
def test_op_schema_takes_vllm_arguments_in_vllm_order_with_the_same_mutations(name: str) -> None:
    ours = _arguments(getattr(OPS, name).default._schema)
    vllm = _arguments(torch._C.parse_schema(VLLM_SCHEMAS[name]))
    assert ours == vllm
    assert getattr(OPS, name).default._schema.returns == []


def test_resolve_takes_23_positional_arguments_and_no_extension() -> None:
    schema = OPS.resolve_residency.default._schema
    assert len(schema.arguments) == 23 and not any(a.kwarg_only for a in schema.arguments)
    assert schema.arguments[-1].name == "num_valid_rows"


@pytest.mark.parametrize("name", sorted(VLLM_SCHEMAS))
def test_schema_derived_from_vllm034_is_vllms_string(name: str) -> None:
    derived = signatures.REGISTRY.get("0.34.0").ops[name].schema
    assert f"hisparse_{name}{derived}" == VLLM_SCHEMAS[name]
    assert library.SCHEMAS[name] == derived


def _schema_facts(schema: Any) -> list[tuple[str, str, bool, Any]]:
    """(name, type, written, default) of every argument, ``SymInt`` read as ``int``."""
    return [(name, kind.replace("SymInt", "int"), written, default)
            for name, kind, written, default, _ in _arguments(schema)]


@pytest.mark.parametrize("name", sorted(VLLM_SCHEMAS))
def test_torchs_infer_schema_of_the_vllm034_prototype_agrees(name: str) -> None:
    op = signatures.REGISTRY.get().ops[name]

    def prototype(*args: Any) -> None:
        """Stands in for the prototype with its annotations evaluated, as ``infer_schema`` reads them."""
    prototype.__signature__ = inspect.signature(op.prototype, eval_str=True)  # type: ignore[attr-defined]
    inferred = torch.library.infer_schema(prototype, mutates_args=op.writes)
    assert _schema_facts(torch._C.parse_schema(f"x{inferred}")) == _schema_facts(
        torch._C.parse_schema(VLLM_SCHEMAS[name]))


@pytest.mark.parametrize("name", sorted(VLLM_SCHEMAS))
def test_every_public_signature_is_the_vllm034_prototypes(name: str) -> None:
    prototype = inspect.signature(getattr(vllm034, name))
    for module in (host_impl, torch_impl, oracle):
        assert inspect.signature(getattr(module, name)) == prototype, module.__name__
        assert getattr(module, name).__doc__ == getattr(vllm034, name).__doc__
    method = inspect.signature(getattr(bound.CacheOps, f"hisparse_{name}"))
    assert list(method.parameters)[0] == "self"
    assert list(method.parameters.values())[1:] == list(prototype.parameters.values())
    check = inspect.signature(getattr(arguments, f"check_{name}"))
    assert [(p.name, p.default) for p in check.parameters.values()] == [
        (p.name, p.default) for p in prototype.parameters.values()], "the shared check binds vLLM's arguments"


def test_one_op_names_tuple_in_vllms_order() -> None:
    assert library.OP_NAMES is signatures.OP_NAMES
    assert signatures.OP_NAMES == ("resolve_residency", "gather_compact", "gather_plan", "invalidate_written_slots")
    assert signatures.ARITY == {"resolve_residency": (10, 23), "gather_compact": (5, 5), "gather_plan": (5, 5),
                                "invalidate_written_slots": (6, 6)}


def test_an_entry_called_by_name_checks_and_runs_like_a_positional_call() -> None:
    dgi, pointers = _registered_table([[5, 7, 5]])
    host_impl.invalidate_written_slots(
        device_global_indices_ptrs=pointers, request_state_indices=torch.tensor([0], dtype=I32),
        req_id_per_token=torch.tensor([0], dtype=I32), written_slots=torch.tensor([5]), num_state_rows=1,
        region_stride=3)
    assert dgi.tolist() == [[-1, 7, -1]]
    with pytest.raises(TypeError, match="stride"):
        host_impl.invalidate_written_slots(pointers, torch.tensor([0], dtype=I32), torch.tensor([0], dtype=I32),
                                           torch.tensor([5]), 1, stride=3)


def _made_up_release() -> VllmSchemas:
    """A vLLM "0.35.0-test" whose resolve takes one more optional written tensor: built here only."""
    base = inspect.signature(vllm034.resolve_residency)
    extra = inspect.Parameter("spill_rows", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                              annotation="Tensor | None")

    def resolve_residency(*args: Any) -> None:
        """The made-up release's resolve."""
    resolve_residency.__signature__ = base.replace(  # type: ignore[attr-defined]
        parameters=[*base.parameters.values(), extra])
    release = SimpleNamespace(
        VERSION="0.35.0-test", SOURCE="made up by the test",
        OPS=(resolve_residency, *vllm034.OPS[1:]),
        WRITES={**vllm034.WRITES, "resolve_residency": (*vllm034.WRITES["resolve_residency"], "spill_rows")},
    )
    return schemas_from_module(release)  # type: ignore[arg-type]


def test_a_second_vllm_release_keeps_0_34_registered_default_and_selectable() -> None:
    registry = SchemaRegistry(schemas_from_module(vllm034))
    registry.add(_made_up_release())
    assert registry.versions == ("0.34.0", "0.35.0-test") and registry.default == "0.34.0"
    assert registry.get().version == "0.34.0"
    assert registry.get("0.34.0").schemas == library.SCHEMAS
    later = registry.get("0.35.0-test").ops["resolve_residency"]
    assert later.arity == (10, 24)
    assert later.schema.endswith("Tensor? num_valid_rows=None, Tensor(g!)? spill_rows=None) -> ()")
    assert registry.get("0.34.0").ops["resolve_residency"].arity == (10, 23)
    with pytest.raises(InvalidArgumentError, match=r"0\.34\.0's cache-op schemas are registered already"):
        registry.add(schemas_from_module(vllm034))
    with pytest.raises(InvalidArgumentError, match=r"'0\.99\.0' has no registered cache-op schemas; expected one of "
                                                   r"0\.34\.0, 0\.35\.0-test"):
        registry.get("0.99.0")
    assert signatures.REGISTRY.versions == ("0.34.0",), "the made-up release stays in the test"


@pytest.mark.parametrize(("annotation", "writes", "message"), [
    ("Tensor", ("nope",), "x writes nope; expected names among its parameters"),
    ("float", (), "x's parameter a is annotated 'float'; expected one of Tensor"),
    ("int", ("a",), "x's parameter a is annotated 'int' and written"),
])
def test_a_prototype_without_a_schema_spelling_is_refused(annotation: str, writes: tuple[str, ...],
                                                          message: str) -> None:
    def x(*args: Any) -> None:
        """A one-parameter prototype."""
    x.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("a", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation)])
    with pytest.raises(InvalidArgumentError, match=message):
        OpSignature("x", x, writes)


def _registered_table(values: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    table = torch.tensor(values, dtype=I32)
    tables.register_table(table)
    return table, torch.tensor([table.data_ptr()], dtype=torch.int64)


def test_register_again_and_reload_keep_one_working_definition() -> None:
    library.register()
    reloaded = importlib.reload(library)
    reloaded.register()
    assert reloaded.SCHEMAS == library.SCHEMAS
    dgi, pointers = _registered_table([[5, 7, 5]])
    OPS.invalidate_written_slots(pointers, torch.tensor([0], dtype=I32), torch.tensor([0], dtype=I32),
                                 torch.tensor([5]), 1, 3)
    assert dgi.tolist() == [[-1, 7, -1]]


def test_cpu_tensors_dispatch_to_host_impl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(selection.CACHE_OPS_ENV, raising=False)
    selection.reset_implementation_choice()
    assert selection.implementation_for(torch.device("cpu")).module is host_impl


def test_gpu_device_dispatches_to_what_selection_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[torch.device] = []

    def choose(device: torch.device) -> tuple[str, str]:
        calls.append(device)
        return "torch", "forced by the test"

    monkeypatch.setattr(selection, "choose_cache_ops", choose)
    selection.reset_implementation_choice()
    assert selection.implementation_for(torch.device("cuda", 1)).module is torch_impl
    assert selection.implementation_for(torch.device("cuda", 1)).module is torch_impl
    assert calls == [torch.device("cuda", 1)], "the choice is made once per device"


def test_kernel_dispatches_on_the_accelerator_tensor_when_the_host_cache_is_on_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[torch.device] = []

    class Recorder:
        @staticmethod
        def gather_compact(*args: Any) -> None:
            seen.append(args[1].device)

    def implementation_for(device: torch.device) -> SimpleNamespace:
        seen.append(device)
        return SimpleNamespace(module=Recorder)

    monkeypatch.setattr(selection, "implementation_for", implementation_for)
    kernel = library._device_kernel("gather_compact")
    kernel(torch.zeros(2, 16), torch.empty(1, 2, 16, device="meta"), None, None, None)
    assert seen == [torch.device("meta"), torch.device("meta")]


def test_gpu_device_honours_a_forced_triton_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selection, "choose_cache_ops", lambda device: ("triton", "forced by the test"))
    selection.reset_implementation_choice()
    chosen = selection.implementation_for(torch.device("cuda", 0)).module
    assert chosen.__name__ == "hisparse_hal.cache_ops.triton_impl"


def _example_state() -> dict[str, Any]:
    """Worked example A of docs/design/cache-ops.md (two single-row requests, B=4, K=3, H=6), step 1."""
    resident = torch.zeros(4, 3, dtype=I32)
    resident[2, 2] = 10  # by state row: request 0 is on state row 2
    return {
        "host": torch.randint(0, 256, (64, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(7)),
        "hot": torch.zeros(40, 4, 16, dtype=torch.uint8),
        "hot_block_table": torch.tensor([[20, 21], [30, 31]], dtype=I32),
        "topk": torch.tensor([[1, 6, 9], [0, 5, -1]], dtype=I32),
        "hot_indices": torch.full((2, 3), -999, dtype=I32),
        "dgi": torch.full((4, 6), -1, dtype=I32),
        "lru": torch.arange(6, dtype=torch.int16).repeat(4, 1),
        "state_of_request": torch.tensor([2, 3, -1, -1], dtype=I32),
        "stats": torch.zeros(2, dtype=torch.uint64),
        "attention": torch.full((2, 3), -999, dtype=I32),
        "request_ids": torch.tensor([0, 1], dtype=I32),
        "source": torch.tensor([[5, 9, 3], [7, 2, 11]], dtype=I32),
        "swap_host": torch.full((2, 3), -999, dtype=I32),
        "swap_device": torch.full((2, 3), -999, dtype=I32),
        "swap_counts": torch.full((2,), -999, dtype=I32),
        "resident": resident,
        "valid_rows": torch.tensor([2], dtype=I32),
    }


def _resolve_and_copy(s: dict[str, Any]) -> None:
    OPS.resolve_residency(
        s["host"], s["hot"], s["hot_block_table"], s["topk"], s["hot_indices"], s["dgi"], s["lru"],
        s["state_of_request"], 6, 3, s["stats"], s["attention"], 4, s["request_ids"], s["source"], 4, None,
        s["swap_host"], s["swap_device"], s["swap_counts"], s["resident"], 4, s["valid_rows"],
    )
    OPS.gather_compact(s["host"], s["hot"], s["swap_host"], s["swap_device"], s["swap_counts"])


def _assert_example_step_one(s: dict[str, Any]) -> None:
    assert s["hot_indices"].tolist() == [[80, 81, 41], [120, 121, -1]]
    assert s["dgi"][2:].tolist() == [[21, 38, -1, -1, -1, -1], [28, 9, -1, -1, -1, -1]]
    assert s["lru"][2:].tolist() == [[2, 3, 4, 5, 0, 1], [2, 3, 4, 5, 0, 1]]
    assert s["stats"].view(torch.int64).tolist() == [0, 4]
    hot_rows = s["hot"].view(-1, 16)
    for host_row, hot_row in [(21, 80), (38, 81), (28, 120), (9, 121)]:
        assert torch.equal(hot_rows[hot_row], s["host"][host_row]), f"host row {host_row} -> hot row {hot_row}"


def test_ops_through_the_dispatcher_resolve_and_copy_the_worked_example() -> None:
    state = _example_state()
    _resolve_and_copy(state)
    _assert_example_step_one(state)


def test_fake_tensors_propagate_through_every_op_without_writing() -> None:
    state = _example_state()
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake = {k: mode.from_tensor(v) for k, v in state.items()}
        _resolve_and_copy(fake)
        OPS.gather_plan(fake["host"], fake["hot"], fake["swap_host"], fake["swap_device"], fake["hot_indices"])
        OPS.invalidate_written_slots(fake["request_ids"].to(torch.int64), fake["state_of_request"],
                                     fake["request_ids"], fake["swap_host"][:, 0].to(torch.int64), 4, 6)
        shapes = {k: (tuple(v.shape), v.dtype) for k, v in fake.items()}
    assert shapes == {k: (tuple(v.shape), v.dtype) for k, v in state.items()}
    assert state["dgi"].eq(-1).all() and state["hot_indices"].eq(-999).all(), "real tensors stay untouched"


def test_meta_tensors_run_the_fake_kernels() -> None:
    state = {k: v.to("meta") for k, v in _example_state().items()}
    _resolve_and_copy(state)  # a missing Meta kernel raises NotImplementedError here
    assert state["hot_indices"].device.type == "meta"


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_fullgraph_keeps_the_ops_in_one_graph(backend: str) -> None:
    torch._dynamo.reset()
    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)

    state = _example_state()
    compiled = torch.compile(_resolve_and_copy, fullgraph=True, backend=record)
    compiled(state)
    _assert_example_step_one(state)
    assert len(graphs) == 1, "one graph: no graph break"
    targets = {str(node.target).removesuffix(".default") for node in graphs[0].graph.nodes}
    assert {"hisparse_hal.resolve_residency", "hisparse_hal.gather_compact"} <= targets


class _DispatcherOps:
    """The four ops called through ``torch.ops.hisparse_hal`` (what an engine or a compiled graph calls)."""

    def __init__(self) -> None:
        self.resolve_residency: Callable[..., None] = OPS.resolve_residency
        self.gather_compact: Callable[..., None] = OPS.gather_compact
        self.gather_plan: Callable[..., None] = OPS.gather_plan
        self.invalidate_written_slots: Callable[..., None] = OPS.invalidate_written_slots


# Generated sequences through torch.ops (on CPU: host_impl), about 300 in all.
SEEDS_PER_SHAPE = 300 // len(SHAPES) + 1


@pytest.mark.parametrize("shape", SHAPES, ids=[f"shape{i}" for i in range(len(SHAPES))])
def test_ops_through_the_dispatcher_equal_the_oracle_over_generated_sequences(shape: SequenceShape) -> None:
    start = 500_000 + SHAPES.index(shape) * 10_000
    for seed in range(start, start + SEEDS_PER_SHAPE):
        sequence = build_sequence(seed, shape)
        assert run_sequence(_DispatcherOps(), sequence) == run_sequence(oracle, sequence), f"seed {seed}, {shape}"


@pytest.mark.parametrize(("accelerator", "expected"),
                         [(None, ["cpu"]), ("cuda", ["cpu", "cuda"]), ("xpu", ["cpu", "xpu"])])
def test_kernels_are_registered_for_cpu_and_the_builds_accelerator(monkeypatch, accelerator, expected):
    fake = SimpleNamespace(current_accelerator=lambda: None if accelerator is None else torch.device(accelerator))
    monkeypatch.setattr(torch, "accelerator", fake)
    assert library.kernel_device_types() == expected
