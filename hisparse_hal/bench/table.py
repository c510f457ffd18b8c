"""One table and JSON writer for every benchmark: fixed-width columns for the terminal, a JSON file beside it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["Column", "format_header", "format_row", "format_table", "write_json", "InterruptedWithFigures"]


class InterruptedWithFigures(KeyboardInterrupt):
    """An interrupt of a benchmark that kept what it had measured; ``kept`` says where, for the command's one
    line (``str()`` is the signal's name, as for a plain interrupt)."""

    def __init__(self, how: str, kept: str) -> None:
        super().__init__(how)
        self.kept = kept


@dataclasses.dataclass(frozen=True)
class Column:
    """One column: its header, its width, and how a row's value becomes text (right-aligned).

    ``value`` takes the row and returns what ``spec`` formats, e.g. ``Column("GB/s", 8, lambda f: f.gbps, ".2f")``.
    """

    header: str
    width: int
    value: Callable[[Any], object]
    spec: str = ""
    align: str = ">"

    def cell(self, row: object) -> str:
        """The row's value formatted and aligned to the column's width."""
        return f"{format(self.value(row), self.spec):{self.align}{self.width}}"


def format_header(columns: Sequence[Column]) -> str:
    """The header line, columns separated by one space."""
    return " ".join(f"{c.header:{c.align}{c.width}}" for c in columns)


def format_row(columns: Sequence[Column], row: object) -> str:
    """One row's line (for tables printed as their rows are measured)."""
    return " ".join(c.cell(row) for c in columns)


def format_table(columns: Sequence[Column], rows: Iterable[object]) -> list[str]:
    """The header line and one line per row."""
    return [format_header(columns), *(format_row(columns, row) for row in rows)]


def write_json(path: str, payload: Mapping[str, Any]) -> None:
    """Write ``payload`` as indented JSON; values JSON cannot hold (devices, dtypes) are written as text."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2, default=str)
        handle.write("\n")
