"""AMD GPUs read from the KFD sysfs topology, for where amdsmi is missing or fails (containers, WSL).

``/sys/class/kfd/kfd/topology/nodes/<n>/properties`` holds ``key value`` lines; GPU nodes have
``simd_count > 0`` and a ``gfx_target_version`` (major*10000 + minor*100 + stepping). ROCr enumerates
GPUs in this node order (vLLM #40081, #46110 fall back the same way). Invariant: reads files only.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .visible_devices import GpuDevice

__all__ = ["KFD_NODES", "KfdTopology", "read_kfd_topology", "gfx_name"]

#: Where the topology lives below the sysfs root.
KFD_NODES = Path("class/kfd/kfd/topology/nodes")


@dataclasses.dataclass(frozen=True)
class KfdTopology:
    """The GPU nodes found, or why none could be read.

    Attributes:
        devices: GPU nodes in node order (CPU nodes skipped).
        error: why the topology could not be used (None when it was read).
        skipped: nodes that were unreadable or malformed, with the reason.
    """

    devices: tuple[GpuDevice, ...]
    error: str | None
    skipped: tuple[str, ...] = ()


def gfx_name(target_version: int) -> str | None:
    """``90402`` -> ``"gfx942"``, ``90010`` -> ``"gfx90a"``, ``110000`` -> ``"gfx1100"``; None for 0 or junk.

    Minor and stepping print as one hex digit each, as LLVM names the targets.
    """
    if target_version < 10000:
        return None
    major, minor, stepping = target_version // 10000, (target_version // 100) % 100, target_version % 100
    if minor > 15 or stepping > 15:
        return None
    return f"gfx{major}{minor:x}{stepping:x}"


def read_kfd_topology(sysfs_root: Path | str = "/sys") -> KfdTopology:
    """Read every GPU node of the KFD topology under ``sysfs_root``.

    Args:
        sysfs_root: the sysfs mount (``/sys``; tests pass a temporary tree).

    Returns:
        A :class:`KfdTopology`; ``error`` says why nothing could be read (no topology directory: no
        amdgpu kernel driver, a container without ``/sys/class/kfd``, or WSL).
    """
    nodes_dir = Path(sysfs_root) / KFD_NODES
    try:
        entries = sorted((p for p in nodes_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    except OSError as exc:
        return KfdTopology((), f"no KFD topology at {nodes_dir} ({exc.strerror or exc}); the amdgpu kernel "
                               "driver is not loaded, /sys/class/kfd is not mounted in this container, or this is WSL")
    devices: list[GpuDevice] = []
    skipped: list[str] = []
    for node in entries:
        try:
            properties = _parse_properties((node / "properties").read_text())
        except (OSError, ValueError) as exc:
            skipped.append(f"node {node.name}: {exc}")
            continue
        if properties.get("simd_count", 0) <= 0:
            continue  # a CPU node
        arch = gfx_name(properties.get("gfx_target_version", 0))
        unique_id = properties.get("unique_id", 0)
        try:
            label = (node / "name").read_text().strip()
        except OSError:
            label = ""
        devices.append(
            GpuDevice(
                index=len(devices),
                name=f"AMD GPU {label or arch or 'unknown'} (KFD node {node.name})",
                arch=arch,
                uuid=f"GPU-{unique_id:016X}" if unique_id else None,
            )
        )
    return KfdTopology(tuple(devices), None, tuple(skipped))


def _parse_properties(text: str) -> dict[str, int]:
    values: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, _, raw = line.strip().partition(" ")
        try:
            values[key] = int(raw.strip())
        except ValueError:
            raise ValueError(f"properties line {number} {line.strip()!r} is not 'key integer'") from None
    return values
