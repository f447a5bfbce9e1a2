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

from functools import lru_cache
from pathlib import Path
from typing import List

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


def later_imports(root: Path, problem: Problem) -> List[str]:
    """One sentence per module of the engine or the tests that an exercise test imports and
    the chapter's tree does not have (a later chapter's): the judge would fail there."""
    files = [p.relative_to(root).as_posix() for top in ("minisgl", "tests")
             for p in (root / top).rglob("*.py")]  # fmt: skip
    have = set(tree(root, problem)) | set(steps.VERSIONED_INFRASTRUCTURE)
    found = []
    for test in problem.own_tests:
        for module in sorted(imported_modules(f"tests/{test.name}", test.read_text("utf-8"))):
            path = module_file(module, files)
            if path is not None and path not in have:
                found.append(
                    f"{test.name} imports {module}, which chapter {problem.chapter}'s tree lacks"
                )
    return found


def write_tree(root: Path, problem: Problem, dest: Path) -> None:
    """Write the exercise's chapter's tree into the empty folder ``dest``."""
    steps.write_tree(problem.chapter, _manifests(root), root, dest)
