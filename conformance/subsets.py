"""Named subsets of the suite: a fixed selection a run asks for by name (``conformance --subset NAME``), recorded in
its report. A subset is never conformant (``verify`` needs the whole suite); it is a quick first gate, as PJRT's
integration guide gives a new plugin three framework-level smoke checks before the full tests."""

from __future__ import annotations

import dataclasses

from hisparse_hal.errors import InvalidArgumentError

__all__ = ["Subset", "SUBSETS", "subset_named"]


@dataclasses.dataclass(frozen=True)
class Subset:
    """One named subset: the pytest marker its tests carry and what it is for."""

    name: str
    marker: str
    purpose: str


SUBSETS: dict[str, Subset] = {
    "smoke": Subset(
        "smoke",
        "smoke",
        "a first gate for a new backend, in seconds: one test per area that moves bytes (a swap batch across a chunk "
        "boundary, gathers against the reference, a pin round trip, a captured replay, an IPC event across "
        "processes, a decode step of the cache ops against the oracle, a two-rank shared-pool run) and the probe "
        "tier's identity checks",
    ),
}


def subset_named(name: str) -> Subset:
    """The subset called ``name``.

    Raises:
        InvalidArgumentError: no subset has that name (the message lists the known ones).
    """
    try:
        return SUBSETS[name]
    except KeyError:
        raise InvalidArgumentError(f"--subset {name!r} is not a named subset of the suite; known: "
                                   f"{', '.join(sorted(SUBSETS))}") from None
