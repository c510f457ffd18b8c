"""What a device call would carry: the working tree (tracked and untracked-not-ignored files) plus the ignored
paths named to carry, their total size against the device tool's 64 MiB limit.

Usage: python ci/carried_size.py [--limit-mib 64] CARRY...   (paths relative to the repository root)
Prints every carried path's files with their sizes, the tree's file count and size, and the total; exits 1 when
the total is over the limit or a carried path is missing, 0 otherwise.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

LIMIT_MIB = 64
ROOT = Path(__file__).resolve().parents[1]


def tree_files(root: Path) -> list[Path]:
    """Tracked and untracked-not-ignored files that exist under ``root`` (what travels without ``carry``)."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True).stdout.decode().split("\0")
    return sorted({root / name for name in listed if name and (root / name).is_file()})


def carried_files(root: Path, carry: list[str]) -> dict[str, list[Path]]:
    """Each carried path's files (a file is its own list; a missing path has none)."""
    found = {}
    for name in carry:
        path = root / name
        found[name] = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else (
            [path] if path.is_file() else [])
    return found


def report(root: Path, carry: list[str], limit_mib: int = LIMIT_MIB) -> tuple[list[str], bool]:
    """The lines to print and whether the call would fit (every carried path present, total within the limit)."""
    lines = []
    carried = carried_files(root, carry)
    ok = True
    carried_bytes = 0
    for name, files in carried.items():
        if not files:
            lines.append(f"carry {name}: MISSING")
            ok = False
        for path in files:
            size = path.stat().st_size
            carried_bytes += size
            lines.append(f"carry {path.relative_to(root)} {size}")
    tree = tree_files(root)
    tree_bytes = sum(p.stat().st_size for p in tree)
    total = tree_bytes + carried_bytes
    fits = total <= limit_mib * 2**20
    lines.append(f"working tree: {len(tree)} files, {tree_bytes} bytes; carried: {carried_bytes} bytes")
    lines.append(f"total {total} bytes = {total / 2**20:.2f} MiB of {limit_mib} MiB: {'fits' if fits else 'TOO LARGE'}")
    return lines, ok and fits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("carry", nargs="*")
    parser.add_argument("--limit-mib", type=int, default=LIMIT_MIB)
    parser.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    lines, ok = report(args.root, args.carry, args.limit_mib)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
