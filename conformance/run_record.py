"""The facts that make a conformance report checkable after the fact (results.json format 2): when and where it
ran, on which device and driver, with which hisparse-hal commit, which contract, which backend build, and whether
its expectations file is the vendor's committed one.

Invariant: every value is read from the run's own process, its probe facts or the backend's ``capabilities``;
nothing is guessed from a vendor name. A fact that cannot be read is null, never invented.
"""

from __future__ import annotations

import datetime
import platform
import socket
import subprocess
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from .contracts import HAL_CONTRACT, Contract, contract_named
from .mustpass import file_sha256

__all__ = [
    "FORMAT",
    "utc_iso",
    "checkout_commit",
    "cpu_model_name",
    "device_identity",
    "package_version",
    "build_versions",
    "contract_of",
    "backend_under_test",
    "expectations_record",
    "run_block",
    "process_identity",
    "device_mismatch",
]

#: The ``format`` of the results.json this package writes.
FORMAT = 2


def utc_iso(timestamp: float | None) -> str | None:
    """``timestamp`` (seconds since the epoch) as ISO 8601 UTC, seconds precision; None stays None."""
    if timestamp is None:
        return None
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).isoformat(timespec="seconds")


def checkout_commit(where: Path | None = None) -> str | None:
    """The git sha of the checkout ``where`` (default: the installed hisparse_hal package) lies in, with
    `` (dirty)`` when it has changes; None when it is not a git checkout or git is missing."""
    import hisparse_hal

    folder = where or Path(hisparse_hal.__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=30)
        if sha.returncode != 0:
            return None
        status = subprocess.run(["git", "-C", str(folder), "status", "--porcelain"], capture_output=True, text=True,
                                timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = " (dirty)" if status.returncode != 0 or status.stdout.strip() else ""
    return sha.stdout.strip() + dirty


def cpu_model_name() -> str | None:
    """The CPU's model (``/proc/cpuinfo`` "model name", else ``platform.processor()``); None when unknown."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def _gpu_from_probe(probe_facts: Mapping[str, Any], index: int) -> Mapping[str, Any] | None:
    """The probe's record of the GPU with CUDA/HIP ordinal ``index``: CUDA's ``devices`` (NVML: ``index``,
    ``name``) or ROCm's ``visible_gpus`` (``hip_index``, ``name``)."""
    for key, ordinal in (("devices", "index"), ("visible_gpus", "hip_index")):
        listed = probe_facts.get(key)
        if isinstance(listed, list) and listed:
            chosen = [d for d in listed if isinstance(d, Mapping) and d.get(ordinal) == index]
            return chosen[0] if chosen else (listed[0] if isinstance(listed[0], Mapping) else None)
    return None


def device_identity(device: str, versions: Mapping[str, Any], probe_facts: Mapping[str, Any],
                    torch_name: str | None = None) -> dict[str, str | None]:
    """``run.device``: ``{"type", "name", "driver"}`` of the backend's device.

    CPU: the CPU model, no driver. GPU: the name from the probe's device list (CUDA ``devices[].name`` from
    NVML, ROCm ``visible_gpus[].name``), else ``capabilities.versions["product"]`` (ROCm), else ``torch_name``
    (torch's name of the device, read by the caller); the driver from the probe facts ``nvidia_driver`` (NVML's
    driver version) or ``driver_version`` (amdsmi's), else ``capabilities.versions["driver"]`` (the CUDA driver
    API version) or ``versions["hip_runtime"]``.
    """
    kind, _, index_text = device.partition(":")
    if kind == "cpu":
        return {"type": "cpu", "name": cpu_model_name(), "driver": None}
    index = int(index_text) if index_text.isdigit() else 0
    gpu = _gpu_from_probe(probe_facts, index) or {}
    name = gpu.get("name") or versions.get("product") or torch_name
    driver = (probe_facts.get("nvidia_driver") or probe_facts.get("driver_version") or versions.get("driver")
              or versions.get("hip_runtime"))
    return {"type": kind, "name": str(name) if name else None, "driver": str(driver) if driver else None}


def package_version(qualname: str | None) -> str | None:
    """The installed version of the distribution that provides the module of ``qualname`` (``module:Class``)."""
    if not qualname:
        return None
    top = qualname.partition(":")[0].split(".")[0]
    names = metadata.packages_distributions().get(top) or [top]
    for name in names:
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return None


def build_versions(qualname: str | None, versions: Mapping[str, Any] | None) -> dict[str, Any]:
    """``backend_under_test.build``: the providing package's version and the runtime versions the backend
    reports (``capabilities.versions``)."""
    return {"package": package_version(qualname), "versions": dict(versions or {})}


def contract_of(run: Any) -> Contract:
    """The contract a resolved run tests: its ``contract`` (a :class:`Contract` or an id), else hisparse-hal's."""
    found = getattr(run, "contract", None)
    if isinstance(found, Contract):
        return found
    if isinstance(found, str):
        return contract_named(found)
    return HAL_CONTRACT


def backend_under_test(recipe: Any, facts: Mapping[str, Any]) -> dict[str, Any]:
    """``backend_under_test``: how it was named (registry, factory or a vLLM class), its label, the built
    object's ``module:Class`` and its build."""
    qualname = facts.get("backend_class") or recipe.vllm_class or recipe.factory
    versions = (facts.get("capabilities") or {}).get("versions")
    return {"kind": recipe.kind, "label": recipe.describe(), "qualname": qualname,
            "build": build_versions(qualname, versions)}


def expectations_record(path: str | None, vendor_path: str | None) -> dict[str, Any]:
    """The ``expectations`` facts verify reads: the used file's sha256, the vendor's installed file and whether
    the used file is byte for byte the vendor's committed one."""
    digest = file_sha256(path) if path and Path(path).is_file() else None
    vendor_digest = file_sha256(vendor_path) if vendor_path and Path(vendor_path).is_file() else None
    return {"sha256": digest, "vendor_file": vendor_path,
            "committed": bool(digest and vendor_digest and digest == vendor_digest)}


def run_block(started: float, finished: float | None, device: Mapping[str, Any], version: str | None,
              commit: str | None) -> dict[str, Any]:
    """``run``: the dates, the package version and commit, the host, the device, Python and torch."""
    import torch

    return {"started": utc_iso(started), "finished": utc_iso(finished), "hisparse_hal_version": version,
            "commit": commit, "host": socket.gethostname(), "device": dict(device),
            "python": platform.python_version(), "torch": torch.__version__}


#: The backend facts every process of one run must agree on (SYCL-CTS's cross-check of each test executable's
#: device dump, ``run_conformance_tests.py``): which class, on which device, claiming what.
IDENTITY_KEYS = ("backend_class", "device", "device_identity", "capabilities")


def process_identity(backend_facts: Mapping[str, Any]) -> dict[str, Any]:
    """What one test process's backend facts say it tested (:data:`IDENTITY_KEYS`), JSON-ready."""
    return {key: backend_facts.get(key) for key in IDENTITY_KEYS}


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        flat: dict[str, Any] = {}
        for key, inner in value.items():
            flat.update(_flat(inner, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def device_mismatch(processes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """Whether the run's test processes (xdist workers, a process resumed after a crash) tested one backend on one
    device: None when every identity (:func:`process_identity`) is equal, else ``{"reason", "processes"}`` whose
    reason names the processes and the facts they differ in (a mixed-GPU machine, a ``CUDA_VISIBLE_DEVICES`` or
    ``HIP_VISIBLE_DEVICES`` that differs between workers, a driver updated between a crash and its resume)."""
    if len(processes) < 2:
        return None
    labels = sorted(processes)
    flats = {label: _flat(processes[label]) for label in labels}
    first = flats[labels[0]]
    differing = sorted({key for flat in flats.values() for key in set(first) | set(flat)
                        if flat.get(key) != first.get(key)})
    if not differing:
        return None
    shown = "; ".join(
        f"{key}: " + ", ".join(f"{label} {flats[label].get(key)!r}" for label in labels) for key in differing[:3]
    ) + (f"; and {len(differing) - 3} more facts" if len(differing) > 3 else "")
    return {"reason": f"the test processes did not test one backend on one device ({len(labels)} processes: "
                      f"{', '.join(labels)}): {shown}",
            "processes": {label: dict(processes[label]) for label in labels}}
