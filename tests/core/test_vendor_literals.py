"""The core names no vendor: every vendor-name literal outside ``hisparse_hal/vendors`` and ``hisparse_hal/testing``
(a string constant such as ``"cuda"``/``"hip"``/``"rocm"``, or ``torch.cuda`` / ``torch.version.cuda|hip`` /
``torch.xpu``) is listed below with its reason, and a new one fails naming its file and line. The core asks the
backend specs instead (``BackendSpec.device_type``, ``torch_build``, ``compiles_triton``, ...).
"""

from __future__ import annotations

from collections import Counter

from tests.core.vendor_literals import Literal, core_literals, core_modules, literals_in_source

_VLLM_KINDS = ("vLLM's vocabulary: its platform kinds read through Platform.is_rocm/is_cuda/is_cpu "
               "(vllm/platforms/interface.py:196-226, PlatformEnum :71-78)")
_ADAPTERS = ("our built-in backend names as the public adapter classes vLLM builds (their qualnames are what users "
             "configure); a backend from another distribution is reached through AutoHiSparseBackend and "
             "HISPARSE_HAL_BACKEND, with no edit here")
_TRITON = ("Triton's vocabulary: GPUTarget.backend is 'cuda' or 'hip' (triton/backends/compiler.py GPUTarget; "
           "third_party/nvidia|amd/backend/compiler.py supports_target); the offline kernel tools compile for named "
           "targets, never choose a device at run time")
_SIMULATED = ("the submission benchmark times the CUDA backend's own per-call path over the simulated libcuda "
              "(hisparse_hal/testing/sim_cuda_driver.py); the device it labels is that vendor's")
_NVCC = ("bench --vllm-kernels compiles vLLM 0.34.0's csrc/hisparse_kernels.cu with nvcc, which only a CUDA build of "
         "torch can load (vLLM's kernels are CUDA-only: csrc/torch_bindings.cpp)")
_VLLM_GRAPH = ("vLLM's vocabulary: vLLM 0.34.0 captures through torch.cuda.graph on a side stream "
               "(vllm/v1/worker/gpu_model_runner.py), which the vLLM contract view reproduces")
_REPORT = ("a public report field (results.json environment.torch_cuda/torch_hip and the header line): the torch "
           "build as torch.version spells it; renaming it changes the report")

#: ``(module, enclosing function or assigned name, literal) -> (how many, why)``.
ALLOWED: dict[tuple[str, str, str], tuple[int, str]] = {
    ("hisparse_hal.integrations.vllm", "Kind", "'cuda'"): (1, _VLLM_KINDS),
    ("hisparse_hal.integrations.vllm", "Kind", "'rocm'"): (1, _VLLM_KINDS),
    ("hisparse_hal.integrations.vllm", "_platform_kind", "'cuda'"): (1, _VLLM_KINDS),
    ("hisparse_hal.integrations.vllm", "_platform_kind", "'rocm'"): (1, _VLLM_KINDS),
    ("hisparse_hal.integrations.vllm", "blockers", "'rocm'"): (1, _VLLM_KINDS),
    ("hisparse_hal.integrations.vllm", "register", "'rocm'"): (1, _VLLM_KINDS),
    ("hisparse_hal.integrations.vllm", "decide", "'rocm'"): (
        3, f"two are {_VLLM_KINDS}; one is our backend of the same name, the one vLLM's ROCm platform gets when its "
           "attention routes through HiSparse (the ROCm route itself is vLLM's: vllm/platforms/rocm.py:543-544)"),
    ("hisparse_hal.integrations.vllm", "_ADAPTER_CLASSES", "'cuda'"): (1, _ADAPTERS),
    ("hisparse_hal.integrations.vllm", "_ADAPTER_CLASSES", "'rocm'"): (1, _ADAPTERS),
    ("hisparse_hal.integrations.vllm_backend", "ADAPTERS", "'cuda'"): (1, _ADAPTERS),
    ("hisparse_hal.integrations.vllm_backend", "ADAPTERS", "'rocm'"): (1, _ADAPTERS),
    ("hisparse_hal.integrations.vllm_backend", "CudaHiSparseBackend", "'cuda'"): (1, _ADAPTERS),
    ("hisparse_hal.integrations.vllm_backend", "RocmHiSparseBackend", "'rocm'"): (1, _ADAPTERS),
    ("hisparse_hal.kernels.report", "TARGETS", "'cuda'"): (2, _TRITON),
    ("hisparse_hal.kernels.report", "TARGETS", "'hip'"): (2, _TRITON),
    ("hisparse_hal.kernels.report", "compile_case", "'cuda'"): (
        1, f"{_TRITON}; a 'cuda' target's compile log is ptxas's, a 'hip' one's is amdgcn"),
    ("hisparse_hal.kernels.device_check", "device_target", "'cuda'"): (1, _TRITON),
    ("hisparse_hal.conformance.vllm_contract", "VllmContractView.capture", "torch.cuda"): (6, _VLLM_GRAPH),
    ("hisparse_hal.conformance.vllm_contract", "graph_capture_available", "'cuda'"): (1, _VLLM_GRAPH),
    ("hisparse_hal.conformance.vllm_contract", "graph_capture_available", "torch.cuda"): (1, _VLLM_GRAPH),
    ("hisparse_hal.conformance.process_facts", "environment_facts", "'cuda'"): (1, _REPORT),
    ("hisparse_hal.conformance.process_facts", "environment_facts", "'hip'"): (1, _REPORT),
    ("hisparse_hal.conformance.plugin", "pytest_report_header", "'hip'"): (1, _REPORT),
    ("hisparse_hal.conformance.plugin", "pytest_report_header", "torch.version.cuda"): (1, _REPORT),
    # bench/: the simulated-vendor benchmark and vLLM's CUDA-only kernels.
    ("hisparse_hal.bench.submission", "bench_submission", "'cuda'"): (1, _SIMULATED),
    ("hisparse_hal.bench.vllm_extension", "build", "torch.version.cuda"): (3, _NVCC),
}


def unlisted(found: list[Literal], allowed: dict[tuple[str, str, str], tuple[int, str]]) -> list[str]:
    """``file:line: literal (in scope)`` for each literal beyond what ``allowed`` lists for its key (all of a
    key's occurrences are named when it has more than allowed, since any one of them may be the new one)."""
    counts = Counter(lit.key for lit in found)
    over = {key for key, count in counts.items() if count > allowed.get(key, (0, ""))[0]}
    return [f"{lit.path}:{lit.line}: {lit.text} (in {lit.scope})" for lit in found if lit.key in over]


def test_the_walk_finds_constants_attributes_and_their_scope():
    source = (
        "import torch\n"
        "KINDS = ('cuda', 'other')\n"
        "def pick(device):\n"
        "    if device.type == 'HIP':\n"
        "        torch.cuda.synchronize()\n"
        "    return torch.version.hip or 'the cuda device'\n"
    )
    found = [(lit.line, lit.scope, lit.text) for lit in literals_in_source(source, "m.py")]
    assert sorted(found) == [(2, "KINDS", "'cuda'"), (4, "pick", "'HIP'"), (5, "pick", "torch.cuda"),
                             (6, "pick", "torch.version.hip")]


def test_a_new_literal_fails_naming_its_file_and_line():
    found = list(literals_in_source("def f(d):\n    return d.type == 'cuda'\n", "hisparse_hal/new.py",
                                    "hisparse_hal.new"))
    assert unlisted(found, {}) == ["hisparse_hal/new.py:2: 'cuda' (in f)"]
    assert unlisted(found, {("hisparse_hal.new", "f", "'cuda'"): (1, "why")}) == []
    twice = list(literals_in_source("def f(d):\n    return d == 'rocm' or d == 'rocm'\n", "x.py"))
    assert unlisted(twice, {("x.py", "f", "'rocm'"): (1, "why")}) == ["x.py:2: 'rocm' (in f)"] * 2


def test_the_core_has_no_unlisted_vendor_literal():
    problems = unlisted(core_literals(), ALLOWED)
    assert not problems, "vendor names in the core (ask the backend spec instead, or list it here with a reason):\n" \
        + "\n".join(problems)


def test_every_allowed_entry_is_still_there_and_has_a_reason():
    counts = Counter(lit.key for lit in core_literals())
    stale = {key: (allowed, counts.get(key, 0)) for key, (allowed, _) in ALLOWED.items()
             if counts.get(key, 0) != allowed}
    assert not stale, f"allow-list entries whose count changed (shrink or drop them): {stale}"
    assert all(reason.strip() for _, reason in ALLOWED.values())


def test_the_sites_that_asked_for_a_vendor_now_ask_the_spec():
    # probing, cache_ops selection/triton_impl/library, cli, environment_check and shm_sweep held "cuda"/"hip" tests.
    modules = {lit.module for lit in core_literals()}
    for module in ("probing", "cli", "environment_check", "shm_sweep", "cache_ops.selection", "cache_ops.triton_impl",
                   "cache_ops.library"):
        assert f"hisparse_hal.{module}" not in modules
    assert "hisparse_hal.cli" in core_modules() and "hisparse_hal.vendors.cuda.spec" not in core_modules()
