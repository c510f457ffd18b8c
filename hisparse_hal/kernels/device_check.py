"""On a GPU machine: the kernels triton's runtime compiles for this device, set against the offline report.

Each case is warmed up through the runtime (``JITFunction.warmup``: specialized and compiled exactly as a launch
would, for the device triton finds, nothing launched), then compiled offline for the same target by
:mod:`hisparse_hal.kernels.report`; shared memory, registers and spills must agree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from hisparse_hal.errors import UnsupportedCapabilityError

from . import report
from .specs import KernelCase

__all__ = ["DeviceComparison", "device_target", "compare_with_device"]


@dataclasses.dataclass
class DeviceComparison:
    """One case: what the device's runtime compiled and what the offline compile reported, field by field."""

    kernel: str
    shape: str
    target: str
    device: dict[str, Any]
    offline: dict[str, Any]

    @property
    def mismatches(self) -> list[str]:
        out = [f"{name}: device {self.device.get(name)} offline {self.offline.get(name)}"
               for name in ("compiled", "shared_bytes", "registers") if self.device.get(name) != self.offline.get(name)]
        if bool(self.device.get("spills")) != bool(self.offline.get("spill_bytes")):
            out.append(f"spills: device {self.device.get('spills')} offline {self.offline.get('spill_bytes')} B")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "mismatches": self.mismatches}


def device_target() -> str:
    """This machine's GPU as a compile-target name (``sm_90``, ``gfx942``...).

    Raises:
        UnsupportedCapabilityError: triton finds no GPU driver (no GPU, or a CPU-only triton).
    """
    try:
        from triton.runtime import driver

        target = driver.active.get_current_target()
    except Exception as exc:  # triton raises RuntimeError("0 active drivers") and others without a GPU
        raise UnsupportedCapabilityError(f"triton finds no GPU here ({type(exc).__name__}: {exc})") from exc
    return f"sm_{target.arch}" if target.backend == "cuda" else str(target.arch)


def _on_device(case: KernelCase) -> dict[str, Any]:
    from hisparse_hal.cache_ops import triton_impl

    fn = getattr(triton_impl.kernels(), case.kernel)
    try:
        compiled = fn.warmup(*case.launch.args, grid=case.launch.grid, **case.launch.constexprs)
        compiled._init_handles()  # loads the binary on the device: registers and spills from the driver
    except Exception as exc:  # the device compiler's error is the finding
        return {"compiled": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    registers = getattr(compiled, "n_regs", None)
    return {"compiled": True, "shared_bytes": int(compiled.metadata.shared), "registers": registers,
            "spills": getattr(compiled, "n_spills", None), "num_warps": int(compiled.metadata.num_warps)}


def compare_with_device(cases: Sequence[KernelCase]) -> list[DeviceComparison]:
    """Warm every case up on this device and compile it offline for the device's target.

    Raises:
        UnsupportedCapabilityError: no GPU for triton, or a target :mod:`.report` cannot compile for.
    """
    target = device_target()
    if target not in report.TARGETS:
        raise UnsupportedCapabilityError(
            f"this device is {target}; the offline report covers {', '.join(report.TARGETS)}"
        )
    offline = report.compile_cases(cases, [target])
    out = []
    for case, facts in zip(cases, offline, strict=True):
        mine = facts.as_dict()
        # AMD: the runtime's n_regs is the VGPR count; NVIDIA: registers per thread, as the offline figure.
        out.append(DeviceComparison(case.kernel, case.shape, target, _on_device(case),
                                    {name: mine[name] for name in ("compiled", "shared_bytes", "registers",
                                                                   "spill_bytes", "error")}))
    return out
