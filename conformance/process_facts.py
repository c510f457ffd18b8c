"""What each test process of a conformance run tested: the built backend's facts (class, device and its name and
driver, capabilities), the environment's, and the hand-over between processes: an xdist worker publishes its facts
beside the gate file at once, and the controller gathers every worker's into the run's list of processes, which the
report cross-checks (``run_record.device_mismatch``)."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from . import run_record
from .expectations import backend_architectures
from .resolved_run import ResolvedRun

__all__ = ["backend_facts", "device_identity_of", "environment_facts", "publish_worker_facts", "published_facts",
           "record_processes"]


def backend_facts(backend: Any) -> dict[str, Any]:
    """JSON-ready facts of a constructed backend: class, device, capabilities, architectures."""
    caps = backend.capabilities
    return {
        "backend_name": backend.name,
        "backend_class": f"{type(backend).__module__}:{type(backend).__qualname__}",
        "device": str(backend.device),
        "capabilities": caps.as_dict(),
        "architectures": list(backend_architectures(caps.versions, {})),
    }


def device_identity_of(backend: Any, probe_facts: dict[str, Any]) -> dict[str, str | None]:
    """``run.device`` of the built backend (see :func:`run_record.device_identity`); torch names a GPU only
    when the probe facts and ``capabilities.versions`` do not."""
    device = str(backend.device)
    versions = dict(backend.capabilities.versions)
    torch_name = None
    gpu = run_record.device_identity(device, versions, probe_facts)
    if device != "cpu" and not gpu["name"]:
        import torch

        try:
            where = torch.device(device)
            torch_name = torch.get_device_module(where).get_device_name(where)
        except (RuntimeError, AssertionError, ValueError, AttributeError):  # a device module without names
            torch_name = None
    return run_record.device_identity(device, versions, probe_facts, torch_name)


def environment_facts(run: ResolvedRun) -> dict[str, Any]:
    """Facts that make a run reproducible without constructing the backend (from what the run resolved)."""
    import torch

    facts = run.probe_facts()
    return {
        "recipe": run.recipe.describe(),
        "probe": {k: v for k, v in facts.items()},
        "torch": torch.__version__,
        "torch_cuda": getattr(torch.version, "cuda", None),
        "torch_hip": getattr(torch.version, "hip", None),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("HISPARSE_")},
        "architectures": list(backend_architectures({}, facts)),
    }


def publish_worker_facts(gate_file: str, worker: str, facts: Mapping[str, Any]) -> None:
    """Leave an xdist worker's backend facts beside the gate file (atomically), so that the controller's report
    names the device and capabilities even when the run is interrupted before any worker ends."""
    target = Path(gate_file).with_name(f"facts-{worker}.json")
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(dict(facts), default=str), encoding="utf-8")
    os.replace(tmp, target)


def published_facts(gate_file: str | None) -> list[dict[str, Any]]:
    """The backend facts the xdist workers published beside ``gate_file``, in worker order (empty: none yet)."""
    if not gate_file:
        return []
    found = []
    for path in sorted(Path(gate_file).parent.glob("facts-*.json")):
        try:
            found.append(dict(json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError):
            continue
    return found


def record_processes(processes: dict[str, dict[str, Any]],
                     facts_seen: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Add to ``processes`` (label -> :func:`run_record.process_identity`) every process whose backend facts carry
    its label (``process``) and a built backend; returns ``processes``."""
    for facts in facts_seen:
        if facts.get("process") and facts.get("backend_class"):
            processes[str(facts["process"])] = run_record.process_identity(facts)
    return processes
