"""The contracts the conformance suite can hold a backend to, which of the suite's tests each one takes, and how a
test asserts a refusal under each (:func:`refused`).

Invariant: a run tests exactly one contract, named in its report. ``hisparse-hal-1`` takes every test, with typed
refusals (the exact ``hisparse_hal.errors`` type and message). ``vllm-0.34.0`` takes every test not marked
``hal_extension``: a test is marked so when it goes beyond what vLLM 0.34.0's ``HiSparseBackend`` defines, either by
using a member hisparse-hal adds (``capture()``, ``host_registration``, ...) or by asserting a behaviour vLLM's
members do not promise (a refusal vLLM's default hooks or raw-pointer swaps do not make: bad layouts, formats,
regions, row ids). Under it a refusal is any exception, except where vLLM catches one type (``unpin_tensor``:
RuntimeError, runtime.py:372-374; ``check_available``: RuntimeError, runtime.py:557-562), and must still leave
everything as it was. Each contract has a committed must-pass list (``mustpass/<id>.txt``) that ``verify`` reads.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hisparse_hal.errors import InvalidArgumentError

__all__ = ["Contract", "CONTRACTS", "HAL_CONTRACT", "VLLM_034_CONTRACT", "contract_named", "contract_of_backend",
           "refused", "typed_refusals", "MUSTPASS_DIR"]

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
        typed_refusals: whether a refusal must be hisparse-hal's typed error with its message (see :func:`refused`).
    """

    id: str
    title: str
    excludes_marker: str | None
    typed_refusals: bool = True

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
VLLM_034_CONTRACT = Contract("vllm-0.34.0", "vllm 0.34.0 HiSparseBackend", "hal_extension", typed_refusals=False)

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


def contract_of_backend(backend: Any) -> Contract:
    """The contract a backend under test is held to: the vLLM contract for the suite's view of a ``--vllm-backend``
    class, hisparse-hal's for everything else."""
    from .vllm_contract import VllmContractView

    return VLLM_034_CONTRACT if isinstance(backend, VllmContractView) else HAL_CONTRACT


def typed_refusals(backend: Any) -> bool:
    """Whether ``backend``'s contract requires hisparse-hal's typed errors and messages (see :func:`refused`)."""
    return contract_of_backend(backend).typed_refusals


def refused(backend: Any, error: type[BaseException] | tuple[type[BaseException], ...], match: str | None = None,
            *, vllm_error: type[BaseException] = Exception) -> Any:
    """``pytest.raises`` for a call that must be refused, as strict as ``backend``'s contract.

    hisparse-hal's contract: exactly ``pytest.raises(error, match=match)``. vLLM's: any ``vllm_error`` (any
    exception unless vLLM catches one type, e.g. ``RuntimeError`` for ``unpin_tensor``), message unchecked. Either
    way the test's own checks after the refusal (canaries, data, nothing registered) still run; checks of the
    error's type or fields go under ``if typed_refusals(backend)``.
    """
    import pytest

    if typed_refusals(backend):
        return pytest.raises(error, match=match)
    return pytest.raises(vllm_error)
