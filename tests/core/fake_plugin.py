"""A third-party backend distribution, written into a folder at test time: a module and a dist-info whose entry
points register it in ``hisparse_hal.backends``, as an out-of-tree vendor package would."""

from __future__ import annotations

from pathlib import Path

PLUGIN = '''
"""A third-party backend registered only through an entry point (test fixture)."""
import os
import torch
from hisparse_hal import HiSparseBackend, BackendSpec, Probe, Capabilities

class FakeBackend(HiSparseBackend):
    name = "fake"
    @property
    def device(self):
        return torch.device("cpu")
    @property
    def capabilities(self):
        return Capabilities("loop", None, False, None, False, False, False, frozenset({"bf16"}))

def probe():
    mode = os.environ.get("FAKE_HAL_MODE", "available")
    if mode == "raise":
        raise OSError("libfake.so: cannot open shared object file")
    return Probe(mode == "available", f"fake accelerator mode {mode}", {"fake_version": "1.2"})

SPEC = BackendSpec("fake", int(os.environ.get("FAKE_HAL_PRIORITY", "50")), probe, "fake_hal_plugin:FakeBackend")
NOT_A_BACKEND = BackendSpec("not_a_backend", 99, probe, "fake_hal_plugin:probe")
TWIN = BackendSpec("fake_twin", int(os.environ.get("FAKE_HAL_PRIORITY", "50")), probe, "fake_hal_plugin:FakeBackend")
'''


def install_plugin(root: Path, entries: dict[str, str]) -> None:
    """Write the plugin module and a dist-info registering ``entries`` (name -> target) under ``root``."""
    (root / "fake_hal_plugin.py").write_text(PLUGIN)
    info = root / "fake_hal_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-hal-plugin\nVersion: 0.1\n")
    lines = "\n".join(f"{name} = {target}" for name, target in entries.items())
    (info / "entry_points.txt").write_text(f"[hisparse_hal.backends]\n{lines}\n")
