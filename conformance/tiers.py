"""The suite's tiers, read from the tier modules themselves: each ``tests/test_<area>.py`` declares ``AREA``,
``ORDER`` and ``TITLE`` as literal module constants, so a new tier is one file.

The constants are read with ``ast`` from the installed files, not by importing the modules (they import torch and
the backends), so the report and the matrix page know the tiers without loading the suite.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import cast

from hisparse_hal.errors import InvalidArgumentError

__all__ = ["SUITE_FOLDER", "Tier", "read_tiers"]

#: Where the suite's tier modules are installed (beside this module).
SUITE_FOLDER = Path(__file__).resolve().with_name("tests")
#: The constants each tier module declares: the type of each one's value, and that type in words.
_DECLARED = {"AREA": (str, "a string"), "ORDER": (int, "an integer"), "TITLE": (str, "a string")}


@dataclasses.dataclass(frozen=True)
class Tier:
    """One tier: its area (the module's name without ``test_``), its place in the run and its title."""

    area: str
    order: int
    title: str


def _declared(path: Path) -> dict[str, object]:
    """The literal values of the module-level ``AREA``, ``ORDER`` and ``TITLE`` assignments of ``path``."""
    found: dict[str, object] = {}
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, value = node.target.id, node.value
        else:
            continue
        if name in _DECLARED:
            try:
                found[name] = ast.literal_eval(value)
            except ValueError as exc:
                raise InvalidArgumentError(f"{path}: {name} must be a literal, not {ast.unparse(value)!r}") from exc
    return found


def _tier(path: Path) -> Tier:
    declared = _declared(path)
    for name, (kind, words) in _DECLARED.items():
        if name not in declared:
            raise InvalidArgumentError(f"{path}: a tier module declares {name} ({words}); it has none")
        value = declared[name]
        if type(value) is not kind:
            raise InvalidArgumentError(f"{path}: {name} must be {words}, not {value!r}")
    area = path.stem.removeprefix("test_")
    if declared["AREA"] != area:
        raise InvalidArgumentError(f"{path}: AREA {declared['AREA']!r} differs from the module's area {area!r}")
    return Tier(area, cast(int, declared["ORDER"]), cast(str, declared["TITLE"]))


def read_tiers(folder: Path = SUITE_FOLDER) -> tuple[Tier, ...]:
    """Every ``test_*.py`` of ``folder`` as a tier, in ``ORDER``.

    Raises:
        InvalidArgumentError: the folder holds no tier module, a module lacks a constant or declares one that is
            not a literal of its type, an ``AREA`` is not its module's name, or two tiers share an ``ORDER``
            (each names the file).
    """
    paths = sorted(Path(folder).glob("test_*.py"))
    if not paths:
        raise InvalidArgumentError(f"{folder}: no test_*.py tier module")
    tiers = sorted((_tier(path) for path in paths), key=lambda tier: tier.order)
    for before, after in zip(tiers, tiers[1:], strict=False):
        if before.order == after.order:
            raise InvalidArgumentError(f"{folder}: test_{before.area}.py and test_{after.area}.py share ORDER "
                                       f"{after.order}")
    return tuple(tiers)
