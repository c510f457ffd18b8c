"""Capability claims, checked both ways: a capability the backend denies is probed once, cheaply and safely; when
it works, the run's report says so (``claims``; a warning about a dishonest or stale claim, not a failure). A
capability the backend claims is held to by its own tier. Every test here passes unless a probe breaks the backend."""

from __future__ import annotations

import contextlib
import json
import pickle

import pytest

from hisparse_hal.capabilities import KV_FORMATS
from hisparse_hal.conformance.plugin import CLAIM_PROPERTY
from hisparse_hal.kv_cache import KV_FORMAT_SPECS, KVCacheConfig, LayerSpec

#: This tier (read by conformance/tiers.py, without importing this module): its area, its place in the
#: run and its title in the reports.
AREA = "claims"
ORDER = 120
TITLE = "Capability claims"


def _claim_works(record_property, capability: str, evidence: str) -> None:
    """Record that ``capability`` is denied but works (the plugin gathers it into the report's ``claims``)."""
    record_property(CLAIM_PROPERTY, json.dumps(
        {"capability": capability, "claimed": False, "works": True, "evidence": evidence}
    ))


def test_a_denied_ipc_events_capability_is_probed(backend, capabilities, record_property):
    if capabilities.ipc_events:
        return  # claimed: the IPC tier tests it
    event = None
    try:
        event = backend.create_ipc_event()
        size = len(pickle.dumps(backend.export_event(event)))
    except Exception:  # noqa: BLE001 - denied and not working: the claim is honest
        return
    finally:
        close = getattr(event, "close", None)
        if callable(close):
            with contextlib.suppress(Exception):
                close()
    _claim_works(record_property, "ipc_events",
                 f"create_ipc_event() and export_event() succeeded (a {size}-byte picklable handle)")


@pytest.mark.hal_extension
def test_a_denied_graph_capture_capability_is_probed(backend, capabilities, record_property):
    if capabilities.graph_capture:
        return  # claimed: the capture tier tests it
    try:
        with backend.capture() as graph:
            capturing = backend.is_current_stream_capturing()
        graph.replay()
    except Exception:  # noqa: BLE001 - denied and not working: the claim is honest
        return
    _claim_works(record_property, "graph_capture",
                 f"capture() captured an empty graph that replays (capturing inside: {capturing})")


@pytest.mark.parametrize("fmt", sorted(KV_FORMATS))
def test_a_denied_kv_format_is_probed(backend, capabilities, record_property, fmt):
    if fmt in capabilities.kv_formats:
        return  # claimed: the config tier tests it
    width = 656 if KV_FORMAT_SPECS[fmt].fixed_row_bytes else 64
    config = KVCacheConfig(fmt, 4, 4, width, (LayerSpec("layer.0", 0),))
    try:
        backend.validate_kv_cache_config(config)
    except Exception:  # noqa: BLE001 - denied and refused: the claim is honest
        return
    _claim_works(record_property, f"kv_formats[{fmt}]", f"validate_kv_cache_config accepted a {fmt} config")
