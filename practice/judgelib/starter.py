"""An exercise's starter, generated from the engine module it replaces.

The starter is the engine module as the exercise's chapter leaves it (chapter.py) with the
body of every symbol the exercise names (a function, or a method as ``Class.method``)
replaced by ``raise NotImplementedError("Exercise <id>: implement <symbol>")``. Only those lines are
rewritten, so every signature, decorator, docstring, import and helper is the engine's,
character for character. A body that contains ``yield`` keeps an unreachable ``yield``
after the raise, so a generator stays a generator (an ``async for`` over the starter's
``sse_stream`` raises the exercise's NotImplementedError, not a TypeError). The
front matter's ``omit`` names statements the starter leaves out: a class attribute or a
helper the exercise is not about.

``judge.py start`` writes it into ``practice/workspace/``; ``judge.py check`` makes it on
the fly. A symbol the engine module no longer has is a ``StarterError`` naming the exercise
and the symbol.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from . import chapter
from .problems import Problem
from .signatures import find_def


class StarterError(ValueError):
    """The exercise's symbols do not fit its engine module (the engine changed under it)."""


def placeholder(exercise: int, symbol: str) -> str:
    """The statement a starter's body holds."""
    return f'raise NotImplementedError("Exercise {exercise}: implement {symbol}")'


def _is_generator(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``fn``'s own body yields (a nested def or lambda is another scope)."""
    todo: List[ast.AST] = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
    return False


def _body_lines(
    fn: ast.FunctionDef | ast.AsyncFunctionDef, lines: List[str]
) -> Tuple[int, int, str]:
    """(first, end, indent): ``lines[first:end]`` is the body after the docstring."""
    first_stmt = fn.body[0]
    doc = ast.get_docstring(fn, clean=False) is not None
    rest = fn.body[1:] if doc else fn.body
    for stmt in (first_stmt, *rest[:1]):
        if lines[stmt.lineno - 1][: stmt.col_offset].strip():
            raise ValueError("its body shares a line with the def or the docstring")
    indent = " " * first_stmt.col_offset
    if doc:
        first = first_stmt.end_lineno or first_stmt.lineno
    else:  # comments that open the body go with it
        first = first_stmt.lineno - 1
        while first > fn.lineno and lines[first - 1].startswith(indent + "#"):
            first -= 1
    return first, fn.end_lineno or fn.lineno, indent


def _named_statement(tree: ast.Module, name: str) -> Optional[ast.stmt]:
    """The def, class or assignment ``name`` (``Class.attribute`` for one in a class body)."""
    scope, _, last = name.rpartition(".")
    owner = find_def(tree, scope) if scope else tree
    if owner is None or isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    for stmt in owner.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [stmt.name]
        elif isinstance(stmt, ast.Assign):
            names = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            names = [stmt.target.id]
        else:
            continue
        if last in names:
            return stmt
    return None


def _statement_lines(stmt: ast.stmt, lines: List[str]) -> Tuple[int, int]:
    """(first, end): ``lines[first:end]`` is ``stmt`` with its decorators, and the blank
    lines after it when a blank line or the start of a block comes before it."""
    first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])]) - 1
    end = stmt.end_lineno or stmt.lineno
    before = lines[first - 1].rstrip() if first else ""
    if not before or before.endswith(":"):
        while end < len(lines) and not lines[end].strip():
            end += 1
    return first, end


def make_starter(
    source: str, exercise: int, symbols: Sequence[str], module: str, omit: Sequence[str] = ()
) -> str:
    """``source`` (the text of engine file ``module``) with the bodies of ``symbols`` replaced
    by the exercise's placeholder and the statements named in ``omit`` left out (a class
    attribute or a helper the exercise is not about). Raises StarterError naming the
    exercise and the symbol when one is missing, not a function (``symbols``), or listed
    twice."""
    if not symbols:
        raise StarterError(f"exercise {exercise}: no symbols to write in {module}")
    tree = ast.parse(source, module)
    lines = source.splitlines(keepends=True)
    edits: List[Tuple[int, int, str]] = []

    def edit(where: str, first: int, end: int, text: str) -> None:
        if any(first < e and s < end for s, e, _ in edits):
            raise StarterError(f"{where} is listed twice, or inside another symbol")
        edits.append((first, end, text))

    for symbol in symbols:
        node = find_def(tree, symbol)
        where = f"exercise {exercise}: {symbol}"
        if node is None:
            raise StarterError(f"{where} is not defined in {module}")
        if isinstance(node, ast.ClassDef):
            raise StarterError(f"{where} is a class in {module}; name its methods")
        try:
            first, end, indent = _body_lines(node, lines)
        except ValueError as e:
            raise StarterError(f"{where} in {module}: {e}") from None
        text = f"{indent}{placeholder(exercise, symbol)}\n"
        if _is_generator(node):
            text += f"{indent}yield  # a generator, as in the engine\n"
        edit(where, first, end, text)
    for name in omit:
        where = f"exercise {exercise}: {name} (omit)"
        stmt = _named_statement(tree, name)
        if stmt is None:
            raise StarterError(f"{where} is not defined in {module}")
        edit(where, *_statement_lines(stmt, lines), "")
    for first, end, text in sorted(edits, reverse=True):
        lines[first:end] = [text] if text else []
    return "".join(lines)


def starter_source(root: Path, problem: Problem) -> str:
    """The starter of ``problem``, made from its chapter's version of the engine module in
    checkout ``root`` (chapter.py)."""
    if not (root / problem.module).is_file():
        raise StarterError(f"exercise {problem.id}: the engine module {problem.module} is missing")
    try:
        source = chapter.engine_source(root, problem)
    except chapter.ChapterError as e:
        raise StarterError(str(e)) from None
    return make_starter(source, problem.id, problem.symbols, problem.module, problem.omit)
