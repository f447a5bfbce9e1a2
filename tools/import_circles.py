"""The import circles of the engine: modules (or packages) that import each other, directly
or through others.

    python -m tools.import_circles            # circles between modules, then between packages
    python -m tools.import_circles --check    # exit 1 if any circle is not in ALLOWED
    python -m tools.import_circles --edges layers attention   # which modules tie two packages

Two graphs of the imports in ``minisgl/``. *Runtime*: every ``import`` and ``from ...
import`` that runs, at module level or inside a function (a lazy import still ties the two
files together for a reader). *With types*: those and the ones under ``if TYPE_CHECKING:``,
except the global context's (``minisgl/core.py`` types its fields with every part of the
engine, and says so). A circle is a strongly connected component of more than one node
(Tarjan's algorithm); package circles group modules by their first two dotted parts
(``minisgl.layers``, ``minisgl.attention``...).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Set

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "minisgl"
# Circles the book keeps on purpose, each with its reason; anything else fails --check.
ALLOWED: Dict[frozenset, str] = {}
GLOBAL_CONTEXT = "minisgl.core"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _typing_only(tree: ast.Module) -> Set[int]:
    """Line numbers inside ``if TYPE_CHECKING:`` blocks."""
    lines: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(path: Path, modules: Set[str], with_types: bool) -> Set[str]:
    """The engine modules ``path`` imports (``from pkg import name`` counts ``pkg.name`` when
    that is a module, else ``pkg``)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = set() if with_types and name != GLOBAL_CONTEXT else _typing_only(tree)
    found: Set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(with_types: bool) -> Dict[str, Set[str]]:
    paths = sorted(ENGINE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph = {module_name(p): imports_of(p, modules, with_types) for p in paths}
    # a module imports its package's __init__ implicitly: not an edge a reader follows
    return {m: {t for t in targets if not m.startswith(t + ".")} for m, targets in graph.items()}


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one node, each sorted, largest first."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
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
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found, key=lambda c: (-len(c), c))


def by_package(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    packages: Dict[str, Set[str]] = {}
    for module, targets in graph.items():
        packages.setdefault(package(module), set()).update(
            package(t) for t in targets if package(t) != package(module)
        )
    return packages


def report(title: str, found: Iterable[List[str]]) -> None:
    found = list(found)
    print(f"{title}: {len(found)}")
    for component in found:
        note = ALLOWED.get(frozenset(component))
        print("  " + " <-> ".join(component) + (f"  (kept: {note})" if note else ""))


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail on a circle not in ALLOWED")
    parser.add_argument("--edges", nargs=2, metavar="PACKAGE", help="imports between two packages")
    args = parser.parse_args(argv)
    if args.edges:
        a, b = (f"minisgl.{name}" for name in args.edges)
        for module, targets in sorted(import_graph(with_types=True).items()):
            for target in sorted(targets):
                for src, dst in ((a, b), (b, a)):
                    if (module + ".").startswith(src + ".") and (target + ".").startswith(
                        dst + "."
                    ):
                        print(f"  {module} -> {target}")
        return
    found = []
    for with_types in (False, True):
        graph = import_graph(with_types)
        kind = "with types" if with_types else "runtime"
        modules, packages = circles(graph), circles(by_package(graph))
        report(f"{kind}: circles between modules", modules)
        report(f"{kind}: circles between packages", packages)
        found += modules + packages
    unexpected = [c for c in found if frozenset(c) not in ALLOWED]
    if args.check and unexpected:
        raise SystemExit(f"{len(unexpected)} import circle(s) not in ALLOWED")


if __name__ == "__main__":
    main()
