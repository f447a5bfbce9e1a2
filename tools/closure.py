"""Which files a test file can run: the static closure of its imports in one chapter's tree.

``python -m tools.steps check`` runs, in chapter N's tree, the tests of every earlier chapter
too; a test file whose closure reads exactly the same text in chapter N's version as in
chapter N-1's gives the same result there, so it runs again only where something it can
reach changed. The closure follows every ``import`` and ``from ... import`` of the tree's
own packages (``minisgl``, ``tests``), the ones inside functions included and the ones under
``if TYPE_CHECKING:`` left out; importing a module imports its packages' ``__init__``; a
package that finds its modules at run time (``pkgutil.iter_modules``, a ``Registry`` given
its package) counts as importing all of them; a ``"-m", "minisgl..."`` in the text (a test
that starts the engine as a process) imports that module and its ``__main__``; and
``tests/conftest.py`` is in every closure, with its module-level imports (a fixture's own
imports run only for the tests that ask for it, and those import what they drive).
``fixtures_seen`` is the part of the conftest a test file can reach: the fixtures it names
and the autouse ones, so a chapter that adds a fixture reruns only the tests that use it.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import PurePosixPath
from typing import Container, Dict, FrozenSet, List, Set

ROOTS = ("minisgl", "tests")  # the packages of a step tree whose imports are followed
ALWAYS = ("tests/conftest.py",)
_DISCOVERS = re.compile(r"pkgutil\.iter_modules|package=__name__|package=__package__")
_RUN_MODULE = re.compile(r"""["']-m["'],\s*["']((?:minisgl|tests)(?:\.\w+)*)["']""")
_WORD = re.compile(r"[A-Za-z_]\w*")


def _type_checking_lines(tree: ast.AST) -> Set[int]:
    lines: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", "")
            if name == "TYPE_CHECKING":
                for child in node.body:
                    lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _package_of(path: str) -> str:
    """``minisgl/a/b.py`` -> ``minisgl.a``; ``minisgl/a/__init__.py`` -> ``minisgl.a``."""
    parts = PurePosixPath(path).with_suffix("").parts
    return ".".join(parts[:-1])


# a chapter's check asks about the same file texts thousands of times: each is parsed once
@functools.lru_cache(maxsize=None)
def imported_modules(path: str, text: str, top_level_only: bool = False) -> FrozenSet[str]:
    """Dotted names of the modules ``text`` (the file ``path``) imports, at run time
    (``top_level_only``: leaving out the imports inside functions)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return frozenset()
    skip = _type_checking_lines(tree)
    if top_level_only:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                skip.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    package = _package_of(path)
    found: Set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    for module in _RUN_MODULE.findall(text):  # python -m <module> in a child process
        found.update({module, f"{module}.__main__"})
    return frozenset(m for m in found if m.split(".")[0] in ROOTS)


def module_file(module: str, files: Container[str]) -> str | None:
    """The tree's file of dotted ``module`` (a module or a package), if ``files`` (its paths)
    has one."""
    base = module.replace(".", "/")
    for candidate in (f"{base}.py", f"{base}/__init__.py"):
        if candidate in files:
            return candidate
    return None


def closure(start: str, texts: Dict[str, str]) -> Set[str]:
    """Every file of the tree (``texts``: path -> text) that importing ``start`` can run."""
    seen: Set[str] = set()
    todo: List[str] = [start, *[p for p in ALWAYS if p in texts]]
    while todo:
        path = todo.pop()
        if path in seen or path not in texts:
            continue
        seen.add(path)
        text = texts[path]
        # a fixture's imports run only for the tests that ask for it, which import their own
        modules = set(imported_modules(path, text, top_level_only=path in ALWAYS))
        for module in list(modules):  # importing a.b.c imports a and a.b first
            parts = module.split(".")
            modules.update(".".join(parts[:k]) for k in range(1, len(parts)))
        for module in modules:
            found = module_file(module, texts)
            if found is not None:
                todo.append(found)
        if _DISCOVERS.search(text):  # the package's every module may be imported
            folder = _parent(path)
            todo += [p for p in texts if _parent(p) == folder]
            todo += [
                p
                for p in texts
                if p.startswith(folder + "/")
                and p.endswith("/__init__.py")
                and _parent(_parent(p)) == folder
            ]
    return seen


def _parent(path: str) -> str:
    """``a/b/c.py`` -> ``a/b``; ``c.py`` -> ``.`` (as ``PurePosixPath.parent``, faster)."""
    return path.rpartition("/")[0] or "."


def _is_fixture(node: ast.FunctionDef) -> tuple[bool, bool]:
    """(is a pytest fixture, is autouse)."""
    for d in node.decorator_list:
        text = ast.unparse(d)
        if "fixture" in text:
            return True, "autouse=True" in text.replace(" ", "")
    return False, False


def fixtures_seen(conftest: str, user: str) -> str:
    """The conftest as the test file ``user`` (its text) sees it: without the fixtures it
    names nowhere, directly or through a fixture it uses, unless they are autouse; comments
    and blank lines left out (``ast.unparse``)."""
    try:
        tree = ast.parse(conftest)
    except SyntaxError:
        return conftest
    fixtures = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            is_fixture, autouse = _is_fixture(node)
            if is_fixture:
                fixtures[node.name] = (node, autouse)
    wanted = set(_WORD.findall(user)) | {n for n, (_, auto) in fixtures.items() if auto}
    kept: Set[str] = set()
    while True:
        new = {n for n in fixtures if n in wanted and n not in kept}
        if not new:
            break
        kept |= new
        for name in new:
            wanted |= {a.arg for a in fixtures[name][0].args.args}
    tree.body = [
        n for n in tree.body if not (getattr(n, "name", None) in fixtures and n.name not in kept)
    ]
    return ast.unparse(tree)
