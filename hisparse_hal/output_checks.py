"""Checks a command makes before it starts any work: that every output path it was given can be written and
that every optional module a flag needs imports, so a mistyped path or a missing extra fails in a second,
not after a long run.

Invariant: a check creates at most the folders it was asked to write into (and removes the scratch file it
writes to prove a folder writable); it never writes an output file, except one probe byte into a character
device (``/dev/null``, ``/dev/full``), whose "file" is only what a write does.
"""

from __future__ import annotations

import importlib.util
import os
import stat
from pathlib import Path

from .errors import InvalidArgumentError

__all__ = ["writable_directory", "writable_file", "require_module", "EXTRA_INSTALL"]

#: How to install an optional extra from a source checkout (the package is not on a package index).
EXTRA_INSTALL = "pip install -e '.[{extra}]' from the hisparse-hal checkout"


def writable_directory(path: str | os.PathLike[str], option: str) -> Path:
    """Make sure ``path`` is a folder this process can write into, creating it (and its parents) if needed.

    Raises:
        InvalidArgumentError: it is an existing file, cannot be created, or is not writable (the option named).
    """
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise InvalidArgumentError(f"{option} {str(path)!r} is an existing file; give a folder (it is created if "
                                   "missing)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgumentError(f"{option} {str(path)!r} cannot be created: {exc.strerror or exc}") from None
    _probe_write(folder, f"{option} {str(path)!r}")
    return folder


#: Bytes the scratch file of a folder check receives (one page: enough to meet a full file system).
_PROBE_BYTES = 4096


def _probe_write(folder: Path, what: str) -> None:
    """Create and remove a scratch file in ``folder``: permissions alone do not tell (root, read-only mounts,
    ``/proc``)."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".hisparse-write-check-") as probe:
            probe.write(b"\0" * _PROBE_BYTES)  # a full file system refuses data, not always an empty file
            probe.flush()
    except OSError as exc:
        raise InvalidArgumentError(f"{what}: cannot write in {str(folder)!r}: {exc.strerror or exc}") from None


def writable_file(path: str | os.PathLike[str], option: str) -> Path:
    """Make sure ``path`` names a file this process can create or overwrite (its folder is created if needed).

    Raises:
        InvalidArgumentError: it is a folder, its folder cannot be created or written, or the file is read-only.
    """
    target = Path(path)
    if str(path).endswith(os.sep) or target.is_dir():
        raise InvalidArgumentError(f"{option} {str(path)!r} is a folder; give a file name")
    if target.exists():
        try:
            with open(target, "r+b") as existing:
                if stat.S_ISCHR(os.fstat(existing.fileno()).st_mode):  # /dev/full takes the open, not the data
                    existing.write(b"\0")
                    existing.flush()
        except OSError as exc:
            raise InvalidArgumentError(f"{option} {str(path)!r} cannot be written: {exc.strerror or exc}") from None
    parent = target.parent if str(target.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise InvalidArgumentError(f"{option} {str(path)!r}: {str(parent)!r} is a file, not a folder")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgumentError(
            f"{option} {str(path)!r}: its folder cannot be created: {exc.strerror or exc}"
        ) from None
    _probe_write(parent, f"{option} {str(path)!r}")
    return target


def require_module(module: str, extra: str, purpose: str) -> None:
    """Make sure optional ``module`` is installed, for ``purpose`` (``"bench --plot"``).

    Raises:
        InvalidArgumentError: it is not; the message names the extra and how to install it from a checkout.
    """
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise InvalidArgumentError(
            f"{purpose} needs {module}, which is not installed; {EXTRA_INSTALL.format(extra=extra)} "
            f"(or pip install {module})"
        )
