"""A picklable recipe for constructing the backend under test, in this process or a spawned one.

Invariant: a recipe holds only strings (a registry name, a ``module:callable`` factory, or the ``module:Class`` of a
vLLM 0.34.0 ``HiSparseBackend``), so every process of a conformance run (pytest workers, IPC peers) constructs the
same backend from it.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.resources
from pathlib import Path
from typing import Any

from hisparse_hal.backend import HiSparseBackend
from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.probing import known_specs
from hisparse_hal.registry import BackendSpec, get_backend, select_backend

from .qualnames import load_factory

__all__ = ["BackendRecipe", "vendor_expectations_path"]

EXPECTATIONS_FILE = "expectations.toml"


@dataclasses.dataclass(frozen=True)
class BackendRecipe:
    """How to build the backend under test: exactly one of a registry name, a factory or a vLLM class.

    Attributes:
        registry_name: a name registered in ``hisparse_hal.backends`` (built through ``get_backend``).
        factory: ``"module:callable"`` returning a :class:`HiSparseBackend` (an unregistered backend).
        vllm_class: ``"module:Class"`` implementing vLLM 0.34.0's ``HiSparseBackend``, built as vLLM builds it
            and seen through :class:`~hisparse_hal.conformance.vllm_contract.VllmContractView`.
    """

    registry_name: str | None = None
    factory: str | None = None
    vllm_class: str | None = None

    def __post_init__(self) -> None:
        if sum(v is not None for v in (self.registry_name, self.factory, self.vllm_class)) != 1:
            raise InvalidArgumentError(
                "a backend recipe needs exactly one of a registry name, a factory or a vLLM class, got "
                f"registry_name={self.registry_name!r}, factory={self.factory!r}, vllm_class={self.vllm_class!r}"
            )

    @property
    def kind(self) -> str:
        """``"registry"``, ``"factory"`` or ``"vllm-class"`` (``backend_under_test.kind`` of the report)."""
        return "registry" if self.registry_name else "factory" if self.factory else "vllm-class"

    @classmethod
    def resolve(cls, backend: str | None = None, factory: str | None = None) -> BackendRecipe:
        """The recipe for ``--backend``/``--factory``; neither means what ``get_backend()`` selects.

        Raises:
            InvalidArgumentError: both were given.
            BackendUnavailableError: the named (or default) backend is unknown or unavailable; the
                message includes the probe table.
        """
        if backend is not None and factory is not None:
            raise InvalidArgumentError(
                f"give either a backend name ({backend!r}) or a factory ({factory!r}), not both"
            )
        if factory is not None:
            return cls(factory=factory)
        chosen = select_backend(backend).chosen
        assert chosen is not None
        return cls(registry_name=chosen.name)

    def describe(self) -> str:
        """A short human label: ``"cpu (registry)"``, ``"pkg.mod:make (factory)"`` or ``"pkg.mod:Cls (vllm-class)"``."""
        return f"{self.registry_name or self.factory or self.vllm_class} ({self.kind})"

    def build(self) -> Any:
        """Construct the backend (registry backends are cached per process by ``get_backend``, vLLM classes by
        :func:`~hisparse_hal.conformance.vllm_contract.view_of`, built once per process as vLLM does).

        Raises:
            BackendUnavailableError: a registry backend is unavailable.
            InvalidArgumentError: the factory cannot be imported or returned no backend; a bad vLLM class.
        """
        if self.vllm_class is not None:
            from .vllm_contract import view_of

            return view_of(self.vllm_class)
        if self.registry_name is not None:
            return get_backend(self.registry_name)
        assert self.factory is not None
        made = load_factory(self.factory)()
        if not isinstance(made, HiSparseBackend):
            raise InvalidArgumentError(
                f"factory {self.factory!r} returned {type(made).__name__}, not a HiSparseBackend"
            )
        return made

    def backend_class(self) -> type | None:
        """The backend class without constructing it, when the recipe names a registry backend."""
        if self.registry_name is None:
            return None
        for item in known_specs():
            if isinstance(item, BackendSpec) and item.name == self.registry_name:
                return item.load_class()
        return None


def vendor_expectations_path(backend_class: type) -> Path | None:
    """The ``expectations.toml`` kept with the vendor package of ``backend_class``, if any.

    Walks the class's method resolution order, so a subclass defined elsewhere (a test double, a
    patched build) uses the expectations of the vendor it extends.
    """
    for klass in backend_class.__mro__:
        if klass is HiSparseBackend or klass is object:
            break
        package = klass.__module__.rpartition(".")[0]
        if not package:
            continue
        try:
            candidate = importlib.resources.files(package) / EXPECTATIONS_FILE
        except (ModuleNotFoundError, TypeError):
            continue
        if candidate.is_file():
            return Path(str(candidate))
    return None
