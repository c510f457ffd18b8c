"""Which AMD GPUs a HIP process will see, worked out from the environment the way the runtimes do.

ROCr applies ``ROCR_VISIBLE_DEVICES`` to the physical GPUs first (ROCr ``amd_filter_device.cpp``);
the HIP runtime then applies ``HIP_VISIBLE_DEVICES``, or ``CUDA_VISIBLE_DEVICES`` when that is unset or
empty, to what ROCr left (clr ``rocdevice.cpp``, ``Device::init``). The two HIP variables do not
compose: the first non-empty one wins. Invariant: this module only reads a mapping; it loads nothing.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

__all__ = ["GpuDevice", "Visibility", "VISIBILITY_VARIABLES", "resolve_visible_devices"]

VISIBILITY_VARIABLES = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


@dataclasses.dataclass(frozen=True)
class GpuDevice:
    """One physical AMD GPU as a probe found it.

    Attributes:
        index: position among the GPUs in enumeration order (KFD node order, as ROCr enumerates).
        name: product or marketing name, for messages.
        arch: gfx target (``"gfx942"``), or None when the source did not say.
        uuid: ``"GPU-<16 hex digits>"`` as ROCr matches UUID tokens, or None when unknown.
    """

    index: int
    name: str
    arch: str | None
    uuid: str | None = None

    def as_fact(self) -> dict[str, object]:
        """JSON-ready form for probe facts."""
        return {"physical_index": self.index, "name": self.name, "arch": self.arch, "uuid": self.uuid}


@dataclasses.dataclass(frozen=True)
class Visibility:
    """The GPUs the HIP runtime will enumerate, in HIP ordinal order, and how they were chosen.

    Attributes:
        devices: visible GPUs; ``devices[i]`` is HIP device ``i``.
        applied: one sentence per variable that changed the set.
        problems: tokens the runtimes would stop at (a bad index, an unknown UUID, a repeat).
    """

    devices: tuple[GpuDevice, ...]
    applied: tuple[str, ...]
    problems: tuple[str, ...]


def resolve_visible_devices(physical: Sequence[GpuDevice], environ: Mapping[str, str]) -> Visibility:
    """Apply ``ROCR_VISIBLE_DEVICES`` then ``HIP_VISIBLE_DEVICES``/``CUDA_VISIBLE_DEVICES``.

    Args:
        physical: every GPU found, in enumeration order.
        environ: the process environment (``os.environ`` or a test mapping).

    Returns:
        The :class:`Visibility`. A token the runtime would reject ends the list there, as the runtime
        does, and is reported in ``problems``.
    """
    devices = list(physical)
    applied: list[str] = []
    problems: list[str] = []

    rocr = environ.get("ROCR_VISIBLE_DEVICES")
    if rocr is not None:
        devices = _apply_rocr(devices, rocr, problems)
        applied.append(f"ROCR_VISIBLE_DEVICES={rocr!r} leaves {len(devices)} of {len(physical)} GPU(s)")

    hip = environ.get("HIP_VISIBLE_DEVICES", "")
    cuda = environ.get("CUDA_VISIBLE_DEVICES", "")
    name, value = ("HIP_VISIBLE_DEVICES", hip) if hip else ("CUDA_VISIBLE_DEVICES", cuda)
    if value:
        before = len(devices)
        devices = _apply_hip(devices, name, value, problems)
        applied.append(f"{name}={value!r} leaves {len(devices)} of {before} GPU(s)")
        if hip and cuda:
            applied.append(
                f"CUDA_VISIBLE_DEVICES={cuda!r} is ignored: the HIP runtime reads it only when "
                "HIP_VISIBLE_DEVICES is unset or empty"
            )
    return Visibility(tuple(devices), tuple(applied), tuple(problems))


def _apply_rocr(devices: list[GpuDevice], value: str, problems: list[str]) -> list[GpuDevice]:
    """ROCr's rules: set but empty hides every GPU; tokens are indices (``strtol`` base 0) or UUID
    prefixes starting with ``G``; a bad, out-of-range or repeated token ends the list; tokens beyond
    the number of GPUs are ignored."""
    if value == "":
        return []
    tokens = [token.strip().upper() for token in value.split(",")]
    chosen: list[GpuDevice] = []
    for token in tokens[: len(devices)]:
        if token.startswith("G"):
            index = _match_uuid_prefix(devices, token)
            why = "matches no GPU UUID (or more than one)" if index is None else ""
            if index is None and any(d.uuid is None for d in devices):
                why = "cannot be matched: the device source gave no UUIDs"
        else:
            index = _strtol_base0(token)
            why = "is not a device index" if index is None else ""
        if index is not None and not 0 <= index < len(devices):
            why, index = f"is out of range (0..{len(devices) - 1})", None
        if index is not None and devices[index] in chosen:
            why, index = "repeats a device", None
        if index is None:
            problems.append(f"ROCR_VISIBLE_DEVICES token {token!r} {why}; it and later tokens are ignored")
            break
        chosen.append(devices[index])
    return chosen


def _apply_hip(devices: list[GpuDevice], name: str, value: str, problems: list[str]) -> list[GpuDevice]:
    """The HIP runtime's rules: a ``GPU-`` token becomes the index of the first GPU whose UUID contains
    it; an index must be written exactly as a decimal (``"01"`` and ``"+1"`` are rejected) and in range;
    the first bad token ends the list; a repeated index is skipped."""
    chosen: list[GpuDevice] = []
    for token in value.split(","):
        index: int | None
        if "GPU-" in token:
            index = next((i for i, d in enumerate(devices) if d.uuid and token in d.uuid), None)
            why = "matches no GPU UUID" if all(d.uuid for d in devices) else "cannot be matched: no GPU UUIDs known"
        else:
            index = int(token) if token.isdigit() and str(int(token)) == token else None
            why = "is not a decimal device index"
        if index is not None and index >= len(devices):
            why, index = f"is out of range (0..{len(devices) - 1})", None
        if index is None:
            problems.append(f"{name} token {token!r} {why}; it and later tokens are ignored")
            break
        if devices[index] not in chosen:
            chosen.append(devices[index])
    return chosen


def _match_uuid_prefix(devices: Sequence[GpuDevice], token: str) -> int | None:
    if not 5 <= len(token) <= 20:
        return None
    hits = [i for i, d in enumerate(devices) if d.uuid and d.uuid.upper().startswith(token)]
    return hits[0] if len(hits) == 1 else None


def _strtol_base0(token: str) -> int | None:
    """``strtol(token, &end, 0)`` that must consume the whole token: decimal, 0x hex or 0 octal."""
    sign = -1 if token[:1] == "-" else 1
    body = token[1:] if token[:1] in "+-" else token
    for pattern, base, skip in ((r"0[xX][0-9a-fA-F]+", 16, 2), (r"0[0-7]+", 8, 1), (r"[1-9][0-9]*|0", 10, 0)):
        if re.fullmatch(pattern, body):
            return sign * int(body[skip:], base)
    return None
