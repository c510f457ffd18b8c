"""Counts the conformance harness's setup work per process: entry-point scans, probes and ``mlock`` trials.

Active only when ``CONFORMANCE_TRACE_FILE`` names a file (not ``HISPARSE_HAL_*``: the harness reports those)
and this folder is on ``PYTHONPATH`` (every process of a run inherits both): it wraps ``probing.discover_specs``,
``probing.run_probe`` and the CPU device's ``probe_page_lock`` as their modules load, and appends
``<pid> <event>`` lines to the file.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

_TRACE = os.environ.get("CONFORMANCE_TRACE_FILE")

# module -> {function: how to name one call}
_TARGETS: dict[str, dict[str, Callable[..., str]]] = {
    "hisparse_hal.probing": {
        "discover_specs": lambda *a, **k: "entry-point-scan",
        "run_probe": lambda spec, *a, **k: f"probe {getattr(spec, 'name', '?')}",
    },
    "hisparse_hal.vendors.cpu.runtime": {"probe_page_lock": lambda *a, **k: "mlock-trial"},
}


def note(event: str) -> None:
    """Append ``<pid> <event>`` to the trace file."""
    assert _TRACE is not None
    with open(_TRACE, "a", encoding="utf-8") as out:
        out.write(f"{os.getpid()} {event}\n")


def _wrap(module: ModuleType) -> None:
    for attr, name_of in _TARGETS[module.__name__].items():
        original = getattr(module, attr, None)
        if original is None:
            note(f"missing {module.__name__}.{attr}")  # a rename: the counting test fails on this line
            continue

        @functools.wraps(original)
        def traced(*args: Any, _original: Any = original, _name_of: Any = name_of, **kwargs: Any) -> Any:
            note(_name_of(*args, **kwargs))
            return _original(*args, **kwargs)

        setattr(module, attr, traced)


class _TracingLoader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _wrap(module)  # before any importer binds the names


class _TracingFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname not in _TARGETS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _TracingLoader(spec.loader)
                return spec
        return None


if _TRACE:
    _argv = getattr(sys, "orig_argv", sys.argv)
    # Without multi-line code (python_command's bootstrap), so that "-m pytest" after it is within the note.
    note("process " + " ".join(a for a in _argv[1:] if "\n" not in a)[:200])
    sys.meta_path.insert(0, _TracingFinder())
