"""Find a Python symbol's lines with `ast`, for the book's code macros and the upstream index.

A symbol is a dotted path through a module: `Class`, `Class.method`, `Class.Inner.method`,
`function`, or a module-level name bound by an assignment (`ENV`, `Indice2D`). Line numbers
are 1-based and inclusive; a definition's range starts at its first decorator.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass
from typing import Dict, Iterator, List, Tuple

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class SymbolError(LookupError):
    """A symbol is not defined in a source file (the message lists close matches)."""


@dataclass(frozen=True)
class Span:
    """Where a symbol lives: `start`..`end` (1-based, inclusive) and its source text."""

    start: int
    end: int
    text: str


def _bound_names(node: ast.stmt) -> List[str]:
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    elif hasattr(ast, "TypeAlias") and isinstance(node, ast.TypeAlias):  # Python 3.12+
        targets = [node.name]
    else:
        return []
    names: List[str] = []
    for t in targets:
        if isinstance(t, ast.Name):
            names.append(t.id)
        elif isinstance(t, ast.Tuple):
            names.extend(e.id for e in t.elts if isinstance(e, ast.Name))
    return names


def _start(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decorators])


def iter_symbols(tree: ast.Module) -> Iterator[Tuple[str, ast.stmt]]:
    """Yield `(dotted_name, node)` for every class, function, method and module-level name.

    Class bodies are walked (methods, nested classes, class attributes); function bodies are
    not, since their locals are not addressable symbols. The first definition of a name wins
    (a later `if TYPE_CHECKING` re-definition does not move it).
    """

    def walk(body: List[ast.stmt], prefix: str, in_class: bool) -> Iterator[Tuple[str, ast.stmt]]:
        for node in body:
            if isinstance(node, _DEFS):
                name = prefix + node.name
                yield name, node
                if isinstance(node, ast.ClassDef):
                    yield from walk(node.body, name + ".", True)
            else:
                for bound in _bound_names(node):
                    yield prefix + bound, node
                # `if`/`try` at module level still bind module-level names (e.g. optional imports)
                if not in_class and isinstance(node, (ast.If, ast.Try)):
                    for sub in (
                        node.body,
                        getattr(node, "orelse", []),
                        getattr(node, "finalbody", []),
                    ):
                        yield from walk(sub, prefix, in_class)

    return walk(tree.body, "", False)


def symbol_table(source: str, filename: str = "<source>") -> Dict[str, Tuple[int, int]]:
    """Map every symbol of `source` to its `(start, end)` lines (first definition wins)."""
    table: Dict[str, Tuple[int, int]] = {}
    for name, node in iter_symbols(ast.parse(source, filename=filename)):
        table.setdefault(name, (_start(node), node.end_lineno or node.lineno))
    return table


def find_symbol(source: str, symbol: str, filename: str = "<source>") -> Span:
    """Return the `Span` of `symbol` in `source`, decorators included, dedented.

    Raises SyntaxError if the source does not parse, and SymbolError (naming the closest
    existing symbols) if `symbol` is not defined.
    """
    table = symbol_table(source, filename)
    if symbol not in table:
        close = difflib.get_close_matches(symbol, list(table), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise SymbolError(f"symbol '{symbol}' is not defined in {filename}{hint}")
    start, end = table[symbol]
    lines = source.splitlines()[start - 1 : end]
    indent = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
    return Span(start, end, "\n".join(line[indent:] for line in lines))
