"""docs/conformance.md lists every area a report has, in tier order: its tier sentence and its "What it proves"
table both equal ``report.AREAS``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hisparse_hal.conformance import report

PAGE = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"


def tier_sentence_areas(text: str) -> list[str]:
    """The code-formatted names of the sentence that starts ``Tests run in area order:``."""
    found = re.search(r"Tests run in area order:(.*?)These are the areas", text, re.S)
    if found is None:
        raise AssertionError("docs/conformance.md has no 'Tests run in area order: ... These are the areas' paragraph")
    return re.findall(r"`([a-z_]+)`", found.group(1))


def table_areas(text: str) -> list[str]:
    """The first column of the table under ``| Area | What it proves |``."""
    found = re.search(r"^\| Area \| What it proves \|\n\|---\|---\|\n((?:\|.*\n)+)", text, re.M)
    if found is None:
        raise AssertionError("docs/conformance.md has no '| Area | What it proves |' table")
    return [row.split("|")[1].strip() for row in found.group(1).splitlines()]


@pytest.mark.parametrize("reader", [tier_sentence_areas, table_areas], ids=["tier sentence", "table"])
def test_the_page_lists_every_area_of_the_report_in_tier_order(reader) -> None:
    documented = reader(PAGE.read_text())
    assert "cache_ops" in documented
    assert documented == list(report.AREAS), f"docs/conformance.md: {documented}"


def test_the_readers_catch_a_missing_area() -> None:
    text = PAGE.read_text().replace("`cache_ops`, ", "").replace("\n| cache_ops |", "\n| cache ops |")
    assert tier_sentence_areas(text) != list(report.AREAS)
    assert table_areas(text) != list(report.AREAS)
