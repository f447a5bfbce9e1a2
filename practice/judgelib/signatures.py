"""Compare the public interface of a starter with its engine module (for `check`), and find
a def by its dotted name (``Class.method``) in a module's source.

Read with ``ast`` only, so neither source is imported: classes (bases, decorators,
annotated fields with defaults, docstring), functions and methods (every argument, its
kind, annotation and default, the return annotation, decorators, docstring).
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Tuple


def _u(node: Optional[ast.AST]) -> Optional[str]:
    return None if node is None else ast.unparse(node)


def _public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _func_sig(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    a = fn.args
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    parts = []
    for i, (arg, d) in enumerate(zip(pos, defaults)):
        s = (
            arg.arg
            + (f": {_u(arg.annotation)}" if arg.annotation else "")
            + (f" = {_u(d)}" if d else "")
        )
        parts.append(s)
        if a.posonlyargs and i == len(a.posonlyargs) - 1:
            parts.append("/")
    if a.vararg:
        parts.append(
            "*" + a.vararg.arg + (f": {_u(a.vararg.annotation)}" if a.vararg.annotation else "")
        )
    elif a.kwonlyargs:
        parts.append("*")
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        parts.append(
            arg.arg
            + (f": {_u(arg.annotation)}" if arg.annotation else "")
            + (f" = {_u(d)}" if d else "")
        )
    if a.kwarg:
        parts.append(
            "**" + a.kwarg.arg + (f": {_u(a.kwarg.annotation)}" if a.kwarg.annotation else "")
        )
    deco = "".join(f"@{_u(d)} " for d in fn.decorator_list)
    kw = "async def" if isinstance(fn, ast.AsyncFunctionDef) else "def"
    ret = f" -> {_u(fn.returns)}" if fn.returns else ""
    return f"{deco}{kw} {fn.name}({', '.join(parts)}){ret}"


def interface(source: str) -> Dict[str, Tuple[str, Optional[str]]]:
    """Map ``Qualified.name`` to (signature text, docstring) for every def and class."""
    out: Dict[str, Tuple[str, Optional[str]]] = {}

    def visit(body: List[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[prefix + node.name] = (_func_sig(node), ast.get_docstring(node))
            elif isinstance(node, ast.ClassDef):
                deco = "".join(f"@{_u(d)} " for d in node.decorator_list)
                bases = ", ".join(_u(b) or "" for b in node.bases + node.keywords)  # type: ignore[operator]
                out[prefix + node.name] = (
                    f"{deco}class {node.name}({bases})",
                    ast.get_docstring(node),
                )
                for stmt in node.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                        sig = f"{stmt.target.id}: {_u(stmt.annotation)}" + (
                            f" = {_u(stmt.value)}" if stmt.value else ""
                        )
                        out[f"{prefix}{node.name}.{stmt.target.id}"] = (sig, None)
                visit(node.body, f"{prefix}{node.name}.")

    visit(ast.parse(source).body, "")
    return out


def drift(starter: str, engine: str) -> Tuple[List[str], List[str]]:
    """(problems, notes) between two sources: public differences fail the check; private
    ones are only noted."""
    try:
        s_if = interface(starter)
        e_if = interface(engine)
    except SyntaxError as e:
        return [f"cannot parse: {e}"], []
    problems: List[str] = []
    notes: List[str] = []
    for name in sorted(set(s_if) | set(e_if)):
        sink = problems if all(_public(p) for p in name.split(".")) else notes
        if name not in s_if:
            sink.append(f"{name}: in the engine, missing from the starter")
        elif name not in e_if:
            sink.append(f"{name}: in the starter, missing from the engine")
        else:
            (s_sig, s_doc), (e_sig, e_doc) = s_if[name], e_if[name]
            if s_sig != e_sig:
                sink.append(
                    f"{name}: signature differs\n    engine:  {e_sig}\n    starter: {s_sig}"
                )
            if s_doc != e_doc:
                sink.append(f"{name}: docstring differs")
    return problems, notes


Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def find_def(tree: ast.Module, symbol: str) -> Optional[Definition]:
    """The def or class named ``symbol`` (``Class.method``, nested as deep as it goes) at the
    top of ``tree``, or None."""
    body: List[ast.stmt] = tree.body
    node: Optional[Definition] = None
    for part in symbol.split("."):
        node = next(
            (
                n
                for n in body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and n.name == part
            ),
            None,
        )
        if node is None:
            return None
        body = node.body
    return node


def locate(source: str, symbols: List[str]) -> List[Tuple[str, int, int]]:
    """(symbol, first line, last line) of each symbol found in the source."""
    tree = ast.parse(source)
    found = []
    for sym in symbols:
        node = find_def(tree, sym)
        if node is not None:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            found.append((sym, first, node.end_lineno or node.lineno))
    return found
