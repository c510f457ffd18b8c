"""Objects named by ``"module:attr.path"`` strings (``--factory``, ``--vllm-backend``), imported with one-line errors.

Invariant: every option of the suite that names code by qualname resolves it here, so each gives the same errors.
"""

from __future__ import annotations

import importlib
from typing import Any

from hisparse_hal.errors import InvalidArgumentError

__all__ = ["load_factory"]


def load_factory(target: str, what: str = "factory") -> Any:
    """Import ``"module:attr.path"`` and return the attribute; ``what`` names the option in messages.

    Raises:
        InvalidArgumentError: malformed target, module not importable, or attribute missing.
    """
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        shape = "package.module:Class" if what.startswith("--vllm") else "package.module:callable"
        raise InvalidArgumentError(f"{what} must look like {shape!r}, got {target!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgumentError(f"{what} {target!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InvalidArgumentError(f"{what} {target!r}: {module_name!r} has no attribute {attr_path!r}") from None
    if not callable(obj):
        raise InvalidArgumentError(f"{what} {target!r} is not callable ({type(obj).__name__})")
    return obj
