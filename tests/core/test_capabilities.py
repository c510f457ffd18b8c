"""The ``Capabilities`` value (``hisparse_hal/capabilities.py``): its own checks, serialisation, and reasons
keyed by field with notes derived from them."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hisparse_hal import Capabilities
from hisparse_hal.capabilities import CapabilityReasons
from hisparse_hal.errors import InvalidArgumentError


def test_capabilities_reject_unknown_format_and_bad_cap():
    with pytest.raises(InvalidArgumentError, match=r"unknown KV formats \['fp4'\]"):
        Capabilities("native", None, True, None, True, True, False, frozenset({"fp4"}))
    with pytest.raises(InvalidArgumentError, match="max_batch_descriptors must be None or >= 1, got 0"):
        Capabilities("native", 0, True, None, True, True, False, frozenset({"bf16"}))
    with pytest.raises(InvalidArgumentError, match="batch_copy must be 'native' or 'loop', got 'dma'"):
        Capabilities("dma", None, True, None, True, True, False, frozenset({"bf16"}))  # type: ignore[arg-type]


def test_capabilities_are_frozen_and_serialise():
    caps = Capabilities("loop", 8192, True, 32, False, True, True, frozenset({"bf16"}), versions={"hip": "7.2.1"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.batch_copy = "native"  # type: ignore[misc]
    data = caps.as_dict()
    assert data["kv_formats"] == ["bf16"] and data["stats_dtype"] == "uint64" and data["versions"] == {"hip": "7.2.1"}


def test_reasons_are_keyed_by_field_and_notes_render_them_in_order() -> None:
    reasons = CapabilityReasons()
    reasons.add("graph_capture", "runtime 1.0 has no capture (example #1)")
    reasons.add("batch_copy", "no batch call")
    reasons.add("batch_copy", "capped at 8")
    caps = Capabilities("loop", 8, True, None, True, False, False, frozenset({"bf16"}), reasons=reasons)
    assert dict(caps.reasons) == {"graph_capture": "runtime 1.0 has no capture (example #1)",
                                  "batch_copy": "no batch call; capped at 8"}
    assert caps.notes == (
        "graph_capture: runtime 1.0 has no capture (example #1)",
        "batch_copy: no batch call; capped at 8",
    )
    data = json.loads(json.dumps(caps.as_dict()))
    assert data["reasons"] == dict(caps.reasons) and data["notes"] == list(caps.notes)


def test_reasons_are_frozen_and_copied() -> None:
    given = {"cache_ops": "torch (no triton)"}
    caps = Capabilities("loop", None, True, None, True, True, False, frozenset({"bf16"}), reasons=given)
    given["cache_ops"] = "changed"
    assert caps.reasons["cache_ops"] == "torch (no triton)"
    with pytest.raises(TypeError):
        caps.reasons["cache_ops"] = "x"  # type: ignore[index]


def test_a_reason_keyed_by_anything_but_a_field_is_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match=r"keyed by a Capabilities field; unknown keys \['capture'\]"):
        Capabilities("loop", None, True, None, True, True, False, frozenset({"bf16"}), reasons={"capture": "no"})
    with pytest.raises(InvalidArgumentError, match=r"unknown keys \['reasons'\]"):
        Capabilities("loop", None, True, None, True, True, False, frozenset({"bf16"}), reasons={"reasons": "no"})
