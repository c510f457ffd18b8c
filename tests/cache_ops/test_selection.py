"""Choosing the cache-ops implementation by capability, and the backends' CacheOps bound to it.

The GPU backends here run over the SIMULATED vendor libraries on the CPU (hisparse_hal/testing/
sim_cuda_driver.py, sim_hip_runtime.py): they prove the wiring (capability, registration alias, view), not a GPU.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any Triton kernel is defined (read at definition)

import pytest  # noqa: E402
import torch  # noqa: E402

from hisparse_hal import registry  # noqa: E402
from hisparse_hal.cache_ops import host_impl, oracle, torch_impl  # noqa: E402
from hisparse_hal.cache_ops.selection import (  # noqa: E402
    CACHE_OPS_ENV,
    TritonFacts,
    choose_cache_ops,
    implementation_for,
    implementation_module,
    probe_triton,
    reset_implementation_choice,
    with_cache_ops,
)
from hisparse_hal.capabilities import Capabilities  # noqa: E402
from hisparse_hal.errors import InvalidArgumentError, UnsupportedCapabilityError  # noqa: E402
from hisparse_hal.testing.sequences import SHAPES, build_sequence, run_sequence  # noqa: E402
from hisparse_hal.testing.sim_cuda_driver import SimulatedCudaDriver  # noqa: E402
from hisparse_hal.testing.sim_hip_runtime import SimulatedHipRuntime, simulated_rocm_backend  # noqa: E402
from hisparse_hal.vendors.cpu.backend import CpuBackend  # noqa: E402
from hisparse_hal.vendors.cuda.backend import CudaBackend  # noqa: E402
from hisparse_hal.vendors.cuda.runtime import CudaDriver  # noqa: E402

GPU = torch.device("cuda", 0)
CPU = torch.device("cpu")
HAS_TRITON = TritonFacts("3.9.0", None, interpreter=False)
NO_TRITON = TritonFacts(None, "ModuleNotFoundError: No module named 'triton'", interpreter=False)
INTERPRETER = TritonFacts("3.9.0", None, interpreter=True)


@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_OPS_ENV, raising=False)


def _block_triton_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import triton`` fail as it does where triton is not installed (and forget the choices made before)."""
    monkeypatch.setitem(sys.modules, "triton", None)
    reset_implementation_choice()


# ------------------------------------------------------------------------------------------ choose_cache_ops
def test_gpu_device_gets_triton_when_triton_imports() -> None:
    choice, reason = choose_cache_ops(GPU, HAS_TRITON, environ={})
    assert choice == "triton"
    assert reason == "triton 3.9.0 imports and device cuda:0 is a GPU"


def test_gpu_device_gets_torch_with_the_import_error_when_triton_is_missing() -> None:
    choice, reason = choose_cache_ops(GPU, NO_TRITON, environ={})
    assert choice == "torch"
    assert reason == "triton does not import (ModuleNotFoundError: No module named 'triton')"


HOST_REASON = "device cpu is host memory: reading values back costs nothing, so the gathers copy only the misses"


def test_cpu_device_gets_host_without_importing_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    _block_triton_import(monkeypatch)  # a probe would now report failure; the reason shows none ran
    choice, reason = choose_cache_ops(CPU, environ={})
    assert (choice, reason) == ("host", HOST_REASON)


def test_cpu_device_gets_host_even_with_the_interpreter_on_unless_forced() -> None:
    assert choose_cache_ops(CPU, INTERPRETER, environ={})[0] == "host"


def test_override_torch_on_the_cpu_device_runs_the_fixed_shape_code() -> None:
    assert choose_cache_ops(CPU, INTERPRETER, environ={CACHE_OPS_ENV: "torch"}) == ("torch", f"{CACHE_OPS_ENV}=torch")


def test_override_host_on_cpu_is_honoured_and_on_a_gpu_refused() -> None:
    assert choose_cache_ops(CPU, HAS_TRITON, environ={CACHE_OPS_ENV: "host"}) == ("host", f"{CACHE_OPS_ENV}=host")
    with pytest.raises(
        UnsupportedCapabilityError, match=r"HISPARSE_HAL_CACHE_OPS=host on device cuda:0: .*syncs a GPU"
    ):
        choose_cache_ops(GPU, HAS_TRITON, environ={CACHE_OPS_ENV: "host"})


def test_override_torch_wins_on_a_gpu_with_triton() -> None:
    assert choose_cache_ops(GPU, HAS_TRITON, environ={CACHE_OPS_ENV: "torch"}) == ("torch", f"{CACHE_OPS_ENV}=torch")


def test_override_triton_on_cpu_runs_the_interpreter() -> None:
    choice, reason = choose_cache_ops(CPU, INTERPRETER, environ={CACHE_OPS_ENV: "triton"})
    assert choice == "triton"
    assert reason == f"{CACHE_OPS_ENV}=triton; triton 3.9.0 on the CPU under TRITON_INTERPRET=1"


def test_override_triton_on_cpu_without_the_interpreter_is_refused() -> None:
    expected = "runs CPU tensors only through its interpreter; set TRITON_INTERPRET=1"
    with pytest.raises(UnsupportedCapabilityError, match=expected):
        choose_cache_ops(CPU, HAS_TRITON, environ={CACHE_OPS_ENV: "triton"})


def test_override_triton_without_triton_is_refused_not_ignored() -> None:
    expected = r"HISPARSE_HAL_CACHE_OPS=triton, but triton does not import \(ModuleNotFoundError"
    with pytest.raises(UnsupportedCapabilityError, match=expected):
        choose_cache_ops(GPU, NO_TRITON, environ={CACHE_OPS_ENV: "triton"})


def test_unknown_override_value_is_rejected_with_the_choices() -> None:
    expected = r"HISPARSE_HAL_CACHE_OPS must be one of \['triton', 'torch', 'host'\], got 'cuda'"
    with pytest.raises(InvalidArgumentError, match=expected):
        choose_cache_ops(GPU, HAS_TRITON, environ={CACHE_OPS_ENV: "cuda"})


def test_probe_reports_the_import_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    _block_triton_import(monkeypatch)
    facts = probe_triton({"TRITON_INTERPRET": "1"})
    assert facts.version is None and facts.interpreter
    assert facts.error is not None and facts.error.startswith("ModuleNotFoundError") and "triton" in facts.error


def test_probe_reports_the_installed_version_and_interpreter_flag() -> None:
    pytest.importorskip("triton")
    import triton

    assert probe_triton({}) == TritonFacts(triton.__version__, None, interpreter=False)


def test_implementation_module_rejects_unknown_names() -> None:
    assert implementation_module("triton").__name__ == "hisparse_hal.cache_ops.triton_impl"
    with pytest.raises(InvalidArgumentError, match=r"must be one of \['triton', 'torch', 'host'\], got 'cuda'"):
        implementation_module("cuda")


# ------------------------------------------------------------------------------------------ one memoised choice
def _op_library_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Which implementation ``torch.ops.hisparse_hal.gather_compact`` runs for CPU tensors (recorded, not run)."""
    ran: list[str] = []
    for name, module in (("host", host_impl), ("torch", torch_impl)):
        monkeypatch.setattr(module, "gather_compact", lambda *args, _name=name: ran.append(_name))
    torch.ops.hisparse_hal.gather_compact(*_compact_case())
    return ran


def test_backend_and_op_library_read_one_memoised_choice_until_it_is_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_OPS_ENV, raising=False)
    backend = registry.get_backend("cpu")
    assert backend.capabilities.cache_ops == backend.create_cache_ops(None).implementation == "host"
    assert _op_library_runs(monkeypatch) == ["host"]

    monkeypatch.setenv(CACHE_OPS_ENV, "torch")  # memoised: neither side moves, so they cannot disagree
    assert CpuBackend().capabilities.cache_ops == "host" and _op_library_runs(monkeypatch) == ["host"]

    reset_implementation_choice()
    registry.reset_backend_cache()
    rebuilt = registry.get_backend("cpu")
    assert rebuilt.capabilities.cache_ops == rebuilt.create_cache_ops(None).implementation == "torch"
    assert _op_library_runs(monkeypatch) == ["torch"]
    assert implementation_for("cpu").reason == f"{CACHE_OPS_ENV}=torch"
    assert rebuilt.capabilities.reasons["cache_ops"] == f"torch ({CACHE_OPS_ENV}=torch)"


def test_the_choice_is_made_once_per_device_for_every_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    import hisparse_hal.cache_ops.selection as selection

    calls: list[torch.device] = []
    real = selection.choose_cache_ops

    def counted(device: torch.device, *args: object, **kwargs: object) -> tuple[str, str]:
        calls.append(torch.device(device))
        return real(device)

    monkeypatch.setattr(selection, "choose_cache_ops", counted)
    CpuBackend()
    CpuBackend()
    _op_library_runs(monkeypatch)
    assert calls == [CPU]


def test_a_bad_override_is_refused_by_name_on_every_path_and_not_memoised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_OPS_ENV, "cuda")
    refused = rf"{CACHE_OPS_ENV} must be one of \['triton', 'torch', 'host'\], got 'cuda'"
    for attempt in (lambda: implementation_for(CPU), CpuBackend, lambda: _op_library_runs(monkeypatch)):
        with pytest.raises(InvalidArgumentError, match=refused):
            attempt()
    monkeypatch.delenv(CACHE_OPS_ENV)
    assert implementation_for(CPU).implementation == "host"  # fixed at once: the refusal was not kept


# ------------------------------------------------------------------------------------------ Capabilities field
def test_capabilities_cache_ops_defaults_to_torch_and_serialises() -> None:
    caps = Capabilities("native", None, True, None, True, True, False, frozenset({"bf16"}))
    assert caps.cache_ops == "torch" and caps.as_dict()["cache_ops"] == "torch"
    chosen = with_cache_ops(caps, GPU, HAS_TRITON, environ={})
    assert chosen.as_dict()["cache_ops"] == "triton"
    assert chosen.reasons["cache_ops"] == "triton (triton 3.9.0 imports and device cuda:0 is a GPU)"
    assert chosen.notes[-1] == "cache_ops: triton (triton 3.9.0 imports and device cuda:0 is a GPU)"
    again = with_cache_ops(chosen, GPU, NO_TRITON, environ={})
    assert list(again.reasons) == ["cache_ops"]  # replaced, not appended
    assert again.reasons["cache_ops"] == (
        "torch (triton does not import (ModuleNotFoundError: No module named 'triton'))"
    )


def test_capabilities_reject_an_unknown_cache_ops_value() -> None:
    with pytest.raises(InvalidArgumentError, match="cache_ops must be 'triton', 'torch' or 'host', got 'cuda'"):
        Capabilities("native", None, True, None, True, True, False, frozenset({"bf16"}), cache_ops="cuda")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ CPU device
def _compact_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    host = torch.randint(0, 256, (12, 32), dtype=torch.uint8, generator=generator)
    hot = torch.zeros(4, 2, 32, dtype=torch.uint8)
    rows = torch.tensor([[3, 12, 7], [5, 0, 0]], dtype=torch.int32)  # 12 >= host rows: zero-fill
    dest = torch.tensor([[0, 1, 2], [6, 7, 5]], dtype=torch.int32)
    counts = torch.tensor([3, 1], dtype=torch.int32)
    return host, hot, rows, dest, counts


def _assert_compacted(host: torch.Tensor, hot: torch.Tensor) -> None:
    flat = hot.view(8, 32)
    assert torch.equal(flat[0], host[3]) and torch.equal(flat[2], host[7]) and torch.equal(flat[6], host[5])
    assert int(flat[1].sum()) == 0  # zero-filled, not stale
    assert int(flat[[3, 4, 5, 7]].sum()) == 0  # past the counts: untouched


def test_cpu_device_reports_host_cache_ops_with_the_reason() -> None:
    backend = CpuBackend()
    assert backend.capabilities.cache_ops == "host"
    assert backend.capabilities.reasons["cache_ops"] == f"host ({HOST_REASON})"
    assert backend.create_cache_ops(None).implementation == "host"


def test_cpu_device_cache_ops_copy_real_rows() -> None:
    ops = CpuBackend().create_cache_ops(None)
    host, hot, rows, dest, counts = _compact_case()
    hot.view(8, 32)[1] = 9  # stale bytes the zero-fill must clear
    ops.gather_compact(host, hot, rows, dest, counts)
    _assert_compacted(host, hot)


def test_cpu_device_forced_to_triton_runs_the_interpreted_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    monkeypatch.setenv(CACHE_OPS_ENV, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ops = CpuBackend().create_cache_ops(None)
    assert ops.implementation == "triton"
    host, hot, rows, dest, counts = _compact_case()
    hot.view(8, 32)[1] = 9
    ops.gather_compact(host, hot, rows, dest, counts)
    _assert_compacted(host, hot)


@pytest.mark.parametrize("forced", ["torch", "triton", "host"])
def test_cpu_device_cache_ops_run_a_decode_sequence_exactly_as_the_oracle(
    forced: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if forced == "triton":
        pytest.importorskip("triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(CACHE_OPS_ENV, forced)
    ops = CpuBackend().create_cache_ops(None)
    assert ops.implementation == forced
    sequence = build_sequence(11, SHAPES[2])  # MTP runs of up to 3 rows, int16 rows
    assert run_sequence(ops, sequence) == run_sequence(oracle, sequence)


def test_cpu_device_rejects_a_non_tensor_host_cache() -> None:
    with pytest.raises(InvalidArgumentError, match="device_view_of_host: expected a CPU tensor, got list"):
        CpuBackend().device_view_of_host([1, 2])  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ simulated GPUs
class _SimCuda(CudaBackend):
    def _current_stream_handle(self) -> int:
        return 0x5A00

    def is_current_stream_capturing(self) -> bool:
        return False


def _sim_cuda() -> _SimCuda:
    return _SimCuda.for_device(0, 12080, "sm_90", runtime=CudaDriver(0, SimulatedCudaDriver(12080)), device=CPU)


def test_simulated_cuda_backend_reports_triton_where_it_imports() -> None:
    pytest.importorskip("triton")
    caps = _sim_cuda().capabilities
    assert caps.cache_ops == "triton"
    assert caps.reasons["cache_ops"].startswith("triton (triton ")
    assert caps.reasons["cache_ops"].endswith("device cuda:0 is a GPU)")


def test_simulated_cuda_backend_reports_torch_where_triton_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    _block_triton_import(monkeypatch)
    backend = _sim_cuda()
    assert backend.capabilities.cache_ops == "torch"
    assert backend.create_cache_ops(None).implementation == "torch"
    assert backend.capabilities.reasons["cache_ops"].startswith("torch (triton does not import (ModuleNotFoundError")


def test_simulated_rocm_backend_reports_triton_or_torch_by_availability(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    assert simulated_rocm_backend(SimulatedHipRuntime("7.14")).capabilities.cache_ops == "triton"
    _block_triton_import(monkeypatch)
    assert simulated_rocm_backend(SimulatedHipRuntime("7.14")).capabilities.cache_ops == "torch"


def test_gpu_layer_view_of_pinned_memory_uses_the_host_address_without_alias() -> None:
    backend = _sim_cuda()
    pool = torch.zeros(8, 4, 32, dtype=torch.uint8)
    backend.pin_tensor(pool)
    layer = pool[2]  # one layer of a host pool: a view inside the registration
    assert not backend.capabilities.host_pointer_alias
    assert backend.device_address_of_host(layer) == layer.data_ptr()
    assert backend.device_view_of_host(layer) is layer  # injected CPU device: the host address is readable


def test_gpu_layer_refuses_a_view_of_memory_it_did_not_pin() -> None:
    backend = _sim_cuda()
    stray = torch.zeros(4, 32, dtype=torch.uint8)
    expected = r"is not inside memory pinned by backend 'cuda'; pin_tensor the host pool first"
    with pytest.raises(InvalidArgumentError, match=expected):
        backend.device_view_of_host(stray)


def test_gpu_layer_refuses_a_device_tensor_as_host_cache() -> None:
    with pytest.raises(InvalidArgumentError, match="device_view_of_host: expected a pinned CPU tensor, got meta"):
        _sim_cuda().device_view_of_host(torch.empty(4, 32, dtype=torch.uint8, device="meta"))


def test_rocm_view_address_is_the_registration_alias_that_kernels_read() -> None:
    sim = SimulatedHipRuntime("7.14")
    backend = simulated_rocm_backend(sim)
    assert backend.capabilities.host_pointer_alias
    pool = torch.arange(8 * 64, dtype=torch.int32).view(8, 64).to(torch.uint8).contiguous()
    backend.pin_tensor(pool)
    layer = pool[3:5]
    address = backend.device_address_of_host(layer)
    assert address == layer.data_ptr() + sim.alias_offset != layer.data_ptr()
    assert sim.kernel_read(address, 128) == bytes(layer.reshape(-1).tolist())  # a simulated kernel sees the rows


def test_rocm_alias_cannot_be_handed_to_an_injected_cpu_device_so_cache_ops_refuse() -> None:
    from hisparse_hal.vendors.rocm.backend import RocmBackend

    class PlainRocm(RocmBackend):  # the shared GPU layer's own view, without the simulator's stand-in
        def _current_stream_handle(self) -> int:
            return 0x5000

        def is_current_stream_capturing(self) -> bool:
            return False

    simulated = simulated_rocm_backend(SimulatedHipRuntime("7.14"))
    backend = PlainRocm(simulated.capabilities, simulated.runtime, 0, device=CPU)
    host, hot, rows, dest, counts = _compact_case()
    backend.pin_tensor(host)
    with pytest.raises(UnsupportedCapabilityError, match="cannot be dereferenced on the injected device cpu"):
        backend.create_cache_ops(None).gather_compact(host, hot, rows, dest, counts)
    assert int(hot.sum()) == 0  # refused before any row moved
    backend.unpin_tensor(host)


def test_simulated_rocm_cache_ops_move_pinned_rows_after_the_alias_checks_out() -> None:
    backend = simulated_rocm_backend(SimulatedHipRuntime("7.14"))
    host, hot, rows, dest, counts = _compact_case()
    backend.pin_tensor(host)
    backend.create_cache_ops(None).gather_compact(host, hot, rows, dest, counts)
    _assert_compacted(host, hot)


def test_simulated_cuda_cache_ops_move_pinned_rows_through_the_view(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    backend = _sim_cuda()
    ops = backend.create_cache_ops(None)
    assert ops.implementation == "triton"
    host, hot, rows, dest, counts = _compact_case()
    backend.pin_tensor(host)
    ops.gather_compact(host, hot, rows, dest, counts)
    _assert_compacted(host, hot)
