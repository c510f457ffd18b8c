"""HiSparse per-step cache ops (vLLM 0.33.0's four ``hisparse_*`` ops) as portable implementations.

Invariant: every implementation (``oracle``, ``torch_impl``, ``host_impl``, ``triton_impl``) takes the same
arguments, checks them with :mod:`.arguments` first, and produces bit-identical outputs and state; ``oracle``
defines them. Semantics: docs/design/cache-ops.md.
"""

from __future__ import annotations

# Importing ``library`` defines torch.ops.hisparse_hal.* (idempotent).
from . import arguments, host_impl, library, oracle, sequences, torch_impl

__all__ = ["arguments", "host_impl", "library", "oracle", "sequences", "torch_impl"]
