"""The options of ``hisparse-hal bench`` and their defaults, in a module that imports no torch, so that
``hisparse-hal bench --help`` and a usage error are answered at once. Their values are checked in
:mod:`hisparse_hal.bench.arguments`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

__all__ = ["add_options", "add_cache_ops_options", "add_pinning_options", "Given", "GivenFlag", "MODE_OPTIONS",
           "DEFAULT_REQUESTS", "DEFAULT_QUERIES", "DEFAULT_CHUNKS"]

DEFAULT_REQUESTS = (64, 128, 512)
DEFAULT_QUERIES = (1, 2, 4)  # token rows per request: plain decode and MTP with 1 and 3 draft tokens
#: The chunk caps ``--pinning`` times by default: 4 KiB, 64 KiB and 2 MiB.
DEFAULT_CHUNKS = (4 << 10, 64 << 10, 2 << 20)

#: The benchmark modes (one per run; none: the swap benchmark) and the options only that mode reads.
MODE_OPTIONS = {
    "--cache-ops": ("--requests", "--queries", "--context", "--no-oracle"),
    "--pinning": ("--pin-mib", "--pin-chunks"),
    "--submission": (),
    None: ("--swap-mib", "--plot"),
}


class Given(argparse._StoreAction):
    """``store``, also recording the option in ``namespace.given`` (so a mode's option given without its mode
    is refused, even when its value equals the default)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        namespace.given = {*getattr(namespace, "given", ()), self.option_strings[-1]}


class GivenFlag(argparse._StoreTrueAction):
    """``store_true``, also recording the option in ``namespace.given``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        namespace.given = {*getattr(namespace, "given", ()), self.option_strings[-1]}


def add_options(parser: argparse.ArgumentParser) -> None:
    """Every option of ``hisparse-hal bench`` (each mode's)."""
    parser.add_argument("--backend", default=None, help="backend name (strict); default: the selected one")
    parser.add_argument("--swap-mib", type=int, default=64, action=Given,
                        help="bytes per swap case, in MiB (default 64)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed repeats per path, median reported (default 5; --submission uses at least 50)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--plot", default=None, metavar="FILE.png", action=Given,
                        help="also draw swap GB/s against block size (needs the [plot] extra: matplotlib)")
    parser.add_argument("--submission", action="store_true",
                        help="instead: host cost from swap_blocks_batch to the vendor batch call, through the "
                        "SIMULATED CUDA driver and HIP runtime of a source checkout, beside plain Python marshalling "
                        "(raises --repeats to at least 50)")
    add_cache_ops_options(parser)
    add_pinning_options(parser)


def add_cache_ops_options(parser: argparse.ArgumentParser) -> None:
    """The options ``hisparse-hal bench`` gains for the cache ops (``--cache-ops``)."""
    parser.add_argument("--cache-ops", action="store_true",
                        help="benchmark the cache ops' decode step (oracle, host, torch, triton) instead")
    parser.add_argument("--requests", default=",".join(map(str, DEFAULT_REQUESTS)), action=Given,
                        help="comma-separated request counts for --cache-ops (default 64,128,512)")
    parser.add_argument("--queries", default=",".join(map(str, DEFAULT_QUERIES)), action=Given,
                        help="comma-separated token rows per request for --cache-ops (default 1,2,4; hot slots "
                             "(Q + 1) x top-k)")
    parser.add_argument("--context", type=int, default=8192, action=Given,
                        help="tokens of context per request (--cache-ops; default 8192)")
    parser.add_argument("--no-oracle", action=GivenFlag, help="skip the slow oracle (--cache-ops)")


def add_pinning_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``bench --pinning``."""
    parser.add_argument("--pinning", action="store_true",
                        help="instead: time pin_tensor and unpin_tensor of one host pool at several chunk sizes")
    parser.add_argument("--pin-mib", type=int, default=1024, action=Given,
                        help="pool size for --pinning, in MiB (default 1024)")
    parser.add_argument("--pin-chunks", default=",".join(str(c) for c in DEFAULT_CHUNKS), action=Given,
                        help="comma-separated chunk caps in bytes for --pinning (default 4096,65536,2097152)")
