"""Expected failures and skips a vendor declares for the conformance suite, read from TOML.

Invariant: every entry names a test id or id prefix, a status (``xfail`` or ``skip``) and a non-empty
reason; an entry limited to architectures applies only where the backend reports one of them. A
malformed file is an error, never silently ignored.

File format (``vendors/<name>/expectations.toml``)::

    [[expectations]]
    id = "test_ipc.py::test_ipc_event_survives_1000_record_wait_cycles"   # exact id or prefix
    status = "xfail"                                                      # or "skip"
    reason = "ROCm 7.2.x emulates IPC events with a 32-slot ring (vLLM #57602)"
    architectures = ["gfx942", "gfx950"]                                  # optional
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hisparse_hal.errors import InvalidArgumentError

__all__ = ["Expectation", "Expectations", "load_expectations", "backend_architectures"]

STATUSES = ("xfail", "skip")
_KEYS = {"id", "status", "reason", "architectures"}


def _toml_loads(text: str, source: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib as toml
    else:
        try:
            import tomli as toml
        except ModuleNotFoundError:
            raise InvalidArgumentError(
                f"reading expectations file {source} needs Python >= 3.11 (tomllib) or the 'tomli' "
                "package; install tomli or run the suite without --expectations"
            ) from None
    try:
        return toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise InvalidArgumentError(f"expectations file {source} is not valid TOML: {exc}") from exc


@dataclasses.dataclass(frozen=True)
class Expectation:
    """One entry: tests whose id equals or starts with ``id`` get ``status`` with ``reason``."""

    id: str
    status: str
    reason: str
    architectures: tuple[str, ...] = ()
    source: str = ""

    def matches(self, test_id: str) -> bool:
        """Whether ``test_id`` is this entry's id or starts with it."""
        return test_id == self.id or test_id.startswith(self.id)

    def applies_to(self, architectures: Iterable[str]) -> bool:
        """Whether the entry applies on a backend reporting ``architectures`` (always when unlimited)."""
        return not self.architectures or bool(set(self.architectures) & set(architectures))

    def describe(self) -> str:
        """The reason, with where it came from and its architectures."""
        arch = f" [{', '.join(self.architectures)}]" if self.architectures else ""
        return f"{self.reason} (expectations {self.source}{arch})"


@dataclasses.dataclass(frozen=True)
class Expectations:
    """Every entry of one file, in file order."""

    entries: tuple[Expectation, ...] = ()
    source: str = ""

    def lookup(self, test_id: str, architectures: Iterable[str]) -> Expectation | None:
        """The most specific (longest id) entry matching ``test_id`` on these architectures."""
        archs = tuple(architectures)
        found = [e for e in self.entries if e.matches(test_id) and e.applies_to(archs)]
        return max(found, key=lambda e: len(e.id)) if found else None

    def unmatched(self, test_ids: Iterable[str]) -> list[Expectation]:
        """Entries that match none of ``test_ids`` (stale ids, typos), in file order."""
        ids = list(test_ids)
        return [e for e in self.entries if not any(e.matches(t) for t in ids)]

    def needs_architectures(self) -> bool:
        """Whether any entry is limited to architectures (so the backend's must be known)."""
        return any(e.architectures for e in self.entries)


def load_expectations(path: str | Path) -> Expectations:
    """Read and check an expectations file.

    Args:
        path: the TOML file.

    Returns:
        Its entries.

    Raises:
        InvalidArgumentError: the file is missing or not TOML, or an entry lacks an id, has an unknown
            status or key, or an empty reason (naming the entry's position).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read expectations file {path}: {exc}") from exc
    data = _toml_loads(text, str(path))
    unknown_top = set(data) - {"expectations"}
    if unknown_top:
        raise InvalidArgumentError(
            f"expectations file {path}: unknown top-level keys {sorted(unknown_top)}; "
            "write entries as [[expectations]] tables (or expectations = [ {...}, ... ])"
        )
    raw = data.get("expectations", [])
    if not isinstance(raw, list):
        raise InvalidArgumentError(
            f"expectations file {path}: 'expectations' must be an array of tables ([[expectations]])"
        )
    entries = [_entry(item, n, path) for n, item in enumerate(raw, start=1)]
    return Expectations(tuple(entries), str(path))


def _entry(item: object, n: int, path: Path) -> Expectation:
    where = f"expectations file {path}, entry {n}"
    if not isinstance(item, Mapping):
        raise InvalidArgumentError(f"{where}: must be a table, got {type(item).__name__}")
    unknown = set(item) - _KEYS
    if "archs" in unknown:
        raise InvalidArgumentError(
            f"{where}: unknown key 'archs'; the list of architectures is spelled 'architectures'"
        )
    if unknown:
        raise InvalidArgumentError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_KEYS)}")
    test_id = item.get("id")
    if not isinstance(test_id, str) or not test_id.strip():
        raise InvalidArgumentError(f"{where}: 'id' must be a non-empty test id or prefix, got {test_id!r}")
    status = item.get("status")
    if status not in STATUSES:
        raise InvalidArgumentError(f"{where} ({test_id!r}): 'status' must be one of {STATUSES}, got {status!r}")
    reason = item.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidArgumentError(f"{where} ({test_id!r}): a non-empty 'reason' is required, got {reason!r}")
    archs = item.get("architectures", [])
    if not isinstance(archs, list) or not all(isinstance(a, str) and a for a in archs):
        raise InvalidArgumentError(f"{where} ({test_id!r}): 'architectures' must be a list of names, got {archs!r}")
    return Expectation(test_id.strip(), status, reason.strip(), tuple(archs), str(path))


def backend_architectures(versions: Mapping[str, Any], facts: Mapping[str, Any]) -> tuple[str, ...]:
    """Architecture names a backend reports: ``versions["arch"]`` and the probe's ``arch``/``architectures`` facts."""
    found: list[str] = []
    for source in (versions, facts):
        for key in ("arch", "architectures", "archs"):
            value = source.get(key)
            if isinstance(value, str):
                found.extend(part.strip() for part in value.split(",") if part.strip())
            elif isinstance(value, (list, tuple)):
                found.extend(str(part) for part in value)
    return tuple(dict.fromkeys(found))
