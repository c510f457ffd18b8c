"""The README's shell commands by label, so CI runs exactly the text a reader copies (they cannot drift).

Usage: ``python ci/readme_commands.py LABEL`` prints the ``sh`` block that follows ``<!-- ci: LABEL -->`` in
README.md. Invariant: each label marks exactly one block; an unknown or repeated label exits non-zero.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["README", "commands", "main"]

README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"<!-- ci: ([\w-]+) -->\s*\n```sh\n(.*?)\n```", re.S)


def commands(text: str) -> dict[str, str]:
    """Label -> command text of every marked ``sh`` block.

    Raises:
        SystemExit: a label marks two blocks.
    """
    found: dict[str, str] = {}
    for label, body in _BLOCK.findall(text):
        if label in found:
            raise SystemExit(f"readme_commands: label {label!r} marks two blocks in the README")
        found[label] = body.strip()
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Print the command of one label."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        raise SystemExit("usage: python ci/readme_commands.py LABEL")
    found = commands(README.read_text(encoding="utf-8"))
    if args[0] not in found:
        raise SystemExit(f"readme_commands: no block labelled {args[0]!r} in {README}; labels: {sorted(found)}")
    print(found[args[0]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
