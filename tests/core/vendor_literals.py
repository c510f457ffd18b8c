"""The vendor-name literals of the core, read from the source (``ast``): string constants that are a vendor's name
and the vendor-specific torch attributes, outside ``hisparse_hal/vendors`` and ``hisparse_hal/testing``."""

from __future__ import annotations

import ast
import dataclasses
import importlib
from collections.abc import Iterator
from pathlib import Path

#: The package and its two mapped subpackages (each its own folder in a checkout, inside the first in a wheel).
PACKAGES = ("hisparse_hal", "hisparse_hal.vendors", "hisparse_hal.conformance")
#: Subpackages where vendor names belong: the vendors, and the test doubles that simulate them.
VENDOR_PACKAGES = ("hisparse_hal.vendors", "hisparse_hal.testing")
#: A string constant equal to one of these (any case) names a vendor or its device type.
VENDOR_NAMES = frozenset({"cuda", "hip", "rocm", "nvidia", "amd", "xpu", "mps", "intel"})
#: Attribute chains that reach one vendor's torch API.
VENDOR_ATTRIBUTES = frozenset({"torch.cuda", "torch.version.cuda", "torch.version.hip", "torch.xpu", "torch.mps"})


@dataclasses.dataclass(frozen=True)
class Literal:
    """One vendor-name literal: its module (import name), file and line, enclosing function, and text."""

    module: str
    path: str
    line: int
    scope: str
    text: str

    @property
    def key(self) -> tuple[str, str, str]:
        """What the allow-list names: module, scope, text (no line or path, so neither an edit above it nor the
        package layout moves it)."""
        return (self.module, self.scope, self.text)


def _dotted(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _literal_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.lower() in VENDOR_NAMES:
        return repr(node.value)
    if isinstance(node, ast.Attribute):
        dotted = _dotted(node)
        if dotted in VENDOR_ATTRIBUTES:
            return dotted
    return None


def literals_in_source(source: str, path: str, module: str = "") -> Iterator[Literal]:
    """The vendor-name literals of one module's source, each with its enclosing function or class (``<module>``)."""

    def visit(node: ast.AST, scope: str) -> Iterator[Literal]:
        for child in ast.iter_child_nodes(node):
            text = _literal_text(child)
            if text is not None and isinstance(child, ast.expr):
                yield Literal(module or path, path, child.lineno, scope, text)
            yield from visit(child, _scope_of(child, scope))

    yield from visit(ast.parse(source), "<module>")


def _scope_of(node: ast.AST, scope: str) -> str:
    """The scope a node's children are in: its function or class, or the name a module-level statement assigns."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name if scope == "<module>" else f"{scope}.{node.name}"
    if scope == "<module>" and isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = [target.id for target in targets if isinstance(target, ast.Name)]
        if names:
            return names[0]
    return scope


def package_modules() -> dict[str, Path]:
    """Every module of :data:`PACKAGES` by import name, each once, from the folders the imported packages come from."""
    found: dict[str, Path] = {}
    for name in PACKAGES:
        package = importlib.import_module(name)
        root = Path(str(package.__file__)).resolve().parent
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = [name, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found.setdefault(".".join(parts), path)
    return found


def core_modules() -> dict[str, Path]:
    """The modules of the package outside :data:`VENDOR_PACKAGES` (the core, its rooms and the suite)."""
    return {module: path for module, path in package_modules().items()
            if not any(module == p or module.startswith(p + ".") for p in VENDOR_PACKAGES)}


def core_literals() -> list[Literal]:
    """Every vendor-name literal of :func:`core_modules`."""
    found: list[Literal] = []
    for module, path in sorted(core_modules().items()):
        found += literals_in_source(path.read_text(encoding="utf-8"), str(path), module)
    return sorted(found, key=lambda lit: (lit.module, lit.line, lit.text))
