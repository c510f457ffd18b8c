"""No import circles inside the package: every module's imports, lazy and type-only ones included, form a DAG.

A circle is counted even when one side imports lazily or under ``TYPE_CHECKING``: such a pair still cannot be
understood, tested or moved one without the other. The graph is read from the source (``ast``), not by importing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import hisparse_hal
import hisparse_hal.conformance
import hisparse_hal.vendors

#: The package and its two mapped subpackages: in a checkout each has its own folder (pyproject's package-dir),
#: in a wheel the last two sit inside the first.
PACKAGES = (hisparse_hal, hisparse_hal.vendors, hisparse_hal.conformance)


def _modules() -> dict[str, Path]:
    """Every module of the package, each once, found in the folders the imported packages come from."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        root = Path(str(package.__file__)).resolve().parent
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = [package.__name__, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found.setdefault(".".join(parts), path)
    return found


def _resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    if level == 0:
        return module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def import_graph() -> dict[str, set[str]]:
    """Map each package module to the package modules it imports anywhere in its source."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node.level, node.module)
                # `from pkg import sub` imports the submodule when there is one, else a name of pkg.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:  # `import a.b.c` of a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_graph_reader_sees_relative_lazy_and_type_only_imports():
    graph = import_graph()
    assert "hisparse_hal.errors" in graph["hisparse_hal.registry"]
    assert "hisparse_hal.vendors.cpu.backend" in graph or "hisparse_hal.vendors.cpu" in graph
    assert "hisparse_hal.backend" in graph["hisparse_hal.vendors.gpu.backend"]


def test_cycle_finder_reports_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_package_has_no_import_circles():
    assert find_cycles(import_graph()) == []


#: Where a vendor may be imported: the vendors themselves and the shipped test doubles (simulators, broken backends).
VENDOR_PACKAGE = "hisparse_hal.vendors"
MAY_IMPORT_VENDORS = (VENDOR_PACKAGE, "hisparse_hal.testing")


def vendor_imports(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> vendor module`` for every module outside :data:`MAY_IMPORT_VENDORS` that imports a vendor."""
    def inside(module: str, packages: tuple[str, ...]) -> bool:
        return any(module == p or module.startswith(p + ".") for p in packages)

    return sorted(f"{importer} -> {target}" for importer, targets in graph.items()
                  if not inside(importer, MAY_IMPORT_VENDORS)
                  for target in targets if inside(target, (VENDOR_PACKAGE,)))


def test_vendor_import_finder_reports_a_planted_import():
    graph = {"hisparse_hal.cli": {"hisparse_hal.vendors.cpu.backend", "hisparse_hal.errors"},
             "hisparse_hal.testing.sim": {"hisparse_hal.vendors.cuda.runtime"},
             "hisparse_hal.vendors.cuda.spec": {"hisparse_hal.vendors.cuda.nvml"}}
    assert vendor_imports(graph) == ["hisparse_hal.cli -> hisparse_hal.vendors.cpu.backend"]


#: The one core module that imports a vendor, and why: the submission benchmark times the CUDA backend's own per-call
#: path over the simulated libcuda, as hisparse_hal/testing does. Nothing may be added here.
ALLOWED_VENDOR_IMPORTS = {
    "hisparse_hal.bench.submission -> hisparse_hal.vendors.cuda.backend",
    "hisparse_hal.bench.submission -> hisparse_hal.vendors.cuda.runtime",
}


def test_no_core_module_imports_a_vendor():
    # The core asks the registry's specs (entry points), never a vendor module: bench/ and scenario/ included.
    found = vendor_imports(import_graph())
    assert [edge for edge in found if edge not in ALLOWED_VENDOR_IMPORTS] == []
