"""The command line of every Python child process the package starts, so that the child imports the package
its parent imported (the installed one) and never a same-named source folder in the working directory.

Invariant: the child's ``sys.path`` does not start with the working directory (``-P`` on Python >= 3.11, a
bootstrap that drops that entry before anything is imported on 3.10), and its environment carries
``PYTHONSAFEPATH=1`` so the interpreters it starts in turn (pytest-xdist workers, ``python -c`` probes) are safe too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

__all__ = ["python_command", "python_environment"]

# Python 3.10 has neither -P nor PYTHONSAFEPATH: this runs with ``-c`` (so sys.path[0] is '', the working
# directory), removes that entry first, then runs the module or code the way ``-m`` / ``-c`` would. (An
# interpreter that honours PYTHONSAFEPATH adds no '' entry, and the bootstrap then removes nothing.)
_BOOTSTRAP_310 = (
    "import runpy, sys\n"
    "if sys.path and sys.path[0] == '':\n"
    "    del sys.path[0]\n"
    "kind, target = sys.argv[1], sys.argv[2]\n"
    "del sys.argv[1:3]\n"
    "if kind == '-m':\n"
    "    runpy.run_module(target, run_name='__main__', alter_sys=True)\n"
    "else:\n"
    "    sys.argv[0] = '-c'\n"
    "    exec(compile(target, '<string>', 'exec'), {'__name__': '__main__'})\n"
)


def python_command(*, module: str | None = None, code: str | None = None, args: Sequence[str] = ()) -> list[str]:
    """The argv that runs ``python -m MODULE ARGS`` or ``python -c CODE ARGS`` in this interpreter, safely.

    Args:
        module: a module to run as ``__main__`` (``-m``); exactly one of ``module`` and ``code``.
        code: Python source to run (``-c``).
        args: the child's arguments (its ``sys.argv[1:]``).

    Returns:
        The command line for :func:`subprocess.run` (pass ``env=python_environment()`` as well).

    Raises:
        ValueError: neither or both of ``module`` and ``code`` given.
    """
    if module is not None and code is None:
        kind, target = "-m", module
    elif code is not None and module is None:
        kind, target = "-c", code
    else:
        raise ValueError(f"python_command needs exactly one of module and code, got module={module!r}, code={code!r}")
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", kind, target, *args]
    return [sys.executable, "-c", _BOOTSTRAP_310, kind, target, *args]


def python_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child started with :func:`python_command`.

    Args:
        base: the environment to start from (default: this process's).

    Returns:
        A copy of ``base`` with ``PYTHONSAFEPATH=1`` (honoured from Python 3.11 by the child's own children).
    """
    env = dict(os.environ if base is None else base)
    env["PYTHONSAFEPATH"] = "1"
    return env
