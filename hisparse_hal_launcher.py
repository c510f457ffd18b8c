"""The ``hisparse-hal`` console script's entry: it takes SIGINT and SIGTERM before the package (and torch) is
imported, so an interrupt in the first seconds is one line and exit 130, like one at any later moment.

It lives outside the package because importing anything in ``hisparse_hal`` imports torch first. So that
``--help`` and a usage error need no torch, it loads the package without running its ``__init__`` and leaves
that to ``hisparse_hal.cli.main``, which runs it once the command line is parsed.
"""

from __future__ import annotations

import importlib.util
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
        _defer_package_init()
        from hisparse_hal.cli import main as cli_main
    except KeyboardInterrupt as exc:
        print(f"\nhisparse-hal: interrupted ({str(exc) or 'SIGINT'}) while starting; nothing was done", file=sys.stderr)
        return 130
    return cli_main()


def _defer_package_init() -> None:
    """Put ``hisparse_hal`` in ``sys.modules`` without running its ``__init__``; ``_deferred_init`` runs it
    (into the same module object, so submodules imported meanwhile stay its attributes)."""
    if "hisparse_hal" in sys.modules:
        return
    spec = importlib.util.find_spec("hisparse_hal")
    if spec is None or spec.loader is None:
        return  # not installed: the import below says so
    package = importlib.util.module_from_spec(spec)
    sys.modules["hisparse_hal"] = package

    def run_init() -> None:
        assert spec.loader is not None
        spec.loader.exec_module(package)

    package.__dict__["_deferred_init"] = run_init


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
