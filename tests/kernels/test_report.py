"""The Triton cache-ops kernels compiled offline for sm_90, sm_100, gfx942 and gfx950, held to hardware limits.

Compiling is not running: these tests prove the kernels lower for each target and what they would ask of it
(shared memory / LDS, registers, spills, 64-bit addressing), not that they give right answers there (the
interpreter tests and the oracle do that). One module-scoped compile of a representative set: the production
shapes on all four targets, and top-k 1 and 65 on gfx942, where 65 spans two 64-lane wavefronts
(``hisparse-hal kernels`` compiles every lane-boundary value on every target).
"""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import re
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # as the interpreter tests set it: the compiled copy must not care

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip(
    "triton", reason="compiling the Triton kernels needs triton (pip install -e '.[triton]')"
)

from hisparse_hal import cli  # noqa: E402
from hisparse_hal.cache_ops import triton_impl  # noqa: E402
from hisparse_hal.errors import InvalidArgumentError  # noqa: E402
from hisparse_hal.kernels import report as kernel_report  # noqa: E402
from hisparse_hal.kernels import specs as kernel_specs  # noqa: E402
from hisparse_hal.kernels.report import KernelFacts  # noqa: E402

TARGETS = tuple(kernel_report.TARGETS)


def _compile() -> list[KernelFacts]:
    with kernel_report.quiet_triton():
        return (kernel_report.compile_cases(kernel_specs.production_cases(), TARGETS)
                + kernel_report.compile_cases(kernel_specs.lane_cases((1, 65)), ["gfx942"]))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[KernelFacts]:
    """Production cases x every target, then top-k 1 and 65 on gfx942: compiled once per test run. Under xdist
    the first worker compiles and the others read its pickle (pytest-xdist's "execute once" recipe: the
    run's shared temporary folder and a file lock)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # one process: nothing to share
        return _compile()
    shared = tmp_path_factory.getbasetemp().parent  # this run's folder, above every worker's own
    cache = shared / "triton-targets.pickle"
    with open(shared / "triton-targets.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cache.exists():
            cached: list[KernelFacts] = pickle.loads(cache.read_bytes())  # written by this run's other worker
            return cached
        compiled = _compile()
        cache.write_bytes(pickle.dumps(compiled))
        return compiled


def _production(results: list[KernelFacts]) -> list[KernelFacts]:
    chosen = [f for f in results if f.production]
    assert chosen, "no production case was compiled"
    return chosen


def test_every_kernel_of_the_module_compiles_for_all_four_targets(results: list[KernelFacts]) -> None:
    module = kernel_report.compiler_kernels()
    defined = {name for name in module.__all__ if name.endswith("_kernel")}
    assert defined == {"resolve_union_kernel", "resolve_residency_kernel", "gather_rows_kernel",
                       "invalidate_written_slots_kernel"}
    for target in TARGETS:
        mine = [f for f in results if f.target == target]
        assert {f.kernel for f in mine} == defined, f"{target}: kernels without a compile case"
        failed = [f"{f.name}: {f.error}" for f in mine if not f.compiled]
        assert not failed, f"{target}: {failed}"
        assert all(f.error is None for f in mine), [f.error for f in mine if f.error]


def test_shared_memory_and_lds_fit_the_targets_at_production_shapes(results: list[KernelFacts]) -> None:
    for f in _production(results):
        limit = kernel_report.SHARED_LIMIT_BYTES[f.target]
        assert f.shared_bytes is not None and 0 <= f.shared_bytes <= limit, f"{f.name} on {f.target}: {f.shared_bytes}"
    assert kernel_report.SHARED_LIMIT_BYTES["gfx942"] == kernel_report.SHARED_LIMIT_BYTES["gfx950"] == 64 * 1024
    # the resolver's scans use shared memory at top-k 2048: the figure is read, not a default 0
    resolve = [f for f in _production(results) if f.kernel == "resolve_residency_kernel"]
    assert all(f.shared_bytes and f.shared_bytes > 0 for f in resolve)


def test_no_register_spills_to_memory_at_production_shapes(results: list[KernelFacts]) -> None:
    """NVIDIA: ptxas's spill stores and loads are 0; AMD: no VGPR spills and no scratch.

    Documented exception: on gfx942/gfx950 the kernels spill SGPRs (up to ~190), which the compiler places in
    VGPR lanes (``v_writelane``/``v_readlane``), not memory, so the scratch (private segment) stays 0 bytes. They
    come from the scalar kernel arguments (resolve_residency_kernel takes 60) and uniform loop values exceeding
    the 106 SGPRs a wave may address; the cost is extra VALU instructions, not memory traffic.
    """
    for f in _production(results):
        assert f.spill_bytes == 0, f"{f.name} on {f.target} spills: {f.spills}"
        if f.target.startswith("sm_"):
            assert f.spills["spill_store_bytes"] == f.spills["spill_load_bytes"] == 0
            assert f.registers is not None and 0 < f.registers <= 255
        else:
            assert f.spills["vgpr_spill_count"] == 0 and f.spills["private_segment_bytes"] == 0, f.spills
            assert f.registers is not None and 0 < f.registers <= 512 and f.sgprs is not None and f.sgprs <= 106


def test_row_address_arithmetic_is_64_bit_on_every_target(results: list[KernelFacts]) -> None:
    for f in results:
        assert f.narrow_offsets == 0, f"{f.name} on {f.target}: a 32-bit pointer offset in the TTIR"
        assert f.i64_multiplies and f.i64_multiplies > 0 or f.kernel == "invalidate_written_slots_kernel", f.name
    gathers = [f for f in results if f.kernel == "gather_rows_kernel" and f.production and not f.variant]
    for f in gathers:
        if "ptx" in f.asm:  # g x row words: a 64 x 64-bit multiply (or a widening one) in the PTX
            assert re.search(r"\bmul\.(lo\.s64|wide\.[su]32)\b", f.asm["ptx"]), f"{f.name} on {f.target}"


def test_amd_host_pools_past_2_gib_get_their_own_binary_without_32_bit_buffer_offsets(
    results: list[KernelFacts],
) -> None:
    """Triton's AMD backend turns loads from a tensor of at most 2 GiB into buffer loads with 32-bit offsets; a
    larger host pool must compile to global loads with 64-bit addresses, as a separate specialization."""
    for target in ("gfx942", "gfx950"):
        small, large = (next(f for f in results if f.target == target and f.kernel == "gather_rows_kernel"
                             and f.production and ("2 GiB" in f.shape) == big) for big in (False, True))
        assert not large.variant, f"{target}: the >2 GiB pool reused the small pool's binary"
        assert re.search(r"amdg\.buffer_load %host_ptr", small.asm["ttgir"])
        assert not re.search(r"amdg\.buffer_load %host_ptr", large.asm["ttgir"])
    nvidia = [f for f in results if f.target == "sm_90" and f.kernel == "gather_rows_kernel" and "2 GiB" in f.shape]
    assert nvidia and nvidia[0].variant  # NVIDIA has no such specialization: one binary for both


_NARROW_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def narrow(src, dst, row, row_words):
    off = row * row_words  # int32 x int32: wraps past 2^31 words
    tl.store(dst + off, tl.load(src + off))
"""


def test_narrow_offset_check_counts_32_bit_offsets_of_a_compiled_kernel(tmp_path: Path) -> None:
    """The 64-bit check can fail: a kernel multiplying an i32 row by a row size is caught in its TTIR."""
    source = tmp_path / "narrow_kernels.py"
    source.write_text(_NARROW_KERNEL)
    i32 = torch.empty(4, dtype=torch.int32, device="meta")
    case = kernel_specs.KernelCase("test", "i32", False, triton_impl.Launch("narrow", (1,), (i32, i32, 3, 7), {}))
    (facts,) = kernel_report.compile_cases([case], ["sm_90"], str(source))
    assert facts.compiled, facts.error
    assert facts.narrow_offsets == 2  # the load's and the store's offset
    assert kernel_report.narrow_offsets("%c = arith.constant 1 : i32\n%p = tt.addptr %s, %c : !tt.ptr<i32>, i32") == 0
    assert kernel_report.narrow_offsets("%p = tt.addptr %s, %o : tensor<4x!tt.ptr<i32>>, tensor<4xi32>") == 1


def test_cases_come_from_the_launchers_plans_not_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_impl, "_GATHER_COLUMNS", 8)
    monkeypatch.setattr(triton_impl, "_GATHER_PROGRAMS", 5)
    gather = next(c for c in kernel_specs.production_cases() if c.kernel == "gather_rows_kernel")
    assert gather.launch.constexprs["BLOCK_C"] == 8 and gather.launch.grid == (5,)
    assert gather.launch.constexprs["BLOCK_W"] == 256  # 656-byte rows: 164 int32 words in 256-lane tiles
    resolve = next(c for c in kernel_specs.production_cases() if c.kernel == "resolve_residency_kernel")
    assert resolve.launch.constexprs["BLOCK_K"] == 1024 and resolve.launch.constexprs["BLOCK_H"] == 1024
    lanes = {c.shape.split()[0] for c in kernel_specs.lane_cases()}
    assert lanes == {f"k={k}" for k in (1, 31, 32, 33, 63, 64, 65, 128)}


def test_kernels_command_rejects_unknown_targets(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["kernels", "--targets", "sm_90,gfx1100"]) == 2
    assert "unknown target(s) ['gfx1100']; known: sm_90, sm_100, gfx942, gfx950" in capsys.readouterr().err
    with pytest.raises(InvalidArgumentError, match="unknown target"):
        kernel_report.targets_of(",")


def test_kernels_command_prints_the_table_and_writes_json_and_dumps(
    results: list[KernelFacts], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(kernel_report, "compile_cases", lambda cases, targets, on_result=None: results)
    out_json, dump = tmp_path / "kernels.json", tmp_path / "dump"
    assert cli.main(["kernels", "--production-only", "--json", str(out_json), "--dump", str(dump)]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"resolve_residency_kernel\[k=2048 hot=5x rows=256\]\s+gfx942\s+ok\s+\d+", printed)
    assert "sm_90: " in printed and "compiled, not run" in printed
    payload = json.loads(out_json.read_text())
    assert payload["targets"] == list(TARGETS) and len(payload["results"]) == len(results)
    assert payload["summary"]["gfx950"]["shared_limit_bytes"] == 65536
    assert {p.suffix for p in (dump / "sm_90").iterdir()} >= {".ptx", ".sass", ".ll", ".ttgir"}
    assert {p.suffix for p in (dump / "gfx942").iterdir()} >= {".amdgcn", ".ll"}
    sass = next((dump / "sm_100").glob("gather_rows_kernel*.sass")).read_text()
    assert "sm_100" in sass and "Function : gather_rows_kernel" in sass


def test_against_device_without_a_gpu_exits_2_naming_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    from hisparse_hal.kernels import device_check as kernel_device_check

    try:
        kernel_device_check.device_target()
    except Exception:
        pass
    else:
        pytest.skip("triton finds a GPU here: ci/gpu-check.sh runs the comparison for real")
    assert cli.main(["kernels", "--against-device", "--production-only"]) == 2
    assert "hisparse-hal kernels --against-device: triton finds no GPU here" in capsys.readouterr().err


def test_device_comparison_names_each_disagreement() -> None:
    from hisparse_hal.kernels.device_check import DeviceComparison

    same = DeviceComparison("k", "s", "sm_90", {"compiled": True, "shared_bytes": 8, "registers": 40, "spills": 0},
                            {"compiled": True, "shared_bytes": 8, "registers": 40, "spill_bytes": 0})
    assert same.mismatches == []
    other = DeviceComparison("k", "s", "sm_90", {"compiled": True, "shared_bytes": 16, "registers": 40, "spills": 3},
                             {"compiled": True, "shared_bytes": 8, "registers": 40, "spill_bytes": 0})
    assert other.mismatches == ["shared_bytes: device 16 offline 8", "spills: device 3 offline 0 B"]
