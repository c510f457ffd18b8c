"""The ROCm capability plan: every HIP-version and GPU-architecture quirk decided in one pure function.

Invariant: ``plan_capabilities`` loads no library and touches no device; the same HIP runtime version
and architecture always give the same ``Capabilities``. Each decision carries its source in ``reasons``,
keyed by the field it set.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

from hisparse_hal.capabilities import Capabilities, CapabilityReasons
from hisparse_hal.errors import InvalidArgumentError, UnsupportedCapabilityError

__all__ = [
    "MAX_BATCH_DESCRIPTORS",
    "IPC_EVENT_RING_SLOTS",
    "HipVersion",
    "hip_version",
    "GfxArch",
    "ArchFacts",
    "ARCHITECTURES",
    "ROCM_RELEASE_HIP_VERSIONS",
    "parse_arch",
    "arch_facts",
    "plan_capabilities",
]

#: hipMemcpyBatchAsync with more than 8,192 copies faults the GPU up to the 7.15 staging builds
#: (vLLM #43018; rocm-systems #9915). No fixed release is known, so the cap holds everywhere.
MAX_BATCH_DESCRIPTORS = 8192
#: ROCm 7.2.x emulates IPC events with a 32-slot ring; the 33rd record/wait reads past it
#: (vLLM #57602; rocm-systems #11511 and its 7.2 backport #11529).
IPC_EVENT_RING_SLOTS = 32

_MAJOR = 10_000_000
_MINOR = 100_000


@dataclasses.dataclass(frozen=True, order=True)
class HipVersion:
    """A HIP runtime version as ``hipRuntimeGetVersion`` encodes it: major * 10,000,000 +
    minor * 100,000 + patch. The patch is HIP's build number (7.2.53211), not the ROCm point release."""

    major: int
    minor: int
    patch: int

    @classmethod
    def from_int(cls, value: int) -> HipVersion:
        """Decode an integer from ``hipRuntimeGetVersion``.

        Raises:
            InvalidArgumentError: not a positive int.
        """
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InvalidArgumentError(
                f"runtime_version must be a positive int as hipRuntimeGetVersion reports it "
                f"(major*10,000,000 + minor*100,000 + patch), got {value!r}"
            )
        return cls(value // _MAJOR, (value % _MAJOR) // _MINOR, value % _MINOR)

    def as_int(self) -> int:
        """The ``hipRuntimeGetVersion`` encoding."""
        return self.major * _MAJOR + self.minor * _MINOR + self.patch

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


def hip_version(major: int, minor: int, patch: int = 0) -> int:
    """The ``hipRuntimeGetVersion`` integer of HIP ``major.minor.patch``."""
    return HipVersion(major, minor, patch).as_int()


#: HIP runtime versions of ROCm releases where a decision depends on the point release. HIP's patch
#: number is a build number that moves only when the runtime changes (ROCm/hip #3703), so the ROCm
#: point release cannot be read from it except through such a table.
ROCM_RELEASE_HIP_VERSIONS = {
    "7.1.0": hip_version(7, 1, 52802),  # HIP VERSION file of ROCm 7.1.0 (ROCm/hip #3881)
    "7.2.0": hip_version(7, 2, 53210),  # rocm-systems #2001 (some 7.2.0 builds report 26015, ROCm/hip #3881)
    "7.2.1": hip_version(7, 2, 53211),  # rocm-systems #3199 bumped the patch for the 7.2.1 fixes
    "7.14.0": hip_version(7, 14, 60850),  # rocm-systems #7945 (the 7.14 VERSION file before 7.15)
}

_OLDEST_SUPPORTED = HipVersion(6, 0, 0)
_BATCH_FROM = HipVersion(7, 1, 0)  # quirk 8: hipMemcpyBatchAsync first shipped in 7.1 (vLLM #41737)
_ATTRIBUTES_FROM = HipVersion(7, 13, 0)  # quirk 9: numAttrs > 0 returns 801 on 7.2.x (ROCm/clr #273)
_ACCELERATED_FROM = HipVersion(7, 14, 0)  # quirk 10: an internal per-copy loop before 7.14 (ROCm/clr #273)
_CAPTURE_FROM = HipVersion(7, 2, 53211)  # quirk 15: <= 7.2.0 captures break (SGLang #23580); 7.2.1 patch


@dataclasses.dataclass(frozen=True)
class GfxArch:
    """A parsed ``gcnArchName``: ``"gfx942:sramecc+:xnack-"`` is base ``gfx942`` with two features."""

    full: str
    base: str
    features: tuple[tuple[str, bool], ...]


_ARCH_RE = re.compile(r"^(gfx[0-9a-f]{3,4})((?::[a-z0-9_]+[+-])*)$")


def parse_arch(arch: str) -> GfxArch:
    """Parse an AMD architecture name as torch's ``gcnArchName`` reports it.

    Raises:
        InvalidArgumentError: not a ``gfx`` target name (``"gfx942"``, ``"gfx942:sramecc+:xnack-"``).
    """
    if not isinstance(arch, str):
        raise InvalidArgumentError(f"arch must be a str such as 'gfx942:sramecc+:xnack-', got {type(arch).__name__}")
    match = _ARCH_RE.match(arch.strip().lower())
    if match is None:
        raise InvalidArgumentError(
            f"arch {arch!r} is not an AMD gfx target; expected torch's gcnArchName such as "
            "'gfx942:sramecc+:xnack-' or 'gfx950'"
        )
    features = tuple(
        (item[:-1], item[-1] == "+") for item in match.group(2).split(":") if item
    )
    return GfxArch(arch.strip(), match.group(1), features)


@dataclasses.dataclass(frozen=True)
class ArchFacts:
    """What one AMD architecture decides: its fp8 KV flavour, LDS per workgroup, wavefront width."""

    product: str
    fp8_format: str | None
    shared_memory_per_block: int | None
    wavefront_size: int | None
    batch_copy_safe: bool = True
    note: str = ""


_KIB = 1024
#: Architectures this backend knows. fp8: gfx94x store e4m3 "fnuz" (max 224), gfx950 the OCP e4m3fn
#: (max 448); reading one as the other corrupts values silently (vLLM rocm.py; #45563). LDS per block:
#: 64 KiB on CDNA2/3, 160 KiB on gfx950 (aiter #5539). CDNA wavefronts are 64 wide (SGLang #23970).
ARCHITECTURES: dict[str, ArchFacts] = {
    "gfx908": ArchFacts(
        "Instinct MI100 (CDNA1)", None, 64 * _KIB, 64, batch_copy_safe=False,
        note="gfx908: hipMemcpyBatchAsync device-to-host copies racing graph replay corrupt device "
        "memory (rocm-systems #11662, open), so swaps use the per-copy loop",
    ),
    "gfx90a": ArchFacts("Instinct MI200 (CDNA2)", None, 64 * _KIB, 64),
    "gfx940": ArchFacts("Instinct MI300 (CDNA3)", "fp8_e4m3fnuz", 64 * _KIB, 64),
    "gfx941": ArchFacts("Instinct MI300 (CDNA3)", "fp8_e4m3fnuz", 64 * _KIB, 64),
    "gfx942": ArchFacts("Instinct MI300X/MI325X (CDNA3)", "fp8_e4m3fnuz", 64 * _KIB, 64),
    "gfx950": ArchFacts("Instinct MI350X/MI355X (CDNA4)", "fp8_e4m3fn", 160 * _KIB, 64),
    "gfx1100": ArchFacts("Radeon RX 7900 (RDNA3)", None, 64 * _KIB, 32),
}


def arch_facts(arch: GfxArch) -> ArchFacts | None:
    """The known facts of ``arch``'s base target, or None for an architecture not in the table."""
    return ARCHITECTURES.get(arch.base)


def plan_capabilities(runtime_version: int, arch: str, *, batch_symbol: bool = True) -> Capabilities:
    """Decide what the ROCm backend does on one GPU.

    Args:
        runtime_version: as ``hipRuntimeGetVersion`` reports it (major*10,000,000 + minor*100,000 +
            patch), e.g. ``hip_version(7, 2, 53211)`` for ROCm 7.2.1.
        arch: torch's ``gcnArchName``: ``"gfx942:sramecc+:xnack-"``, ``"gfx950"``.
        batch_symbol: whether the loaded libamdhip64 exports ``hipMemcpyBatchAsync`` (it may not even
            where the version says it should, e.g. a stripped build).

    Returns:
        The ``Capabilities``; ``versions`` records the HIP version, the architecture and its facts
        (shared memory per block, wavefront size), ``reasons`` the source of each forced decision, by field.

    Raises:
        InvalidArgumentError: ``runtime_version`` is not positive or ``arch`` is not a gfx target.
        UnsupportedCapabilityError: a HIP runtime older than 6.0.

    An architecture missing from :data:`ARCHITECTURES` is planned conservatively rather than refused
    (data movement works on any AMD GPU): bf16 KV only, because which fp8 flavour it stores cannot be
    known and guessing wrong corrupts values silently (quirk 16).
    """
    version = HipVersion.from_int(runtime_version)
    gfx = parse_arch(arch)
    if version < _OLDEST_SUPPORTED:
        raise UnsupportedCapabilityError(
            f"HIP runtime {version} is older than {_OLDEST_SUPPORTED}, the oldest this backend plans for; "
            "install a ROCm 6.x or 7.x build of torch"
        )
    facts = arch_facts(gfx)
    reasons = CapabilityReasons()
    batch_copy, copy_attributes, accelerated = _plan_copy_path(version, facts, batch_symbol, reasons)
    ipc_max_cycles = _plan_ipc_events(version, reasons)
    graph_capture = _plan_graph_capture(version, reasons)
    kv_formats = _plan_kv_formats(gfx, facts, reasons)
    # Registered host memory can have a device address other than its host address (MI355X, ROCm
    # 7.2; SGLang #33968, #35233, #36966): every registration records hipHostGetDevicePointer's alias.
    reasons.add("host_pointer_alias",
                "registered host memory gets a device alias from hipHostGetDevicePointer (SGLang #35233)")
    return Capabilities(
        batch_copy=batch_copy,
        max_batch_descriptors=MAX_BATCH_DESCRIPTORS,
        ipc_events=True,
        ipc_event_max_cycles=ipc_max_cycles,
        shared_host_pool=ipc_max_cycles is None,
        graph_capture=graph_capture,
        host_pointer_alias=True,
        kv_formats=kv_formats,
        versions=_versions(version, gfx, facts),
        copy_attributes=copy_attributes,
        batch_copy_accelerated=accelerated,
        reasons=reasons,
    )


def _plan_copy_path(version: HipVersion, facts: ArchFacts | None, batch_symbol: bool,
                    reasons: CapabilityReasons) -> tuple[Literal["native", "loop"], bool, bool]:
    """``(batch_copy, copy_attributes, batch_copy_accelerated)``: one ``hipMemcpyBatchAsync`` per chunk from HIP
    7.1 where the library exports it and the architecture is safe, attributes from 7.13, DMA batching from 7.14."""
    batch_copy: Literal["native", "loop"] = "native"
    if version < _BATCH_FROM:
        batch_copy = "loop"
        reasons.add("batch_copy", f"HIP {version}: no hipMemcpyBatchAsync before 7.1, swaps use a hipMemcpyAsync loop "
                    "(vLLM #41737)")
    elif not batch_symbol:
        batch_copy = "loop"
        reasons.add("batch_copy", f"HIP {version}: libamdhip64 exports no hipMemcpyBatchAsync, swaps use a "
                    "hipMemcpyAsync loop")
    elif facts is not None and not facts.batch_copy_safe:
        batch_copy = "loop"
        reasons.add("batch_copy", facts.note)
    if batch_copy == "loop":
        return batch_copy, False, False
    copy_attributes = version >= _ATTRIBUTES_FROM
    if not copy_attributes:
        reasons.add("copy_attributes",
            f"HIP {version}: batch calls carry no copy attributes before 7.13; 7.2.1-7.2.3 return "
            "hipErrorNotSupported (801) for numAttrs > 0 (ROCm/clr #273; vLLM #43018)"
        )
    accelerated = version >= _ACCELERATED_FROM
    if not accelerated:
        # Still one call: it saves a Python-to-C crossing per copy, which the hipMemcpyAsync loop pays
        # (2.1x faster at 4-8 KiB copies on MI300X, vLLM #40549); no DMA batching is claimed.
        reasons.add("batch_copy_accelerated",
            f"HIP {version}: hipMemcpyBatchAsync loops per copy inside the runtime before 7.14 (ROCm/clr "
            "#273); it is still called once per chunk to save per-copy host calls (vLLM #40549)"
        )
    reasons.add("max_batch_descriptors",
        f"at most {MAX_BATCH_DESCRIPTORS} descriptors per hipMemcpyBatchAsync call; more fault the "
        "GPU (vLLM #43018; rocm-systems #9915)"
    )
    return batch_copy, copy_attributes, accelerated


def _plan_ipc_events(version: HipVersion, reasons: CapabilityReasons) -> int | None:
    """The IPC events' record/wait cycle limit (None: unbounded); a limit also rules out a shared host pool."""
    if (version.major, version.minor) != (7, 2):
        return None
    reasons.add("ipc_event_max_cycles",
        f"HIP {version}: IPC events break after {IPC_EVENT_RING_SLOTS} record/wait cycles (vLLM #57602; "
        "rocm-systems #11511); events refuse the 33rd cycle"
    )
    reasons.add("shared_host_pool",
        f"HIP {version}: IPC events break after {IPC_EVENT_RING_SLOTS} record/wait cycles, so ranks cannot "
        "synchronize on one shared host pool (vLLM #57602)"
    )
    return IPC_EVENT_RING_SLOTS


def _plan_graph_capture(version: HipVersion, reasons: CapabilityReasons) -> bool:
    """Graph capture from ROCm 7.2.1 (HIP 7.2.53211)."""
    if version >= _CAPTURE_FROM:
        return True
    reasons.add("graph_capture",
        f"HIP {version}: graph capture needs ROCm 7.2.1 (HIP 7.2.53211) or later; before it another "
        "thread's hipEventQuery invalidates a capture (SGLang #23580)"
    )
    return False


def _plan_kv_formats(gfx: GfxArch, facts: ArchFacts | None, reasons: CapabilityReasons) -> frozenset[str]:
    """bf16 everywhere; the architecture's own fp8 flavour where the table knows it (quirk 16)."""
    if facts is None:
        reasons.add("kv_formats",
            f"{gfx.base} is not in this backend's architecture table: bf16 KV only, since its fp8 flavour "
            "(fnuz or OCP) is unknown and the wrong one corrupts values (vLLM #45563)"
        )
        return frozenset({"bf16"})
    return frozenset({"bf16"} | ({facts.fp8_format} if facts.fp8_format is not None else set()))


def _versions(version: HipVersion, gfx: GfxArch, facts: ArchFacts | None) -> dict[str, str]:
    """What the plan was made from, for reports: the HIP version, the architecture and its facts."""
    return {
        "hip_runtime": str(version),
        "hip_runtime_int": str(version.as_int()),
        "arch": gfx.full,
        "gfx": gfx.base,
        "arch_features": ",".join(f"{name}{'+' if on else '-'}" for name, on in gfx.features),
        "product": facts.product if facts else "unknown",
        "shared_memory_per_block": str(facts.shared_memory_per_block)
        if facts and facts.shared_memory_per_block
        else "unknown",
        "wavefront_size": str(facts.wavefront_size) if facts and facts.wavefront_size else "unknown",
        "fp8_kv_format": (facts.fp8_format or "none") if facts else "unknown",
    }
