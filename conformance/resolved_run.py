"""What one conformance run resolves once: the backend recipe, its class, the expectations file and the probes.

Invariant: the runner resolves a run and writes it to ``run.json``; the pytest child (``--hal-run``) and its xdist
workers read it, so a run scans the entry points and probes each backend once, in the runner. A pytest process
started without ``--hal-run`` resolves it itself, once, and hands it to its workers.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path
from typing import Any

from hisparse_hal.backend import HiSparseBackend
from hisparse_hal.errors import BackendUnavailableError, InvalidArgumentError
from hisparse_hal.registry import ProbeResult, probe_backends, select_backend

from .contracts import HAL_CONTRACT, VLLM_034_CONTRACT, Contract, contract_named
from .qualnames import load_factory
from .recipe import BackendRecipe, vendor_expectations_path

__all__ = ["ResolvedRun", "expectations_for_class"]


def expectations_for_class(backend_class: type) -> str | None:
    """The vendor's ``expectations.toml`` for ``backend_class`` as a path, None when its vendor keeps none."""
    found = vendor_expectations_path(backend_class)
    return str(found) if found else None


@dataclasses.dataclass(frozen=True)
class ResolvedRun:
    """The resolved facts of one conformance run, JSON-ready.

    Attributes:
        recipe: how every process of the run builds the backend (a registry name or a factory).
        backend_class: ``"module:Class"`` of the chosen registry backend (None for a factory).
        expectations: the expectations file (None: none).
        expectations_pending: the recipe is a factory function, so the file is known only once it has built
            the backend (:meth:`with_expectations_of`).
        probes: ``ProbeResult.as_dict()`` of every registered backend, highest priority first.
        contract: the id of the contract the run tests (:mod:`.contracts`): ``vllm-0.34.0`` for a vLLM class,
            ``hisparse-hal-1`` otherwise.
    """

    recipe: BackendRecipe
    backend_class: str | None
    expectations: str | None
    expectations_pending: bool
    probes: tuple[dict[str, Any], ...]
    contract: str = HAL_CONTRACT.id

    @classmethod
    def resolve(cls, backend: str | None = None, factory: str | None = None,
                expectations: str | None = None, vllm_class: str | None = None) -> ResolvedRun:
        """Probe once, select the backend (or check the factory or vLLM class) and decide the expectations file.

        Args:
            backend: ``--backend`` (strict); None with no factory: what ``get_backend()`` selects.
            factory: ``--factory``, ``"module:callable"``.
            expectations: ``--expectations``: a file, ``"none"``, or None for the vendor's own file.
            vllm_class: ``--vllm-backend``, ``"module:Class"`` implementing vLLM 0.34.0's ``HiSparseBackend``
                (the run tests the ``vllm-0.34.0`` contract).

        Raises:
            InvalidArgumentError: more than one of a backend, a factory and a vLLM class; a factory that cannot be
                loaded; a vLLM class that is not one (or vLLM missing).
            BackendUnavailableError: the backend is unknown or unavailable (the message has the probe table).
        """
        named = (("a backend name", backend), ("a factory", factory), ("a vLLM class", vllm_class))
        given = [f"{what} ({value!r})" for what, value in named if value is not None]
        if len(given) > 1:
            raise InvalidArgumentError(
                f"give one of a backend name, a factory or a vLLM class, not {' and '.join(given)}"
            )
        klass: Any = None
        if vllm_class is not None:
            from .vllm_contract import check_vllm_class

            klass = check_vllm_class(vllm_class)  # before any probe: a bad qualname is a one-line usage error
        results = probe_backends()
        class_path = None
        contract = HAL_CONTRACT.id
        if vllm_class is not None:
            recipe = BackendRecipe(vllm_class=vllm_class)
            contract = VLLM_034_CONTRACT.id
        elif factory is not None:
            recipe = BackendRecipe(factory=factory)
            target = load_factory(factory)  # fails now, clearly, on a typo
            klass = target if isinstance(target, type) else None
        else:
            chosen = select_backend(backend, results).chosen
            if chosen is None or chosen.spec is None:
                raise BackendUnavailableError(f"no backend was selected for {backend!r}")
            recipe = BackendRecipe(registry_name=chosen.name)
            class_path = chosen.spec.backend_class
            klass = chosen.spec.load_class()
        pending = False
        if expectations:
            path = None if expectations.lower() == "none" else expectations
        elif klass is not None:
            path = expectations_for_class(klass)
        else:
            path, pending = None, True
        return cls(recipe, class_path, path, pending, tuple(r.as_dict() for r in results), contract)

    def contract_info(self) -> Contract:
        """The :class:`~hisparse_hal.conformance.contracts.Contract` this run tests."""
        return contract_named(self.contract)

    def with_expectations_of(self, backend: Any) -> ResolvedRun:
        """This run with the pending expectations decided from the class of the built ``backend``."""
        if not self.expectations_pending:
            return self
        return dataclasses.replace(self, expectations=expectations_for_class(type(backend)),
                                   expectations_pending=False)

    def probe_results(self) -> list[ProbeResult]:
        """The probe results as :class:`ProbeResult` (without their specs)."""
        return [ProbeResult(p["name"], p["priority"], p["available"], p["reason"], dict(p["facts"]), p["error"])
                for p in self.probes]

    def probe_facts(self) -> dict[str, Any]:
        """The facts the chosen registry backend's probe read (empty for a factory)."""
        return next((dict(p["facts"]) for p in self.probes if p["name"] == self.recipe.registry_name), {})

    def build(self) -> HiSparseBackend:
        """Construct the backend from what was resolved: no entry-point scan and no probe.

        Raises:
            BackendUnavailableError: the chosen class is not a ``HiSparseBackend`` subclass.
            InvalidArgumentError: as :meth:`BackendRecipe.build` for a factory.
        """
        if self.backend_class is None:
            return self.recipe.build()
        module_name, _, attr = self.backend_class.partition(":")
        klass = getattr(importlib.import_module(module_name), attr)
        if not (isinstance(klass, type) and issubclass(klass, HiSparseBackend)):
            raise BackendUnavailableError(
                f"backend {self.recipe.registry_name!r}: {self.backend_class!r} is not a HiSparseBackend subclass"
            )
        chosen = next(r for r in self.probe_results() if r.name == self.recipe.registry_name)
        return klass.from_probe(chosen)

    def to_json(self) -> str:
        """The run as JSON (what ``run.json`` holds)."""
        doc = dataclasses.asdict(self)
        return json.dumps(doc, indent=1, default=str)

    @classmethod
    def from_json(cls, text: str) -> ResolvedRun:
        """The run :meth:`to_json` wrote.

        Raises:
            InvalidArgumentError: not such a document.
        """
        try:
            doc = json.loads(text)
            return cls(BackendRecipe(**doc["recipe"]), doc["backend_class"], doc["expectations"],
                       bool(doc["expectations_pending"]), tuple(doc["probes"]), doc.get("contract", HAL_CONTRACT.id))
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidArgumentError(f"not a conformance run.json: {type(exc).__name__}: {exc}") from None

    def write(self, path: str | Path) -> Path:
        """Write ``run.json`` at ``path``; returns the path."""
        target = Path(path)
        target.write_text(self.to_json(), encoding="utf-8")
        return target

    @classmethod
    def read(cls, path: str | Path) -> ResolvedRun:
        """Read a ``run.json``.

        Raises:
            InvalidArgumentError: the file cannot be read or is not a run.
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidArgumentError(f"--hal-run {path}: cannot read it: {exc}") from None
        return cls.from_json(text)
