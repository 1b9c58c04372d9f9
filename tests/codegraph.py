"""The project's import graph, read from the source with ``ast`` (no imports executed): which modules a
package has, what each imports, and the cycles — for the layering and contract tests."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


#: orchestrator's stages, lowest first: a module may import only from its own stage or a lower one.
def _modules(package: str) -> dict[str, Path]:
    base = ROOT / package
    out = {}
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports (also inside functions), resolved to absolute names."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    pkg_parts = name.split(".") if is_pkg else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg_parts[: len(pkg_parts) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)  # `from . import x` imports a module x
    return found


def _graph(package: str) -> dict[str, set[str]]:
    mods = _modules(package)
    graph = {}
    for name, path in mods.items():
        deps = set()
        for imp in _imports(name, path):
            while imp and imp not in mods:
                imp = imp.rpartition(".")[0]
            if imp and imp != name and not name.startswith(imp + "."):  # a package's own __init__ is not a dep
                deps.add(imp)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def _packages(package: str) -> set[str]:
    return {".".join(p.relative_to(ROOT).parent.parts) for p in (ROOT / package).rglob("__init__.py")}
