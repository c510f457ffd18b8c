"""``python -m hisparse_hal``: the ``hisparse-hal`` command (the same subcommands, options and exit codes)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
