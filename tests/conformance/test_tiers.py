"""The suite's tiers come from the tier modules' own AREA, ORDER and TITLE: the installed suite's order, a new
tier picked up from one file in a copy of the suite, and a typed error naming the file for each bad declaration."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hisparse_hal.conformance import report, tiers
from hisparse_hal.errors import InvalidArgumentError

#: The tier order the reports, the matrix page and docs/conformance.md have always had.
ORDER = ["probe", "surface", "swaps", "gathers", "pinning", "config", "stats", "capture", "ipc", "cache_ops",
         "scenario", "claims"]


def _tier_module(folder: Path, area: str, declarations: str) -> Path:
    path = folder / f"test_{area}.py"
    path.write_text(f'"""A tier."""\n\nimport pytest\n\n{declarations}\n\ndef test_x():\n    pass\n')
    return path


def test_the_installed_suite_declares_every_tier_in_the_run_order():
    found = tiers.read_tiers()
    assert [tier.area for tier in found] == ORDER
    assert sorted(path.stem for path in tiers.SUITE_FOLDER.glob("test_*.py")) == sorted(f"test_{a}" for a in ORDER)
    assert report.AREAS == tuple(ORDER)
    assert report.AREA_TITLES["config"] == "KV config and views" and report.AREA_TITLES["ipc"] == "IPC events"
    assert list(report.AREA_TITLES) == ORDER


def test_a_new_tier_in_a_copy_of_the_suite_is_one_file(tmp_path):
    suite = tmp_path / "tests"
    shutil.copytree(tiers.SUITE_FOLDER, suite, ignore=shutil.ignore_patterns("__pycache__"))
    _tier_module(suite, "events", 'AREA = "events"\nORDER = 85\nTITLE = "Device events"')
    found = tiers.read_tiers(suite)
    areas = [tier.area for tier in found]
    assert areas == [*ORDER[:8], "events", *ORDER[8:]]
    assert found[8] == tiers.Tier("events", 85, "Device events")


@pytest.mark.parametrize("declarations, message", [
    ('ORDER = 10\nTITLE = "X"', "declares AREA (a string); it has none"),
    ('AREA = "x"\nTITLE = "X"', "declares ORDER (an integer); it has none"),
    ('AREA = "x"\nORDER = "10"\nTITLE = "X"', "ORDER must be an integer, not '10'"),
    ('AREA = "x"\nORDER = True\nTITLE = "X"', "ORDER must be an integer, not True"),
    ('AREA = "x"\nORDER = 10\nTITLE = str(1)', "TITLE must be a literal, not 'str(1)'"),
    ('AREA = "y"\nORDER = 10\nTITLE = "X"', "AREA 'y' differs from the module's area 'x'"),
])
def test_a_bad_declaration_is_a_typed_error_naming_the_file(tmp_path, declarations, message):
    path = _tier_module(tmp_path, "x", declarations)
    with pytest.raises(InvalidArgumentError) as caught:
        tiers.read_tiers(tmp_path)
    assert str(path) in str(caught.value) and message in str(caught.value)


def test_two_tiers_in_one_place_and_an_empty_folder_are_refused(tmp_path):
    with pytest.raises(InvalidArgumentError, match="no test_\\*.py tier module"):
        tiers.read_tiers(tmp_path)
    _tier_module(tmp_path, "a", 'AREA = "a"\nORDER = 10\nTITLE = "A"')
    _tier_module(tmp_path, "b", 'AREA = "b"\nORDER = 10\nTITLE: str = "B"')
    with pytest.raises(InvalidArgumentError, match="test_a.py and test_b.py share ORDER 10"):
        tiers.read_tiers(tmp_path)
