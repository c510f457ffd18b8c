"""The CUDA probe (``vendors/cuda/spec.py`` over ``nvml.py``): one reason per way of being unavailable, facts from
NVML, no device context.

NVML is replaced by a fake ``pynvml`` module (injected into ``sys.modules``) and torch's build by
patching ``torch.version``; the last test runs the real probe in a fresh process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from typing import Any

import pytest
import torch

from hisparse_hal.vendors.cuda import spec
from hisparse_hal.vendors.cuda.nvml import visible_indices

UUIDS = ["GPU-aaaa1111-0000", "GPU-bbbb2222-0000", "GPU-cccc3333-0000"]


class FakeNvmlError(Exception):
    pass


def fake_pynvml(
    *,
    driver: int = 12080,
    gpus: list[tuple[str, tuple[int, int]]] | None = None,
    init_error: str | None = None,
) -> types.ModuleType:
    """A stand-in for ``pynvml`` that records init/shutdown."""
    gpus = (
        gpus
        if gpus is not None
        else [("NVIDIA H200", (9, 0)), ("NVIDIA A100-SXM4-80GB", (8, 0)), ("NVIDIA L40S", (8, 9))]
    )
    module: Any = types.ModuleType("pynvml")  # a stand-in whose attributes are set below
    state: dict[str, Any] = {"init": 0, "shutdown": 0}
    module.state = state
    module.NVMLError = FakeNvmlError

    def init() -> None:
        state["init"] += 1
        if init_error:
            raise FakeNvmlError(init_error)

    def shutdown() -> None:
        state["shutdown"] += 1

    module.nvmlInit = init
    module.nvmlShutdown = shutdown
    module.nvmlSystemGetCudaDriverVersion = lambda: driver
    module.nvmlSystemGetDriverVersion = lambda: "570.86.15"
    module.nvmlDeviceGetCount = lambda: len(gpus)
    module.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    module.nvmlDeviceGetUUID = lambda h: UUIDS[h[1]]
    module.nvmlDeviceGetName = lambda h: gpus[h[1]][0].encode()  # older bindings return bytes
    module.nvmlDeviceGetCudaComputeCapability = lambda h: gpus[h[1]][1]
    return module


@pytest.fixture
def cuda_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend torch is a CUDA 12.8 build."""
    monkeypatch.setattr(torch.version, "cuda", "12.8", raising=False)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def install(monkeypatch: pytest.MonkeyPatch, module: types.ModuleType | None) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", module)  # None makes ``import pynvml`` fail


def test_probe_explains_a_cpu_build_of_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", None, raising=False)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    result = spec.probe()
    assert not result.available
    assert result.reason == f"torch {torch.__version__} is a CPU build (torch.version.cuda is None)"


def test_probe_explains_a_rocm_build_of_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", None, raising=False)
    monkeypatch.setattr(torch.version, "hip", "7.2.1", raising=False)
    result = spec.probe()
    assert not result.available
    assert result.reason.endswith("is a ROCm build (HIP 7.2.1), not CUDA")


def test_probe_explains_missing_nvml_bindings(monkeypatch: pytest.MonkeyPatch, cuda_torch: None) -> None:
    install(monkeypatch, None)
    result = spec.probe()
    assert not result.available
    assert "NVML bindings are not installed" in result.reason
    assert "pip install -e '.[cuda]'" in result.reason and "nvidia-ml-py" in result.reason


def test_probe_explains_an_nvml_failure(monkeypatch: pytest.MonkeyPatch, cuda_torch: None) -> None:
    install(monkeypatch, fake_pynvml(init_error="Driver Not Loaded"))
    result = spec.probe()
    assert not result.available
    assert (
        result.reason == "NVML could not read the GPUs (FakeNvmlError: Driver Not Loaded); is the NVIDIA driver loaded?"
    )


def test_probe_reports_devices_archs_and_versions(monkeypatch: pytest.MonkeyPatch, cuda_torch: None) -> None:
    nvml = fake_pynvml()
    install(monkeypatch, nvml)
    result = spec.probe()
    assert result.available, result.reason
    assert result.reason == (
        "3 NVIDIA GPU(s) visible: NVIDIA H200 (sm_90), NVIDIA A100-SXM4-80GB (sm_80), NVIDIA L40S (sm_89); "
        "driver CUDA 12.8, torch CUDA 12.8"
    )
    facts = result.facts
    assert facts["driver_version"] == 12080 and facts["driver"] == "12.8"
    assert facts["nvidia_driver"] == "570.86.15"
    assert facts["archs"] == ["sm_80", "sm_89", "sm_90"]
    assert [d["name"] for d in facts["devices"]] == ["NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S"]
    assert facts["devices"][0] == {
        "index": 0,
        "nvml_index": 0,
        "name": "NVIDIA H200",
        "arch": "sm_90",
        "uuid": UUIDS[0],
    }
    assert nvml.state == {"init": 1, "shutdown": 1}
    json.dumps(facts)  # facts are JSON-ready for `hisparse-hal info --json`


def test_probe_honours_cuda_visible_devices_indices_and_uuids(
    monkeypatch: pytest.MonkeyPatch, cuda_torch: None
) -> None:
    install(monkeypatch, fake_pynvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-aaaa")
    facts = spec.probe().facts
    assert [(d["index"], d["nvml_index"], d["arch"]) for d in facts["devices"]] == [(0, 2, "sm_89"), (1, 0, "sm_90")]
    assert facts["CUDA_VISIBLE_DEVICES"] == "2,GPU-aaaa"


@pytest.mark.parametrize("value", ["", "-1", "7", "GPU-ffff"])
def test_probe_explains_that_cuda_visible_devices_hides_every_gpu(
    monkeypatch: pytest.MonkeyPatch, cuda_torch: None, value: str
) -> None:
    nvml = fake_pynvml()
    install(monkeypatch, nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    result = spec.probe()
    assert not result.available
    assert result.reason == f"no CUDA device is visible: CUDA_VISIBLE_DEVICES={value!r} hides all 3 NVIDIA GPUs"
    assert nvml.state["shutdown"] == 1


def test_probe_explains_a_machine_without_nvidia_gpus(monkeypatch: pytest.MonkeyPatch, cuda_torch: None) -> None:
    install(monkeypatch, fake_pynvml(gpus=[]))
    result = spec.probe()
    assert not result.available
    assert result.reason == "no CUDA device is visible: NVML reports no NVIDIA GPU"


def test_probe_explains_a_driver_older_than_cuda_12(monkeypatch: pytest.MonkeyPatch, cuda_torch: None) -> None:
    install(monkeypatch, fake_pynvml(driver=11080))
    result = spec.probe()
    assert not result.available
    assert result.reason.startswith("the NVIDIA driver supports CUDA 11.8 (driver 570.86.15), older than the CUDA 12.0")
    assert result.facts["driver_version"] == 11080


def test_probe_explains_a_driver_older_than_torchs_cuda_major(
    monkeypatch: pytest.MonkeyPatch, cuda_torch: None
) -> None:
    monkeypatch.setattr(torch.version, "cuda", "13.0", raising=False)
    install(monkeypatch, fake_pynvml(driver=12090))
    result = spec.probe()
    assert not result.available
    assert "is built for CUDA 13.0 but the driver only supports CUDA 12.9" in result.reason


def test_probe_accepts_an_older_minor_driver_of_the_same_major(
    monkeypatch: pytest.MonkeyPatch, cuda_torch: None
) -> None:
    install(monkeypatch, fake_pynvml(driver=12040))  # minor-version compatibility: torch cu128 on a 12.4 driver
    result = spec.probe()
    assert result.available and "driver CUDA 12.4, torch CUDA 12.8" in result.reason


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, [0, 1, 2]),
        ("", []),
        ("-1", []),
        ("1", [1]),
        ("2,0", [2, 0]),
        ("0,-1,2", [0]),          # parsing stops at the first invalid entry
        ("0,5,1", [0]),
        ("1,1", [1]),             # a repeat is invalid
        ("GPU-bbbb", [1]),        # unique UUID prefix
        ("GPU-", []),             # ambiguous prefix
        (" 2 , GPU-cccc3333-0000 ", [2]),  # GPU-cccc is already listed as 2: stops
        ("MIG-1234", []),
    ],
)
def test_visible_indices_follow_cuda_parsing(value: str | None, expected: list[int]) -> None:
    assert visible_indices(value, UUIDS) == expected


def test_import_and_probe_create_no_cuda_context_and_load_no_driver_binding(tmp_path: Any) -> None:
    code = (
        "import sys, json, torch\n"
        "import hisparse_hal.vendors.cuda as cuda\n"
        "from hisparse_hal.vendors.cuda.spec import probe\n"
        "from hisparse_hal import probe_backends\n"
        "p = probe(); probe_backends()\n"
        "print(json.dumps({'initialized': torch.cuda.is_initialized(),\n"
        "  'driver_loaded': 'hisparse_hal.vendors.cuda.runtime' in sys.modules,\n"
        "  'backend_loaded': 'hisparse_hal.vendors.cuda.backend' in sys.modules,\n"
        "  'reason': p.reason, 'plan': cuda.plan_capabilities.__module__}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    # GPU-run check: always False on a CPU build of torch, where the probe stops at "CPU build"; it is the real
    # test on a CUDA machine (ci/gpu-check.sh). Here the claim is proven against the simulated driver below.
    assert report["initialized"] is False
    assert report["driver_loaded"] is False and report["backend_loaded"] is False
    assert report["plan"] == "hisparse_hal.vendors.cuda.capabilities"
    assert report["reason"]


# ----------------------------------------------------------------------------- no device context, proven here
#: Driver calls that create or make current a CUDA context (cuInit initialises the driver for them).
CONTEXT_CALLS = ("cuInit", "cuCtxCreate", "cuDevicePrimaryCtxRetain", "cuCtxPushCurrent")


def _context_calls_during_probe(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Probe and select with torch looking like a CUDA 12.8 build, NVML showing three GPUs and libcuda replaced by
    the simulated driver; the context-creating calls the driver saw and torch's CUDA lazy inits, by name."""
    from hisparse_hal import probe_backends, select_backend
    from hisparse_hal.testing.sim_cuda_driver import SimulatedCudaDriver
    from hisparse_hal.vendors.cuda import runtime as driver

    install(monkeypatch, fake_pynvml())
    simulated = SimulatedCudaDriver()
    monkeypatch.setattr(driver, "load_libcuda", lambda *args, **kwargs: simulated)
    lazy_inits = []
    monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: lazy_inits.append("torch.cuda._lazy_init"))
    monkeypatch.setattr(torch.cuda, "init", lambda: lazy_inits.append("torch.cuda.init"))
    result = spec.probe()
    assert result.available, f"the probe stopped before the vendor code: {result.reason}"
    results = probe_backends()
    assert select_backend("cuda", results).chosen is not None
    counts = {name: len(simulated.calls_to(name)) for name in CONTEXT_CALLS}
    counts["torch lazy init"] = len(lazy_inits)
    return counts


def _assert_no_context_calls(counts: dict[str, int]) -> None:
    made = {name: n for name, n in counts.items() if n}
    assert not made, f"probing and selecting made context-creating calls: {made}"


def test_probe_and_selection_on_a_cuda_build_make_no_context_creating_call(
    monkeypatch: pytest.MonkeyPatch, cuda_torch: None,
) -> None:
    counts = _context_calls_during_probe(monkeypatch)
    assert set(counts) == {*CONTEXT_CALLS, "torch lazy init"}
    _assert_no_context_calls(counts)


def test_context_count_catches_a_probe_that_retains_the_primary_context(
    monkeypatch: pytest.MonkeyPatch, cuda_torch: None,
) -> None:
    """Planted bug: the probe asks the driver for its version and a context (as ``torch.cuda.init()`` would)."""
    from hisparse_hal.vendors.cuda.runtime import CudaDriver

    real_read = spec.read_nvml

    def read_and_touch_the_driver(*args: Any, **kwargs: Any) -> Any:
        touched = CudaDriver(0)
        touched.driver_version()
        touched._primary_context()
        return real_read(*args, **kwargs)

    monkeypatch.setattr(spec, "read_nvml", read_and_touch_the_driver)
    with pytest.raises(AssertionError, match="cuDevicePrimaryCtxRetain"):
        _assert_no_context_calls(_context_calls_during_probe(monkeypatch))
