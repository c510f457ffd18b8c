"""Which part of the suite a conformance run selected (``-k``, ``-m``, a named subset, further pytest arguments and
positional paths) and the counts the report records under ``selection``. A run that selected less than the whole
suite is never ``full_suite``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .report import AREAS, area_of

__all__ = ["Selection"]

#: The suite's package, as the runner hands it to pytest (``--pyargs``).
SUITE_PACKAGE = f"{__package__}.tests"


class Selection:
    """Which part of the suite a run selected: ``-k``, ``-m``, the runner's further pytest arguments, and the
    counts of selected and deselected tests (tests a crash-resumed run already recorded are not deselected)."""

    def __init__(self, config: pytest.Config) -> None:
        self.keyword = config.getoption("keyword", "") or ""
        self.markexpr = config.getoption("markexpr", "") or ""
        self.pytest_args = config.getoption("hal_pytest_args") or ""
        self.subset = config.getoption("hal_subset") or None  # a named subset (conformance/subsets.py)
        # pytest's own positional arguments: the runner's are the suite's package; a direct `pytest FILE` names less.
        self.paths = [arg for arg in config.args if not _is_whole_suite(arg)]
        self.selected_ids: list[str] = []
        self.deselected = 0

    def narrowing_args(self) -> list[str]:
        """Further pytest arguments that run less than the suite: paths, node ids, ``--deselect`` and the like."""
        import shlex

        narrowing = ("--deselect", "--ignore", "--ignore-glob", "--lf", "--last-failed", "--sw", "--stepwise",
                     "--stepwise-skip", "-x", "--exitfirst", "--maxfail")
        try:
            words = shlex.split(self.pytest_args)
        except ValueError:
            return [self.pytest_args]
        return self.paths + [w for w in words if not w.startswith("-") or w.split("=", 1)[0] in narrowing]

    def as_dict(self) -> dict[str, Any]:
        """The ``selection`` entry of ``results.json``."""
        areas = sorted({area_of(i) for i in self.selected_ids}, key=lambda a: AREAS.index(a) if a in AREAS else 99)
        full = not (self.keyword or self.markexpr or self.subset or self.deselected or self.narrowing_args())
        per_area: dict[str, int] = {}
        for test_id in self.selected_ids:
            per_area[area_of(test_id)] = per_area.get(area_of(test_id), 0) + 1
        return {"keyword": self.keyword or None, "markexpr": self.markexpr or None, "subset": self.subset,
                "pytest_args": self.pytest_args or None, "selected": len(self.selected_ids),
                "deselected": self.deselected, "areas": areas, "full_suite": full,
                "per_area": {a: per_area[a] for a in areas}}


def _is_whole_suite(arg: str) -> bool:
    """Whether a pytest positional argument names the whole suite: its package or its tests folder."""
    if arg == SUITE_PACKAGE:
        return True
    return Path(arg).resolve() == Path(__file__).resolve().with_name("tests")
