"""Make a starter from the engine module: the exercise's bodies become a NotImplementedError.

``judge.py make-starter 191`` (maintainers) rewrites ``starter.py`` from the engine module
and the ``symbols`` of problem.md, so signatures and docstrings are the engine's by
construction; everything else in the module is kept as it is.
"""

from __future__ import annotations

import ast
from typing import List

from .signatures import locate


def make_starter(source: str, pid: int, symbols: List[str]) -> str:
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    edits = []
    for sym, _, _ in locate(source, symbols):
        node = _find(tree, sym)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            raise ValueError(f"{sym} is not a function or method")
        body = node.body
        has_doc = (
            isinstance(body[0], ast.Expr)
            and isinstance(getattr(body[0], "value", None), ast.Constant)
            and isinstance(body[0].value.value, str)
        )
        keep_until = body[0].end_lineno if has_doc else None  # 1-based last line kept
        first_stmt = body[1] if has_doc and len(body) > 1 else (None if has_doc else body[0])
        indent = " " * (first_stmt.col_offset if first_stmt is not None else body[0].col_offset)
        start = (
            keep_until if keep_until is not None else first_stmt.lineno - 1
        )  # 0-based first line replaced
        end = node.end_lineno or node.lineno
        text = f'{indent}raise NotImplementedError("Exercise {pid}: implement {sym}")\n'
        edits.append((start, end, text))
    missing = set(symbols) - {s for s, _, _ in locate(source, symbols)}
    if missing:
        raise ValueError(f"not found in the engine module: {', '.join(sorted(missing))}")
    for start, end, text in sorted(edits, reverse=True):
        lines[start:end] = [text]
    return "".join(lines)


def _find(tree: ast.Module, sym: str) -> ast.AST:
    body, node = tree.body, None
    for part in sym.split("."):
        node = next(
            n
            for n in body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and n.name == part
        )
        body = node.body
    assert node is not None
    return node
