"""The vendor-name literals of the core, read from the source (``ast``): string constants that are a vendor's name
and the vendor-specific torch attributes, outside ``hisparse_hal/vendors`` and ``hisparse_hal/testing``."""

from __future__ import annotations

import ast
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import hisparse_hal

PACKAGE_ROOT = Path(hisparse_hal.__file__).resolve().parent
#: Folders of the package where vendor names belong: the vendors, and the test doubles that simulate them.
VENDOR_FOLDERS = ("vendors", "testing")
#: A string constant equal to one of these (any case) names a vendor or its device type.
VENDOR_NAMES = frozenset({"cuda", "hip", "rocm", "nvidia", "amd", "xpu", "mps", "intel"})
#: Attribute chains that reach one vendor's torch API.
VENDOR_ATTRIBUTES = frozenset({"torch.cuda", "torch.version.cuda", "torch.version.hip", "torch.xpu", "torch.mps"})


@dataclasses.dataclass(frozen=True)
class Literal:
    """One vendor-name literal: where it is (file relative to the checkout, line, enclosing function) and what."""

    path: str
    line: int
    scope: str
    text: str

    @property
    def key(self) -> tuple[str, str, str]:
        """What the allow-list names (no line number, so an edit above it does not move it)."""
        return (self.path, self.scope, self.text)


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


def literals_in_source(source: str, path: str) -> Iterator[Literal]:
    """The vendor-name literals of one module's source, each with its enclosing function or class (``<module>``)."""

    def visit(node: ast.AST, scope: str) -> Iterator[Literal]:
        for child in ast.iter_child_nodes(node):
            text = _literal_text(child)
            if text is not None and isinstance(child, ast.expr):
                yield Literal(path, child.lineno, scope, text)
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


def core_literals(root: Path = PACKAGE_ROOT) -> list[Literal]:
    """Every vendor-name literal of the package outside :data:`VENDOR_FOLDERS`, through its linked folders."""
    found: list[Literal] = []
    for folder, _, files in os.walk(root, followlinks=True):
        relative = Path(folder).relative_to(root)
        if relative.parts[:1] and relative.parts[0] in VENDOR_FOLDERS or "__pycache__" in relative.parts:
            continue
        for name in sorted(files):
            if name.endswith(".py"):
                path = Path(folder, name)
                shown = (Path(root.name) / path.relative_to(root)).as_posix()
                found += literals_in_source(path.read_text(encoding="utf-8"), shown)
    return sorted(found, key=lambda lit: (lit.path, lit.line, lit.text))
