"""Fixtures of the core room's tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.core.fake_plugin import install_plugin


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The third-party backend "fake" installed for this test, importable from ``tmp_path``."""
    install_plugin(tmp_path, {"fake": "fake_hal_plugin:SPEC"})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_hal_plugin", raising=False)
    return tmp_path
