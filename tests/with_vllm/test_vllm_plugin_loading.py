"""vLLM 0.33.0's plugin loader runs our entry point; vLLM's own compiled ops, when present, are never shadowed.

The ordering tests run in fresh interpreters: a compiled ``_C_cache_ops`` library cannot be unloaded, so each
order (vLLM's kernels first, as the plugin arranges, and ours first, to show the collision it avoids) gets its own.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm_env import loaded_plugin, require_vllm

require_vllm()

from vllm.v1.hisparse import runtime as vllm_runtime  # noqa: E402

from hisparse_hal.cache_ops import library  # noqa: E402
from hisparse_hal.integrations import vllm as plugin  # noqa: E402

OPS = tuple(library.VLLM_OP_NAMES.values())


def _compiled_schemas() -> dict[str, str]:
    """The four schema strings compiled into vLLM's _C_stable_libtorch extension, whitespace collapsed."""
    import vllm

    so = Path(vllm.__file__).parent / "_C_stable_libtorch.abi3.so"
    text = so.read_bytes()
    schemas = {}
    for op in OPS:
        match = re.search(rb"\x00(" + op.encode() + rb"\([^\x00]*\) -> \(\))\x00", text)
        assert match, f"{op}'s schema is not in {so}"
        schemas[op] = re.sub(r"\s+", " ", match.group(1).decode()).replace("( ", "(")
    return schemas


def test_load_general_plugins_runs_our_entry_point_and_satisfies_has_hisparse_ops() -> None:
    plugin_status = loaded_plugin()
    assert plugin_status.state == "defined", plugin_status
    assert vllm_runtime._has_hisparse_ops()
    assert plugin_status.owners == {op: "hisparse-hal" for op in OPS}
    assert plugin_status.implementations["cpu"].startswith("host (")


def test_our_ops_have_exactly_the_schemas_vllm_compiled() -> None:
    assert loaded_plugin().active, "the plugin must have defined the ops vLLM calls"
    for op, compiled in _compiled_schemas().items():
        ours = getattr(torch.ops._C_cache_ops, op).default._schema
        assert ours == torch._C.parse_schema(f"_C_cache_ops::{compiled}"), op


def test_loading_again_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    plugin_status = loaded_plugin()
    import vllm.plugins

    before = {op: getattr(torch.ops._C_cache_ops, op).default for op in OPS}
    dumps = {op: torch._C._dispatch_dump(f"_C_cache_ops::{op}") for op in OPS}
    vllm.plugins.plugins_loaded = False  # as a second vLLM component in this process would find it
    with caplog.at_level(logging.DEBUG, logger="vllm.hisparse_hal"):
        vllm.plugins.load_general_plugins()
        again = plugin.register()
    assert again is plugin_status
    assert {op: getattr(torch.ops._C_cache_ops, op).default for op in OPS} == before
    assert {op: torch._C._dispatch_dump(f"_C_cache_ops::{op}") for op in OPS} == dumps
    assert not [r for r in caplog.records if r.levelno >= logging.INFO], "a repeated load must not redo anything"


def test_our_ops_forward_to_hisparse_hal() -> None:
    """One call through ``_C_cache_ops`` changes exactly what ``torch.ops.hisparse_hal`` would."""
    assert loaded_plugin().active, "the plugin must have defined the ops vLLM calls"
    device_global_indices = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]], dtype=torch.int32)
    expected = device_global_indices.clone()
    args = (torch.tensor([1, 0], dtype=torch.int32), torch.tensor([0, 1, 1], dtype=torch.int32),
            torch.tensor([20, 11, 13], dtype=torch.int64))
    torch.ops._C_cache_ops.hisparse_invalidate_written_slots(device_global_indices, *args)
    torch.ops.hisparse_hal.invalidate_written_slots(expected, *args)
    assert device_global_indices.tolist() == expected.tolist() == [[10, -1, 12, -1], [-1, 21, 22, 23]]


# A stand-in for vLLM's compiled extension: a DEF library (as TORCH_LIBRARY / STABLE_TORCH_LIBRARY make) of the
# four ops with the schemas vLLM compiled, whose kernels only count calls. It is registered from inside
# current_platform.import_kernels(), exactly where vLLM's platforms import vllm._C_stable_libtorch.
_STANDIN = """
import json, logging, sys
import torch
from vllm.platforms import current_platform
from vllm.v1.hisparse import runtime as vllm_runtime
import vllm.plugins

SCHEMAS = json.loads(sys.argv[1])
ORDER = sys.argv[2]
calls = []
compiled = []

def load_compiled():
    lib = torch.library.Library("_C_cache_ops", "DEF")
    for op, schema in SCHEMAS.items():
        lib.define(schema)
        lib.impl(op, lambda *args, op=op: calls.append(op), "CPU")
    compiled.append(lib)

original = type(current_platform).import_kernels
def import_kernels():
    original()
    if ORDER == "vllm-first":
        load_compiled()
type(current_platform).import_kernels = staticmethod(import_kernels)

records = []
handler = logging.Handler()
handler.emit = lambda record: records.append(record.getMessage())
logging.getLogger("vllm.hisparse_hal").addHandler(handler)
logging.getLogger("vllm.hisparse_hal").setLevel(logging.INFO)

vllm.plugins.load_general_plugins()
result = {"has_ops": vllm_runtime._has_hisparse_ops(), "log": records}
if ORDER == "ours-first":
    try:
        load_compiled()
        result["collision"] = None
    except RuntimeError as exc:
        result["collision"] = str(exc).splitlines()[0]
else:
    torch.ops._C_cache_ops.hisparse_invalidate_written_slots(
        torch.full((1, 4), -1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
        torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int64))
    result["calls"] = calls
    dump = torch._C._dispatch_dump("_C_cache_ops::hisparse_resolve_residency")
    result["ours_in_dispatcher"] = "hisparse_hal" in dump
print("RESULT " + json.dumps(result))
"""


def _run_standin(order: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != plugin.DISABLE_ENV}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_STANDIN), json.dumps(_compiled_schemas()), order],
                          capture_output=True, text=True, timeout=240, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    return result


def test_vllm_compiled_ops_registered_by_import_kernels_win_and_ours_are_not_defined() -> None:
    result = _run_standin("vllm-first")
    assert result["has_ops"]
    assert result["calls"] == ["hisparse_invalidate_written_slots"], "the compiled stand-in must be what runs"
    assert not result["ours_in_dispatcher"]
    assert any("leaving _C_cache_ops alone" in line and "vLLM's compiled kernels run" in line
               for line in result["log"]), result["log"]


def test_defining_ours_before_vllm_loads_its_kernels_would_collide() -> None:
    """Why the plugin has vLLM load its kernels first: the reverse order breaks vLLM's own registration."""
    result = _run_standin("ours-first")
    assert result["has_ops"]
    assert result["collision"] is not None and "_C_cache_ops::hisparse_" in result["collision"], result
    assert any("defined _C_cache_ops.hisparse_resolve_residency" in line for line in result["log"]), result["log"]


def test_switched_off_by_environment_defines_nothing() -> None:
    code = ("import torch, vllm.plugins; from vllm.v1.hisparse import runtime; vllm.plugins.load_general_plugins(); "
            "from hisparse_hal.integrations import vllm as p; s = p.register(); "
            "print('RESULT', s.state, runtime._has_hisparse_ops(), hasattr(torch.ops._C_cache_ops, "
            "'hisparse_gather_plan'))")
    env = {**os.environ, plugin.DISABLE_ENV: "off"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESULT disabled False False" in proc.stdout
