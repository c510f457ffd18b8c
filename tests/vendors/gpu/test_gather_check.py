"""The GPU gather's id check in two launches (``vendors/gpu/gather_check.py``): the Triton check under triton's
interpreter on CPU tensors.

A counter wraps the two kernels' launches and a ``TorchDispatchMode`` records every torch operator the
gather runs besides them (the kernels' own interpreter work is hidden from it), so the test shows what a
GPU would launch per gather: the two check kernels and the one ``index_select``. The torch fallback's
count is measured beside it.
"""

from __future__ import annotations

import os
import random
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are first defined

import pytest  # noqa: E402
import torch  # noqa: E402

_NEED = "the Triton id-check tests need triton and numpy (pip install -e '.[triton]')"
pytest.importorskip("triton", reason=_NEED)
pytest.importorskip("numpy", reason=_NEED)

from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes  # noqa: E402

from hisparse_hal.errors import InvalidArgumentError  # noqa: E402
from hisparse_hal.gather import gather_rows, new_fault_record, raise_recorded_fault  # noqa: E402
from hisparse_hal.testing.sim_hip_runtime import SimulatedHipRuntime, simulated_rocm_backend  # noqa: E402
from hisparse_hal.vendors.gpu import gather_check  # noqa: E402
from hisparse_hal.vendors.gpu.gather_check import TritonIdCheck  # noqa: E402

CPU = torch.device("cpu")
#: Operators that only describe a tensor (no kernel on a GPU).
_METADATA = {"aten.view.default", "aten.as_strided.default", "aten._reshape_alias.default", "aten.alias.default",
             "aten.detach.default", "aten.t.default", "aten.slice.Tensor", "aten.select.int"}


class OpLog(TorchDispatchMode):
    """Records every torch operator that runs, except metadata-only ones."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if str(func) not in _METADATA:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.fixture
def launches(monkeypatch):
    """Counts the Triton check's kernel launches; the kernels run with dispatch modes off."""
    kernels = gather_check._kernels()
    if not kernels.INTERPRETED:
        pytest.skip("the Triton kernels were defined without TRITON_INTERPRET=1 in this process")
    counted: list[str] = []

    class Counting:
        def __init__(self, name: str, kernel: Any) -> None:
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **kwargs: Any) -> Any:
                counted.append(self.name)
                with _disable_current_modes():
                    return self.kernel[grid](*args, **kwargs)
            return launch

    for name in ("check_ids_kernel", "record_fault_kernel"):
        monkeypatch.setattr(kernels, name, Counting(name, getattr(kernels, name)))
    return counted


def _source() -> torch.Tensor:
    return torch.arange(4 * 8 * 16, dtype=torch.int32).to(torch.uint8).view(4, 8, 16)


def test_a_checked_gather_is_two_check_launches_and_one_index_select(launches):
    source, out = _source(), torch.empty(3, 16, dtype=torch.uint8)
    check, ids = TritonIdCheck(new_fault_record(CPU)), torch.tensor([3, 32, -1])
    with OpLog() as log:
        gather_rows(source, out, ids, device_check=check)
    assert launches == ["check_ids_kernel", "record_fault_kernel"]
    assert log.ops == ["aten.empty.memory_format", "aten.index_select.out"]  # the index buffer, the gather
    rows = source.view(-1, 16)
    assert torch.equal(out, torch.stack([rows[3], rows[31], rows[0]]))
    with pytest.raises(InvalidArgumentError, match=r"row_ids\[1\] = 32 is out of range: ids must be -1 \(not "
                       r"resident\) or in \[0, 32\) for 4 blocks of 8 rows; found by the device-side check"):
        raise_recorded_fault(check.record)


#: Extra torch operators (GPU kernels) of the torch fallback's id check over an unchecked gather, as measured
#: on torch 2.13: clamp, ne, _to_copy, argmax, take, stack, any, eq, where, copy_ and more (not reduced yet).
TORCH_FALLBACK_EXTRA_OPS = 18


def test_the_torch_fallback_check_launch_count_is_measured_beside_it():
    """Where triton is missing, gather_rows' torch ops check the ids; this pins their number (a GPU
    launches one kernel per operator) so a change to it is seen."""
    source, out = _source(), torch.empty(3, 16, dtype=torch.uint8)
    record, bad, good = new_fault_record(CPU), torch.tensor([3, 32, -1]), torch.tensor([3, 31, -1])
    with OpLog() as log:
        gather_rows(source, out, bad, fault_record=record)
    with OpLog() as plain:
        gather_rows(source, out, good, check_range=False)
    extra = len(log.ops) - len(plain.ops)
    assert plain.ops == ["aten.clamp_min.default", "aten.index_select.out"]
    assert extra == TORCH_FALLBACK_EXTRA_OPS, log.ops


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("seed", range(6))
def test_indices_and_the_first_fault_match_a_reference_over_many_gathers(launches, monkeypatch, dtype, seed):
    monkeypatch.setattr(gather_check, "MAX_PROGRAMS", 2)  # few programs: each strides over several tiles
    rng = random.Random(seed)
    blocks, block, width = 5, 7, 3
    base = torch.randint(
        0, 127, (blocks, block + 2, width), dtype=torch.int8, generator=torch.Generator().manual_seed(seed)
    )
    source = base[:, 1:block + 1]  # padded: rows are strided, so the check remaps ids to the row view
    total = blocks * block
    check = TritonIdCheck(new_fault_record(CPU))
    limit = torch.iinfo(dtype).max
    first: tuple[int, int] | None = None
    for _ in range(3):
        n = rng.randrange(1, 2600)
        ids = [rng.randrange(-1, total) for _ in range(n)]
        if rng.random() < 0.7:
            for _ in range(rng.randrange(1, 4)):
                ids[rng.randrange(n)] = rng.choice([-2, total, total + 5, -limit - 1, limit])
        out = torch.empty(n, width, dtype=torch.int8)
        gather_rows(source, out, torch.tensor(ids, dtype=dtype), device_check=check)
        expected = torch.stack([source[min(max(i, 0), total - 1) // block, min(max(i, 0), total - 1) % block]
                                for i in ids])
        assert torch.equal(out, expected)
        bad = [(i, v) for i, v in enumerate(ids) if not -1 <= v < total]
        if first is None and bad:
            first = bad[0]
    assert len(launches) == 6
    if first is None:
        raise_recorded_fault(check.record)
        return
    with pytest.raises(InvalidArgumentError, match=rf"row_ids\[{first[0]}\] = {first[1]} is out of range"):
        raise_recorded_fault(check.record)
    raise_recorded_fault(check.record)  # cleared once read


def test_the_gpu_layer_uses_an_installed_check_and_keeps_the_first_fault(launches):
    backend = simulated_rocm_backend(SimulatedHipRuntime("7.14"))
    assert backend.gather_id_check is None  # the CPU stand-in device gets the torch check by default
    backend.gather_id_check = TritonIdCheck(backend.gather_fault_record)
    source, out = _source(), torch.empty(2, 16, dtype=torch.uint8)
    backend.gather_resident_rows(source, out, torch.tensor([0, -2], dtype=torch.int32))
    backend.gather_resident_rows(source, out, torch.tensor([99, 0]))
    assert len(launches) == 4
    with pytest.raises(InvalidArgumentError, match=r"row_ids\[1\] = -2 is out of range"):
        backend.raise_gather_faults()
    backend.raise_gather_faults()
