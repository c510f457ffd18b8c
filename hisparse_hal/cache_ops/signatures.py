"""The four cache ops' vLLM signatures, derived once from one module per vLLM release (:mod:`.vllm034`, the
default of :data:`REGISTRY`): schema strings, ``inspect`` signatures, arities; and :func:`vllm_ops`, which wraps an
implementation's bundle-taking functions (:mod:`.arguments`' ``ResolveInputs``, ``GatherInputs``,
``InvalidateInputs``) in them (vLLM passes all 23 resolve arguments positionally, ``runtime.py:904-930``).

Invariant: every public entry runs the shared check of :mod:`.arguments` first, so a bad argument raises
``InvalidArgumentError`` before the implementation sees (or writes) anything.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import string
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

from hisparse_hal.errors import CacheOpArityError, InvalidArgumentError

from . import arguments, vllm034
from .arguments import GatherInputs, InvalidateInputs, ResolveInputs

__all__ = ["ARITY", "DEFAULT_VLLM", "OP_NAMES", "REGISTRY", "SIGNATURES", "OpSignature", "SchemaRegistry",
           "VllmOps", "VllmSchemas", "method_signature", "positional_arguments", "schemas_from_module", "vllm_ops"]

#: A parameter's annotation (as its module spells it) -> its type in a torch schema.
_SCHEMA_TYPES = {"Tensor": "Tensor", "Tensor | None": "Tensor?", "int": "int"}


@dataclasses.dataclass(frozen=True)
class OpSignature:
    """One op of one vLLM release: its prototype (parameters and docstring) and the arguments its schema writes."""

    name: str
    prototype: Callable[..., None]
    writes: tuple[str, ...]
    signature: inspect.Signature = dataclasses.field(init=False, compare=False)
    schema: str = dataclasses.field(init=False, compare=False)

    def __post_init__(self) -> None:
        signature = inspect.signature(self.prototype)
        object.__setattr__(self, "signature", signature)  # frozen: derived once, here
        object.__setattr__(self, "schema", _schema(self.name, signature, self.writes))

    @property
    def arity(self) -> tuple[int, int]:
        """``(required, total)`` argument counts."""
        parameters = self.signature.parameters.values()
        return sum(p.default is inspect.Parameter.empty for p in parameters), len(parameters)


def _schema_argument(op: str, parameter: inspect.Parameter, written: bool, letters: Iterator[str]) -> str:
    """One argument as vLLM spells it: ``Tensor!`` for a written required tensor, ``Tensor(a!)?`` for a written
    optional one (the next of ``letters``), then the name and ``=default``.

    Raises:
        InvalidArgumentError: the annotation has no schema type, or an ``int`` is marked written.
    """
    kind = _SCHEMA_TYPES.get(str(parameter.annotation))
    if kind is None or (written and kind == "int"):
        raise InvalidArgumentError(f"{op}'s parameter {parameter.name} is annotated {parameter.annotation!r}"
                                   f"{' and written' if written else ''}; expected one of {', '.join(_SCHEMA_TYPES)}"
                                   " (only tensors written)")
    if written:
        kind = f"Tensor({next(letters)}!)?" if kind == "Tensor?" else "Tensor!"
    default = "" if parameter.default is inspect.Parameter.empty else f"={parameter.default!r}"
    return f"{kind} {parameter.name}{default}"


def _schema(op: str, signature: inspect.Signature, writes: tuple[str, ...]) -> str:
    """The schema's argument list and return, ``(...) -> ()``, of an op returning nothing.

    Raises:
        InvalidArgumentError: ``writes`` names no parameter, or a parameter has no schema type.
    """
    unknown = sorted(set(writes) - set(signature.parameters))
    if unknown:
        raise InvalidArgumentError(f"{op} writes {', '.join(unknown)}; expected names among its parameters")
    letters = iter(string.ascii_lowercase)
    spelled = [_schema_argument(op, p, p.name in writes, letters) for p in signature.parameters.values()]
    return f"({', '.join(spelled)}) -> ()"


@dataclasses.dataclass(frozen=True)
class VllmSchemas:
    """The four ops' signatures of one vLLM release, in our op order, and where vLLM defines them."""

    version: str
    source: str
    ops: Mapping[str, OpSignature]

    @property
    def schemas(self) -> dict[str, str]:
        """Op name -> schema argument list, ``(...) -> ()``, as ``torch.library`` defines it."""
        return {name: op.schema for name, op in self.ops.items()}


def schemas_from_module(module: ModuleType) -> VllmSchemas:
    """The :class:`VllmSchemas` of a per-release module such as :mod:`.vllm034` (its ``VERSION``, ``SOURCE``,
    ``OPS`` prototypes and ``WRITES``).

    Raises:
        InvalidArgumentError: a prototype's annotation has no schema type, or ``WRITES`` names an unknown
            parameter.
    """
    ops = {op.__name__: OpSignature(op.__name__, op, tuple(module.WRITES[op.__name__])) for op in module.OPS}
    return VllmSchemas(module.VERSION, module.SOURCE, ops)


class SchemaRegistry:
    """vLLM release -> its :class:`VllmSchemas`; the first entry is the default. Adding a release never replaces
    or drops another, so a 0.35 module beside :mod:`.vllm034` keeps 0.34.0 selectable."""

    def __init__(self, default: VllmSchemas) -> None:
        self._entries: dict[str, VllmSchemas] = {default.version: default}
        self.default = default.version

    @property
    def versions(self) -> tuple[str, ...]:
        """The registered releases, in the order they were added."""
        return tuple(self._entries)

    def add(self, schemas: VllmSchemas) -> None:
        """Register one more release.

        Raises:
            InvalidArgumentError: ``schemas.version`` is registered already (naming it).
        """
        if schemas.version in self._entries:
            raise InvalidArgumentError(f"vLLM {schemas.version}'s cache-op schemas are registered already; "
                                       "expected a release not yet among " + ", ".join(self._entries))
        self._entries[schemas.version] = schemas

    def get(self, version: str | None = None) -> VllmSchemas:
        """The signatures of vLLM ``version`` (the default release when None).

        Raises:
            InvalidArgumentError: no entry for ``version`` (naming it and the registered ones).
        """
        found = self._entries.get(self.default if version is None else version)
        if found is None:
            raise InvalidArgumentError(f"vLLM {version!r} has no registered cache-op schemas; expected one of "
                                       + ", ".join(self._entries))
        return found


#: Every vLLM release whose cache-op schemas hisparse-hal knows: one module each.
REGISTRY = SchemaRegistry(schemas_from_module(vllm034))
#: The release ``torch.ops.hisparse_hal`` registers and ``create_cache_ops`` serves.
DEFAULT_VLLM: str = REGISTRY.default
_DEFAULT = REGISTRY.get()

#: Our op names, in the order of vLLM's ``hisparse_*`` ops (``torch.ops._C_cache_ops.hisparse_<name>``).
OP_NAMES: tuple[str, ...] = tuple(_DEFAULT.ops)
#: Each op's signature, vLLM's parameter names, order and defaults (:mod:`.vllm034`).
SIGNATURES: dict[str, inspect.Signature] = {name: op.signature for name, op in _DEFAULT.ops.items()}
#: Each op's ``(required, total)`` argument counts: resolve 10 to 23, the gathers 5, invalidation 6.
ARITY: dict[str, tuple[int, int]] = {name: op.arity for name, op in _DEFAULT.ops.items()}


@dataclasses.dataclass(frozen=True)
class VllmOps:
    """The four ops of one implementation with vLLM's positional signatures."""

    resolve_residency: Callable[..., None]
    gather_compact: Callable[..., None]
    gather_plan: Callable[..., None]
    invalidate_written_slots: Callable[..., None]


def _entry(name: str, run: Callable[[Any], None]) -> Callable[..., None]:
    """Op ``name``'s public function around ``run``: the shared check binds vLLM's arguments (positional or by
    name) into the bundle ``run`` takes. ``inspect.signature`` and ``help()`` show the release's prototype."""
    check = getattr(arguments, f"check_{name}")

    @functools.wraps(_DEFAULT.ops[name].prototype)
    def entry(*args: Any, **kwargs: Any) -> None:
        run(check(*args, **kwargs))
    return entry


def vllm_ops(
    resolve: Callable[[ResolveInputs], None],
    gather: Callable[[GatherInputs], None],
    invalidate: Callable[[InvalidateInputs], None],
) -> VllmOps:
    """Wrap an implementation's bundle-taking functions in vLLM's four signatures.

    Args:
        resolve: runs one checked resolve call.
        gather: runs one checked gather (plan or compact, as ``inputs.compact`` says).
        invalidate: runs one checked invalidation.

    Returns:
        The four public functions (each checks its arguments first; a wrong count or an unknown keyword raises
        ``TypeError`` before the check).
    """
    return VllmOps(_entry("resolve_residency", resolve), _entry("gather_compact", gather),
                   _entry("gather_plan", gather), _entry("invalidate_written_slots", invalidate))


def method_signature(name: str) -> inspect.Signature:
    """Op ``name``'s signature with ``self`` first, for a method taking ``*args`` (``inspect.signature`` and
    ``help()`` of the bound method then show vLLM's names; the call itself binds nothing)."""
    signature = SIGNATURES[name]
    this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return signature.replace(parameters=[this, *signature.parameters.values()])


def positional_arguments(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A call of op ``name`` with keywords (or a wrong count) as vLLM's positional argument tuple, defaults filled.

    Raises:
        CacheOpArityError: the arguments do not fit the op's signature (naming the op, the count given and the
            counts it takes).
    """
    try:
        bound = SIGNATURES[name].bind(*args, **kwargs)
    except TypeError as exc:
        raise CacheOpArityError(f"hisparse_{name}", len(args) + len(kwargs), ARITY[name], str(exc)) from None
    bound.apply_defaults()
    return bound.args
