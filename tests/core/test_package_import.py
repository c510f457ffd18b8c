"""``import hisparse_hal`` alone defines the cache ops as ``torch.ops.hisparse_hal.*`` (in a fresh process, so no
earlier import of ``hisparse_hal.cache_ops`` in the test session can hide a regression), and touches no device."""

from __future__ import annotations

import json
import subprocess

from hisparse_hal.cache_ops.library import OP_NAMES
from hisparse_hal.python_child import python_command, python_environment

SCRIPT = """
import json, sys
import hisparse_hal, torch
ops = {name: str(getattr(torch.ops.hisparse_hal, name)._schemas) for name in sys.argv[1:]}
print(json.dumps({"ops": sorted(ops), "cuda_initialized": torch.cuda.is_initialized()}))
"""


def test_plain_import_defines_every_cache_op(tmp_path):
    done = subprocess.run(python_command(code=SCRIPT, args=list(OP_NAMES)), cwd=tmp_path, env=python_environment(),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"ops": sorted(OP_NAMES), "cuda_initialized": False}
    assert "Failed to initialize NumPy" not in done.stderr
