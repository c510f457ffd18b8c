"""The ``hisparse-hal`` console script's entry: it takes SIGINT and SIGTERM before the package (and torch) is
imported, so an interrupt in the first seconds is one line and exit 130, like one at any later moment.

It lives outside the package because importing anything in ``hisparse_hal`` imports torch first.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

__all__ = ["main"]


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main() -> int:
    """Run ``hisparse_hal.cli.main``; an interrupt while it is being imported exits 130 with one line."""
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        from hisparse_hal.cli import main as cli_main
    except KeyboardInterrupt as exc:
        print(f"\nhisparse-hal: interrupted ({str(exc) or 'SIGINT'}) while starting; nothing was done", file=sys.stderr)
        return 130
    return cli_main()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
