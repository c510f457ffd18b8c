"""The contracts the conformance suite can hold a backend to, and which of the suite's tests each one takes.

Invariant: a run tests exactly one contract, named in its report; a test marked ``hal_extension`` uses a
member hisparse-hal's interface adds to vLLM's (``capture()``, ``host_registration``, ...) and belongs only to the
hisparse-hal contract. Each contract has a committed must-pass list (``mustpass/<id>.txt``) that ``verify`` reads.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hisparse_hal.errors import InvalidArgumentError

__all__ = ["Contract", "CONTRACTS", "HAL_CONTRACT", "VLLM_034_CONTRACT", "contract_named", "MUSTPASS_DIR"]

#: The folder of the committed must-pass lists, one ``<contract id>.txt`` each.
MUSTPASS_DIR = Path(__file__).with_name("mustpass")


@dataclasses.dataclass(frozen=True)
class Contract:
    """One interface the suite tests.

    Attributes:
        id: short stable name, used in reports and as the must-pass list's file name.
        title: what a person reads in a report ("vllm 0.34.0 HiSparseBackend").
        excludes_marker: tests carrying this marker are not part of the contract (not collected, not a
            partial run); None: every test of the suite is.
    """

    id: str
    title: str
    excludes_marker: str | None

    @property
    def mustpass_path(self) -> Path:
        """The committed must-pass list of this contract."""
        return MUSTPASS_DIR / f"{self.id}.txt"

    def as_dict(self) -> dict[str, str | None]:
        """The ``contract`` entry of ``results.json``."""
        return {"id": self.id, "title": self.title}


#: hisparse-hal's own backend interface: vLLM 0.34.0's 14 members and hisparse-hal's extensions.
HAL_CONTRACT = Contract("hisparse-hal-1", "hisparse-hal HiSparseBackend 1 (vLLM 0.34.0's members and "
                        "hisparse-hal's extensions)", None)
#: vLLM 0.34.0's ``vllm.v1.hisparse.backend.HiSparseBackend`` (backend.py:20-79) as vLLM builds and calls it.
VLLM_034_CONTRACT = Contract("vllm-0.34.0", "vllm 0.34.0 HiSparseBackend", "hal_extension")

CONTRACTS: dict[str, Contract] = {c.id: c for c in (HAL_CONTRACT, VLLM_034_CONTRACT)}


def contract_named(contract_id: str) -> Contract:
    """The contract with this id.

    Raises:
        InvalidArgumentError: no such contract (the message lists the known ones).
    """
    try:
        return CONTRACTS[contract_id]
    except KeyError:
        raise InvalidArgumentError(
            f"unknown conformance contract {contract_id!r}; known: {sorted(CONTRACTS)}"
        ) from None
