"""HiSparse per-step cache ops (vLLM 0.34.0's four ``hisparse_*`` ops) as portable implementations.

Invariant: every implementation (``oracle``, ``torch_impl``, ``host_impl``, ``triton_impl``) exposes the same
four functions with vLLM 0.34.0's positional signatures (:mod:`.signatures`), checks them with
:mod:`.arguments` first, and produces bit-identical outputs and state; ``oracle`` defines them. Semantics:
docs/design/cache-ops.md.
"""

from __future__ import annotations

# Importing ``library`` defines torch.ops.hisparse_hal.* (idempotent). This folder holds the runtime ops only: the
# generated decode sequences are hisparse_hal.testing.sequences, the offline kernel tools hisparse_hal.kernels.
from . import arguments, host_impl, library, oracle, signatures, tables, torch_impl

__all__ = ["arguments", "host_impl", "library", "oracle", "signatures", "tables", "torch_impl"]
