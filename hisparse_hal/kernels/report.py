"""``hisparse-hal kernels``: compile the Triton cache-ops kernels for real GPU targets, offline, and report.

Compiling is not running: it proves a kernel lowers for a target and shows what it would take (shared memory
or LDS, registers, spills, code size); it says nothing of results or speed. Each case of
:mod:`hisparse_hal.kernels.specs` is specialized exactly as triton's launcher would specialize it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.util
import io
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import types
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from hisparse_hal import cache_ops
from hisparse_hal.errors import InvalidArgumentError, UnsupportedCapabilityError

from .specs import KernelCase

__all__ = [
    "TARGETS", "SHARED_LIMIT_BYTES", "KernelFacts", "compile_case", "compile_cases", "format_table",
    "add_arguments", "quiet_triton", "summary", "dump", "targets_of",
]

#: Target name -> (triton backend, arch, lanes per warp/wavefront): H100/H200, B200, MI300X, MI355X.
TARGETS: dict[str, tuple[str, int | str, int]] = {
    "sm_90": ("cuda", 90, 32),
    "sm_100": ("cuda", 100, 32),
    "gfx942": ("hip", "gfx942", 64),
    "gfx950": ("hip", "gfx950", 64),
}
#: Shared memory one block may use: 227 KiB on compute capability 9.0 and 10.0 (opt-in above 48 KiB; CUDA C++
#: Programming Guide, "Technical Specifications per Compute Capability"); 64 KiB of LDS per workgroup on gfx942.
#: gfx950 has 160 KiB (docs/design vendor-facts #18), but the kernels are held to 64 KiB on both AMD parts so
#: one source fits every CDNA3/CDNA4 part (SGLang #23963 asked for 115,200 bytes on MI300X).
SHARED_LIMIT_BYTES = {"sm_90": 232_448, "sm_100": 232_448, "gfx942": 65_536, "gfx950": 65_536}


@dataclasses.dataclass
class KernelFacts:
    """What compiling one case for one target gave: an error, or the compiled kernel's resources."""

    kernel: str
    op: str
    shape: str
    production: bool
    target: str
    compiled: bool
    error: str | None = None
    shared_bytes: int | None = None
    num_warps: int | None = None
    registers: int | None = None  # NVIDIA: per thread (ptxas); AMD: VGPRs per lane
    sgprs: int | None = None  # AMD only
    spill_bytes: int | None = None  # NVIDIA: ptxas spill stores + loads; AMD: scratch (private segment)
    spills: dict[str, int] = dataclasses.field(default_factory=dict)  # the tool's own spill figures
    artifact_bytes: dict[str, int] = dataclasses.field(default_factory=dict)  # cubin/hsaco and text sizes
    i64_multiplies: int | None = None  # 64-bit multiplies in the LLVM IR
    narrow_offsets: int | None = None  # tt.addptr with a non-constant 32-bit offset in the TTIR
    variant: str = ""  # the same specialization as this earlier case of the kernel (its shape): one binary
    asm: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return f"{self.kernel}[{self.shape}]"

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("asm")
        return out


def targets_of(text: str) -> list[str]:
    """``sm_90,gfx942`` -> the target names, checked.

    Raises:
        InvalidArgumentError: a name not in :data:`TARGETS`.
    """
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in TARGETS]
    if unknown or not names:
        raise InvalidArgumentError(f"unknown target(s) {unknown or text!r}; known: {', '.join(TARGETS)}")
    return names


@functools.cache
def compiler_kernels(path: str | None = None) -> types.ModuleType:
    """A private copy of a kernel module (default: ``triton_kernels.py``) whose kernels are defined for the
    compiler (JIT functions), whatever ``TRITON_INTERPRET`` says: the interpreter's copy cannot be compiled.

    Raises:
        UnsupportedCapabilityError: triton is not installed or does not import.
    """
    source = Path(path) if path else Path(cache_ops.__file__).with_name("triton_kernels.py")
    spec = importlib.util.spec_from_file_location(f"hisparse_hal._compiled_kernels.{source.stem}", source)
    if spec is None or spec.loader is None:
        raise UnsupportedCapabilityError(f"cannot load kernels from {source}")
    module = importlib.util.module_from_spec(spec)
    triton = _triton()
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = False
        spec.loader.exec_module(module)
    return module


def _triton() -> types.ModuleType:
    try:
        import triton
    except ImportError as exc:
        raise UnsupportedCapabilityError(
            f"hisparse-hal kernels needs triton, which does not import here ({exc}); "
            "pip install -e '.[triton]' from the checkout"
        ) from exc
    return triton


def compiler_ready() -> bool:
    """Whether this process can compile: triton's own library functions (``tl.max``, ``tl.cumsum``) are
    decorated when triton is imported, as interpreter functions if ``TRITON_INTERPRET=1`` was set then."""
    from triton.runtime.jit import JITFunction

    return isinstance(_triton().language.standard.max, JITFunction)


def _specialize(case: KernelCase, target: Any, kernels_file: str | None = None) -> tuple[Any, Any, dict[str, Any]]:
    """(ASTSource, backend, options) exactly as ``JITFunction.run`` builds them for this launch and target."""
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = getattr(compiler_kernels(kernels_file), case.kernel)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = dict(case.launch.constexprs)
    bound, specialization, options = binder(*case.launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return ASTSource(fn, signature, constexprs, attrs), backend, options.__dict__


def _key(source: Any, target: str) -> str:
    return repr((source.name, target, sorted(source.signature.items()), sorted(source.constants.items()),
                 sorted(source.attrs.items())))


def compile_case(case: KernelCase, target: str, kernels_file: str | None = None) -> KernelFacts:
    """Compile ``case`` for ``target`` (a :data:`TARGETS` name) and read the compiled kernel's resources.

    Args:
        kernels_file: the Python file defining ``case.kernel`` (default: the cache ops' ``triton_kernels.py``).

    Returns:
        The facts; a compiler error is a result (``compiled=False`` with the error's text), not an exception.
    """
    import triton
    from triton.backends.compiler import GPUTarget

    facts = KernelFacts(case.kernel, case.op, case.shape, case.production, target, compiled=False)
    gpu = GPUTarget(*TARGETS[target])
    log = io.StringIO()
    try:
        source, _, options = _specialize(case, gpu, kernels_file)
        with (triton.knobs.compilation.scope(), triton.knobs.nvidia.scope(), triton.knobs.runtime.scope(),
              contextlib.redirect_stdout(log)):
            triton.knobs.runtime.interpret = False  # TRITON_INTERPRET=1 (the interpreter tests') must not leak in
            triton.knobs.compilation.always_compile = True  # ptxas runs, so its -v log is this artifact's
            triton.knobs.nvidia.dump_ptxas_log = True
            compiled = triton.compile(source, target=gpu, options=options)
    except Exception as exc:  # the compiler's error is the finding
        facts.error = f"{type(exc).__name__}: {str(exc).strip()[:2000]}"
        return facts
    facts.compiled = True
    facts.asm = dict(compiled.asm)
    facts.shared_bytes = int(compiled.metadata.shared)
    facts.num_warps = int(compiled.metadata.num_warps)
    for kind, text in compiled.asm.items():
        facts.artifact_bytes[kind] = len(text) if isinstance(text, bytes) else len(text.encode())
    if gpu.backend == "cuda":
        _read_ptxas_log(facts, log.getvalue())
    else:
        _read_amdgcn(facts, compiled.asm["amdgcn"])
    facts.i64_multiplies = len(re.findall(r"= mul (?:nuw )?(?:nsw )?i64 ", compiled.asm["llir"]))
    facts.narrow_offsets = narrow_offsets(compiled.asm["ttir"])
    return facts


def _read_ptxas_log(facts: KernelFacts, log: str) -> None:
    """ptxas -v: ``Used N registers``, ``S bytes stack frame, A bytes spill stores, B bytes spill loads``."""
    used = re.search(r"Used (\d+) registers", log)
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if used is None or frame is None:
        facts.error = f"compiled, but no ptxas -v figures in its log: {log.strip()[:500]!r}"
        return
    facts.registers = int(used.group(1))
    stack, stores, loads = (int(frame.group(i)) for i in (1, 2, 3))
    facts.spills = {"stack_frame_bytes": stack, "spill_store_bytes": stores, "spill_load_bytes": loads}
    facts.spill_bytes = stores + loads


def _read_amdgcn(facts: KernelFacts, amdgcn: str) -> None:
    """The code object's metadata (``amdhsa.kernels``): VGPR/SGPR counts and spills, LDS, scratch.

    Triton's AMD launcher passes its LDS as the dynamic group segment, so the static ``group_segment_fixed_size``
    is added to triton's ``shared``, not compared with it. SGPR spills go to VGPR lanes (``v_writelane``), not
    memory; memory spills are VGPR spills, which need scratch (the private segment).
    """
    def field(name: str) -> int:
        found = re.search(rf"^\s*\.{name}:\s+(\d+)\s*$", amdgcn, re.MULTILINE)
        if found is None:
            raise ValueError(f"no .{name} in the AMDGCN metadata")
        return int(found.group(1))

    facts.registers, facts.sgprs = field("vgpr_count"), field("sgpr_count")
    static_lds, scratch = field("group_segment_fixed_size"), field("private_segment_fixed_size")
    facts.shared_bytes = (facts.shared_bytes or 0) + static_lds
    facts.spills = {"vgpr_spill_count": field("vgpr_spill_count"), "sgpr_spill_count": field("sgpr_spill_count"),
                    "private_segment_bytes": scratch, "static_lds_bytes": static_lds}
    facts.spill_bytes = scratch


_ADDPTR = re.compile(r"tt\.addptr %[\w.#]+, (%[\w.#]+) : [^\n]*?, (tensor<[^>]*x(i\d+)[^>]*>|i\d+)")
_CONSTANT = re.compile(r"(%[\w.#]+) = arith\.constant")


def narrow_offsets(ttir: str) -> int:
    """Pointer offsets narrower than 64 bits in a kernel's TTIR, constants aside.

    ``tt.addptr`` sign-extends a 32-bit offset, so a row index times a row size computed in 32 bits would
    show here as an i32 offset; a constant (``ptr + 1``) cannot overflow and is not counted.
    """
    constants = set(_CONSTANT.findall(ttir))
    count = 0
    for match in _ADDPTR.finditer(ttir):
        offset, scalar_or_tensor, element = match.group(1), match.group(2), match.group(3)
        width = element or scalar_or_tensor
        if width != "i64" and offset not in constants:
            count += 1
    return count


def compile_cases(
    cases: Iterable[KernelCase], targets: Sequence[str], kernels_file: str | None = None,
    on_result: Callable[[KernelFacts], None] | None = None,
) -> list[KernelFacts]:
    """:func:`compile_case` for every case and target; a case whose specialization equals an earlier one's
    (same kernel, signature, constexprs and attributes) reuses that result and names its shape in ``variant``.

    In a process whose triton was imported for the interpreter (``TRITON_INTERPRET=1``, as the interpreter
    tests run) the compiles run in a child process without it (:func:`compiler_ready`). ``on_result`` is
    called with each result as it is made (in the child-process case, with all of them at the end).
    """
    cases = list(cases)
    if not compiler_ready():
        done = _compile_in_child(cases, targets, kernels_file)
        for facts in done if on_result else ():
            on_result(facts)  # type: ignore[misc]
        return done
    results: list[KernelFacts] = []
    seen: dict[str, KernelFacts] = {}
    for target in targets:
        for case in cases:
            try:
                key = _key(_specialize(case, _gpu(target), kernels_file)[0], target)
            except Exception:  # specialization failed: compile_case reports the error
                key = f"{case.name}@{target}"
            if key in seen:
                first = seen[key]
                results.append(dataclasses.replace(first, op=case.op, shape=case.shape, production=case.production,
                                                   variant=first.variant or first.shape))
            else:
                seen[key] = facts = compile_case(case, target, kernels_file)
                results.append(facts)
            if on_result is not None:
                on_result(results[-1])
    return results


def _compile_in_child(cases: list[KernelCase], targets: Sequence[str], kernels_file: str | None) -> list[KernelFacts]:
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory(prefix="hisparse-kernels-") as folder:
        request, answer = Path(folder, "request.pickle"), Path(folder, "answer.pickle")
        request.write_bytes(pickle.dumps((cases, list(targets), kernels_file)))
        child = f"import {__name__} as report; report._child({str(request)!r}, {str(answer)!r})"
        done = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not answer.exists():
            raise UnsupportedCapabilityError(
                f"compiling in a child process without TRITON_INTERPRET failed (rc {done.returncode}): "
                f"{done.stderr.strip()[-2000:]}"
            )
        results: list[KernelFacts] = pickle.loads(answer.read_bytes())  # our own child's file, just written
    return results


def _gpu(target: str) -> Any:
    from triton.backends.compiler import GPUTarget

    return GPUTarget(*TARGETS[target])


# --------------------------------------------------------------------------------------------- presentation
def format_table(results: Sequence[KernelFacts]) -> str:
    """One line per kernel case and target."""
    head = (f"{'kernel [shape]':<62} {'target':<7} {'result':<8} {'shared':>7} {'warps':>5} {'regs':>5} "
            f"{'sgpr':>5} {'spill B':>7} {'i64 mul':>7} {'i32 off':>7} {'binary B':>9}  note")
    lines = [head, "-" * len(head)]
    for f in results:
        binary = f.artifact_bytes.get("cubin", f.artifact_bytes.get("hsaco"))
        cells = [f.shared_bytes, f.num_warps, f.registers, f.sgprs, f.spill_bytes, f.i64_multiplies,
                 f.narrow_offsets, binary]
        shown = ["-" if c is None else str(c) for c in cells]
        note = f.error.splitlines()[0][:160] if f.error else (f"same binary as [{f.variant}]" if f.variant else "")
        if f.spills.get("sgpr_spill_count"):
            note = (note + "; " if note else "") + f"{f.spills['sgpr_spill_count']} SGPR spills (to VGPR lanes)"
        lines.append(f"{f.name[:62]:<62} {f.target:<7} {'ok' if f.compiled else 'FAILED':<8} {shown[0]:>7} "
                     f"{shown[1]:>5} {shown[2]:>5} {shown[3]:>5} {shown[4]:>7} {shown[5]:>7} {shown[6]:>7} "
                     f"{shown[7]:>9}  {note}")
    return "\n".join(lines)


def summary(results: Sequence[KernelFacts]) -> dict[str, Any]:
    """Per target: cases compiled/failed, the largest shared memory, registers and spill bytes."""
    out: dict[str, Any] = {}
    for target in dict.fromkeys(f.target for f in results):
        mine = [f for f in results if f.target == target]
        ok = [f for f in mine if f.compiled]
        out[target] = {
            "cases": len(mine), "compiled": len(ok), "failed": [f.name for f in mine if not f.compiled],
            "max_shared_bytes": max((f.shared_bytes or 0 for f in ok), default=None),
            "shared_limit_bytes": SHARED_LIMIT_BYTES[target],
            "max_registers": max((f.registers or 0 for f in ok), default=None),
            "max_spill_bytes": max((f.spill_bytes or 0 for f in ok), default=None),
            "narrow_offsets": sum(f.narrow_offsets or 0 for f in ok),
        }
    return out


_SUFFIX = {"ptx": "ptx", "amdgcn": "amdgcn", "llir": "ll", "ttgir": "ttgir"}


def dump(results: Sequence[KernelFacts], folder: Path) -> list[str]:
    """Write PTX (+ SASS via cuobjdump when present) and AMDGCN (+ LLVM IR, TTGIR) per compiled kernel.

    Returns:
        Notes for the user (e.g. that SASS was not written because cuobjdump is missing).
    """
    folder.mkdir(parents=True, exist_ok=True)
    cuobjdump = _cuobjdump()
    notes = [] if cuobjdump else ["cuobjdump not found: PTX only for NVIDIA targets, no SASS"]
    for f in results:
        if not f.compiled or f.variant:
            continue
        stem = folder / f.target / re.sub(r"[^\w.=-]+", "_", f.name).strip("_")
        stem.parent.mkdir(parents=True, exist_ok=True)
        for kind, suffix in _SUFFIX.items():
            if kind in f.asm:
                stem.with_name(f"{stem.name}.{suffix}").write_text(f.asm[kind])
        if "cubin" in f.asm and cuobjdump:
            with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
                cubin.write(f.asm["cubin"])
                cubin.flush()
                sass = subprocess.run([cuobjdump, "-sass", cubin.name], capture_output=True, text=True, check=False)
            stem.with_name(f"{stem.name}.sass").write_text(sass.stdout or sass.stderr)
    return notes


def _cuobjdump() -> str | None:
    try:
        from triton.backends.nvidia import compiler as nvidia

        bundled = Path(nvidia.__file__).with_name("bin") / "cuobjdump"
        if bundled.exists():
            return str(bundled)
    except ImportError:
        pass
    return shutil.which("cuobjdump")


# --------------------------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``kernels`` subcommand's options."""
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help=f"comma-separated compile targets (default {','.join(TARGETS)})")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write every result and a summary as JSON")
    parser.add_argument("--dump", default=None, metavar="DIR", help="write PTX/SASS and AMDGCN per kernel and target")
    parser.add_argument("--production-only", action="store_true",
                        help="only the production shapes (skip the lane-boundary top-k values)")
    parser.add_argument("--page", default=None, metavar="FILE",
                        help="rewrite the generated part of FILE (docs/kernels.md) from this run's --json document")
    parser.add_argument("--from-json", default=None, metavar="FILE",
                        help="with --page: render a --json document written earlier instead of compiling")
    parser.add_argument("--against-device", action="store_true",
                        help="on a GPU machine: compile through triton's runtime for this device and compare with "
                             "the offline compile for its target (shared memory, registers, spills)")


@contextlib.contextmanager
def quiet_triton() -> Iterator[None]:
    """Triton 3.9 warns that TRITON_DEFAULT_FP_FUSION is unset; the kernels have no floating-point math."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")
        yield


def _child(request: str, answer: str) -> None:
    """The child of :func:`_compile_in_child`: compile the pickled (cases, targets, file), pickle the results."""
    cases, targets, kernels_file = pickle.loads(Path(request).read_bytes())
    with quiet_triton():
        Path(answer).write_bytes(pickle.dumps(compile_cases(cases, targets, kernels_file)))
