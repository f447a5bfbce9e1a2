"""An exercise's chapter: the engine as that chapter leaves it.

An exercise belongs to one chapter (``chapter = 7`` in problem.md). Its starter, its known
wrong answers and the reference it is judged against are cut from that chapter's version of
the module (tools/versions.py: the lines later chapters add are left out), and the judge lays
the learner's file over that chapter's tree (tools/steps.py ``write_tree``: the files of
chapters 0..N as chapter N leaves them), so the chapter tests that run are the ones that tree
holds. A reader of chapter 7 writes chapter 7's ``PrefillAdder``, without chapter 10's
chunking, and is judged by chapter 7's tests.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path
from typing import List, Set

from tools import steps, versions
from tools.closure import imported_modules, module_file
from tools.manifest import Manifest, load_manifests

from .problems import Problem


class ChapterError(ValueError):
    """The exercise does not fit its chapter: the module or a test is not in its tree."""


@lru_cache(maxsize=None)
def _manifests(root: Path) -> List[Manifest]:
    return load_manifests(root)


def tree(root: Path, problem: Problem) -> List[str]:
    """The files of the exercise's chapter's tree (tools/steps.py ``tree_paths``)."""
    return steps.tree_paths(problem.chapter, _manifests(root))


def engine_source(root: Path, problem: Problem) -> str:
    """The exercise's module as its chapter leaves it: the reference the learner's file
    stands in for. Raises ChapterError when the chapter's tree has no such module."""
    if problem.module not in tree(root, problem):
        raise ChapterError(
            f"exercise {problem.id}: {problem.module} is not in chapter {problem.chapter}'s tree"
        )
    text = (root / problem.module).read_text(encoding="utf-8")
    return versions.version(text, problem.chapter, problem.module)


def _top_level_names(text: str) -> Set[str]:
    """The names a module binds at its top level: defs, classes, assignments, imports."""
    names: Set[str] = set()
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        else:
            names.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
    return names


def later_imports(root: Path, problem: Problem) -> List[str]:
    """One sentence per module of the engine or the tests, or name from one, that an
    exercise test imports and the chapter's version lacks (a later chapter's): the judge
    would fail there."""
    files = [p.relative_to(root).as_posix() for top in ("minisgl", "tests")
             for p in (root / top).rglob("*.py")]  # fmt: skip
    have = set(tree(root, problem)) | set(steps.VERSIONED_INFRASTRUCTURE)
    lacks = f"which chapter {problem.chapter}'s version lacks"
    found = []
    for test in problem.own_tests:
        text = test.read_text("utf-8")
        for module in sorted(imported_modules(f"tests/{test.name}", text)):
            path = module_file(module, files)
            if path is not None and path not in have:
                found.append(f"{test.name} imports {module}, {lacks}")
        for node in ast.walk(ast.parse(text)):
            path = (
                module_file(node.module or "", files) if isinstance(node, ast.ImportFrom) else None
            )
            if path is None or path not in have:
                continue
            version = versions.version((root / path).read_text("utf-8"), problem.chapter, path)
            bound = _top_level_names(version)
            for alias in node.names:
                if (
                    alias.name not in bound
                    and module_file(f"{node.module}.{alias.name}", have) is None
                ):
                    found.append(f"{test.name} imports {alias.name} from {node.module}, {lacks}")
    return found


def write_tree(root: Path, problem: Problem, dest: Path) -> None:
    """Write the exercise's chapter's tree into the empty folder ``dest``."""
    steps.write_tree(problem.chapter, _manifests(root), root, dest)
