"""Expectations files: entries with reasons and architectures, rejected malformed, matched to tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from hisparse_hal.conformance.expectations import backend_architectures, load_expectations
from hisparse_hal.errors import InvalidArgumentError


# ------------------------------------------------------------------------------------------ expectations
def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "expectations.toml"
    path.write_text(text)
    return path


def test_expectations_are_read_with_their_reasons_and_architectures(tmp_path):
    path = _write(tmp_path, """
[[expectations]]
id = "test_ipc.py"
status = "skip"
reason = "no IPC on this runtime (ROCm/clr#0)"

[[expectations]]
id = "test_ipc.py::test_ipc_event_survives_1000_record_wait_cycles"
status = "xfail"
reason = "32-slot ring"
architectures = ["gfx942"]
""")
    found = load_expectations(path)
    assert [e.status for e in found.entries] == ["skip", "xfail"]
    cycles = "test_ipc.py::test_ipc_event_survives_1000_record_wait_cycles"
    longest, other_arch = found.lookup(cycles, ["gfx942"]), found.lookup(cycles, ["sm_90"])
    assert longest is not None and longest.status == "xfail", "the longest matching id wins"
    assert other_arch is not None and other_arch.status == "skip", (
        "an entry limited to other architectures does not apply"
    )
    assert found.lookup("test_swaps.py::test_x", []) is None
    assert found.needs_architectures()
    assert [e.id for e in found.unmatched(["test_swaps.py::test_x"])] == ["test_ipc.py", cycles]
    assert "32-slot ring" in found.entries[1].describe() and "gfx942" in found.entries[1].describe()


def test_inline_expectations_list_is_accepted(tmp_path):
    found = load_expectations(
        _write(tmp_path, 'expectations = [ { id = "test_a.py", status = "skip", reason = "r" } ]\n')
    )
    assert found.entries[0].id == "test_a.py"
    assert load_expectations(_write(tmp_path, "expectations = []\n")).entries == ()


@pytest.mark.parametrize(
    "text,message",
    [
        ('[[expectations]]\nid = "t"\nstatus = "xfail"\n', r"non-empty 'reason' is required"),
        ('[[expectations]]\nid = "t"\nstatus = "xfail"\nreason = "  "\n', r"non-empty 'reason' is required"),
        (
            '[[expectations]]\nid = "t"\nstatus = "fail"\nreason = "r"\n',
            r"'status' must be one of \('xfail', 'skip'\), got 'fail'",
        ),
        ('[[expectations]]\nstatus = "skip"\nreason = "r"\n', r"'id' must be a non-empty test id"),
        ('[[expectations]]\nid = "t"\nstatus = "skip"\nreason = "r"\nwhy = 1\n', r"unknown keys \['why'\]"),
        ('[[expectations]]\nid = "t"\nstatus = "skip"\nreason = "r"\narchs = ["x"]\n', r"spelled 'architectures'"),
        (
            '[[expectations]]\nid = "t"\nstatus = "skip"\nreason = "r"\narchitectures = "gfx942"\n',
            r"'architectures' must be a list",
        ),
        ('[[expectation]]\nid = "t"\n', r"unknown top-level keys \['expectation'\]"),
        ("id = [", r"not valid TOML"),
    ],
)
def test_a_malformed_expectations_file_is_rejected_naming_the_entry(tmp_path, text, message):
    with pytest.raises(InvalidArgumentError, match=message):
        load_expectations(_write(tmp_path, text))


def test_a_missing_expectations_file_is_rejected(tmp_path):
    with pytest.raises(InvalidArgumentError, match=r"cannot read expectations file .*nope.toml"):
        load_expectations(tmp_path / "nope.toml")


def test_architectures_come_from_versions_and_probe_facts():
    assert backend_architectures({"arch": "gfx942"}, {"architectures": ["gfx942", "gfx950"]}) == ("gfx942", "gfx950")
    assert backend_architectures({}, {"arch": "sm_90, sm_80"}) == ("sm_90", "sm_80")
    assert backend_architectures({}, {}) == ()
