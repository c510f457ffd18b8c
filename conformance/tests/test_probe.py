"""Probe tier (runs first; if any of it fails the rest of the suite is skipped): every backend explains
itself, probing and selecting touch no device, capabilities are a stable value, and what a backend
declares is what it does."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

from hisparse_hal.capabilities import KV_FORMATS, Capabilities
from hisparse_hal.conformance.arenas import device_caches, pinned_host_pool
from hisparse_hal.conformance.contracts import refused
from hisparse_hal.errors import UnsupportedCapabilityError
from hisparse_hal.kv_cache import KV_FORMAT_SPECS, KVCacheConfig, LayerSpec
from hisparse_hal.python_child import python_command, python_environment
from hisparse_hal.registry import BackendSpec, discover_specs, probe_backends, select_backend

#: This tier (read by conformance/tiers.py, without importing this module): its area, its place in the
#: run and its title in the reports.
AREA = "probe"
ORDER = 10
TITLE = "Probe"

NO_CONTEXT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import hisparse_hal
    from hisparse_hal import probe_backends, select_backend
    from hisparse_hal.errors import BackendUnavailableError
    import torch
    results = probe_backends()
    try:
        chosen = select_backend(sys.argv[1] or None, results).chosen.name
    except BackendUnavailableError as exc:
        chosen = "none: " + str(exc).splitlines()[0]
    after_selection = torch.cuda.is_initialized()
    imported = None
    spec = next((r.spec for r in results if r.name == chosen), None)
    if sys.argv[2]:
        imported = sys.argv[2].partition(":")[0]
        __import__(imported)
    elif spec is not None:
        spec.load_class()
        imported = spec.backend_class
    print(json.dumps({"after_selection": after_selection, "after_import": torch.cuda.is_initialized(),
                      "chosen": chosen, "imported": imported}))
    """
)


@pytest.fixture(scope="module")
def isolated_probe(tmp_path_factory, backend_recipe) -> dict:
    """What a fresh interpreter saw: probe, select, then import the backend's module (run once)."""
    env = python_environment()
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(
        python_command(code=NO_CONTEXT_SCRIPT, args=[backend_recipe.registry_name or "",
                                                          backend_recipe.factory or backend_recipe.vllm_class or ""]),
        cwd=tmp_path_factory.mktemp("isolated-probe"), env=env, capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, f"the probe subprocess failed:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_registered_backend_gives_a_reason():
    for spec in discover_specs():
        if not isinstance(spec, BackendSpec):
            continue  # an entry point that failed to load: probe_backends reports it with its traceback
        try:
            probe = spec.probe()
        except Exception:  # noqa: BLE001 - a raising probe is recorded by probe_backends, checked below
            continue
        assert isinstance(probe.reason, str) and probe.reason.strip(), f"the probe of {spec.name!r} returned no reason"
    results = probe_backends()
    assert results, "no backend is registered in the hisparse_hal.backends entry-point group"
    for result in results:
        assert isinstance(result.reason, str) and result.reason.strip(), f"backend {result.name!r} gave no reason"
        assert isinstance(result.available, bool)
        assert isinstance(dict(result.facts), dict)
        json.dumps(result.as_dict(), default=str)


# These two are GPU-run checks: torch.cuda.is_initialized() is always False on a CPU build of torch. The project's
# own tests prove the probes context-free against simulated CUDA and HIP libraries
# (tests/vendors/{cuda,rocm}/test_spec.py).
def test_probing_and_selecting_create_no_device_context(isolated_probe):
    assert isolated_probe["after_selection"] is False, (
        f"probing and selecting ({isolated_probe['chosen']}) initialized a device context"
    )


def test_importing_the_backend_module_creates_no_device_context(isolated_probe):
    assert isolated_probe["imported"], "the backend module was not imported"
    assert isolated_probe["after_import"] is False, (
        f"importing {isolated_probe['imported']} initialized a device context"
    )


@pytest.mark.hal_extension
def test_the_backend_under_test_is_selected_with_a_reason(backend_recipe, backend):
    if backend_recipe.registry_name is None:
        pytest.skip("the backend under test comes from a factory, so the registry does not select it")
    selection = select_backend(backend_recipe.registry_name)
    assert selection.chosen is not None and selection.chosen.available
    assert selection.chosen.reason.strip() and backend_recipe.registry_name in selection.explanation
    assert backend.name == backend_recipe.registry_name, (
        f"backend registered as {backend_recipe.registry_name!r} calls itself {backend.name!r}"
    )
    backend.check_available()


@pytest.mark.smoke
def test_backend_identity(backend):
    assert isinstance(backend.name, str) and backend.name.strip()
    assert isinstance(backend.device, torch.device)
    # Engines compare tensor.device with backend.device: a tensor made there must report that very device
    # (a GPU device therefore carries its index), and the device must survive a round trip through its name.
    made_there = torch.empty(1, device=backend.device).device
    assert made_there == backend.device, (
        f"a tensor allocated on backend.device ({backend.device}) reports device {made_there}"
    )
    assert torch.device(str(backend.device)) == backend.device, f"{backend.device!r} does not round-trip via str()"


def test_capabilities_are_a_stable_value(backend):
    first, second = backend.capabilities, backend.capabilities
    assert isinstance(first, Capabilities)
    assert first == second, "capabilities changed between two reads"
    assert json.dumps(first.as_dict(), default=str) == json.dumps(second.as_dict(), default=str)
    json.dumps(first.as_dict())  # JSON-ready as documented


@pytest.mark.smoke
def test_capabilities_are_consistent(backend):
    caps = backend.capabilities
    assert caps.batch_copy in ("native", "loop")
    assert caps.max_batch_descriptors is None or (
        isinstance(caps.max_batch_descriptors, int) and caps.max_batch_descriptors >= 1
    )
    assert caps.ipc_event_max_cycles is None or caps.ipc_event_max_cycles >= 1
    assert isinstance(caps.kv_formats, frozenset) and caps.kv_formats <= KV_FORMATS
    assert caps.stats_dtype in (torch.uint64, torch.int64)
    assert backend.stats_dtype == caps.stats_dtype
    assert backend.supports_shared_host_pool == caps.shared_host_pool
    if caps.shared_host_pool:
        assert caps.ipc_events, "a shared host pool needs IPC events, but ipc_events is False"
        assert caps.ipc_event_max_cycles is None, (
            f"a shared host pool needs one record/wait per step without limit, but ipc_event_max_cycles="
            f"{caps.ipc_event_max_cycles}"
        )
    assert all(isinstance(k, str) for k in caps.versions)


def test_declared_graph_capture_matches_behaviour(backend, capabilities):
    if capabilities.graph_capture:
        with backend.capture() as graph:
            assert backend.is_current_stream_capturing() is True
        assert backend.is_current_stream_capturing() is False
        graph.replay()
    else:
        with pytest.raises(UnsupportedCapabilityError, match="capture"):
            with backend.capture():
                pass
        assert backend.is_current_stream_capturing() is False


def test_declared_ipc_events_match_behaviour(backend, capabilities):
    if not capabilities.ipc_events:
        with refused(backend, UnsupportedCapabilityError):
            backend.create_ipc_event()
        return
    event = backend.create_ipc_event()
    for member in ("record", "wait", "query", "synchronize"):
        assert callable(getattr(event, member, None)), f"IPC event lacks {member}()"
    handle = backend.export_event(event)
    assert isinstance(handle, bytes) and handle, (
        f"export_event must return non-empty bytes, got {type(handle).__name__}"
    )
    assert pickle.loads(pickle.dumps(handle)) == handle
    event.record()
    event.synchronize()
    assert event.query() is True


@pytest.mark.parametrize("fmt", sorted(KV_FORMATS))
def test_declared_kv_formats_match_behaviour(backend, capabilities, fmt):
    width = KV_FORMAT_SPECS[fmt].fixed_row_bytes or 64
    config = KVCacheConfig(fmt, 4, 4, width, (LayerSpec("layer.0"),))
    if fmt in capabilities.kv_formats:
        backend.validate_kv_cache_config(config)
    else:
        with refused(backend, UnsupportedCapabilityError, match=fmt):
            backend.validate_kv_cache_config(config)


def test_declared_max_batch_descriptors_is_honoured(backend, memory, capabilities):
    """A batch one past the declared cap is accepted (chunked); whether its bytes land is the swaps tier's."""
    cap = capabilities.max_batch_descriptors
    count = min(cap + 1, 20_001) if cap is not None else 20_001
    (cache,) = memory.enter_context(device_caches(backend, 1, count))
    pool = memory.enter_context(pinned_host_pool(backend, count))
    offsets = torch.arange(count)
    backend.swap_blocks_batch(
        cache.address + offsets, pool.address + offsets.flip(0), torch.ones(count, dtype=torch.int64)
    )
