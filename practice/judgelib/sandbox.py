"""A throw-away copy of the engine with the learner's file laid over one module.

Everything happens in a fresh ``tempfile.mkdtemp`` directory, so the repository, the other
exercises and a second judge running side by side are never touched.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import List, Optional, Tuple

from .problems import Problem

# Copied into the sandbox when present: the engine, the chapter tests and what they use.
COPY = [
    "minisgl",
    "tests",
    "examples",
    "tools",
    "pyproject.toml",
    "pytest.ini",
    "setup.cfg",
    "conftest.py",
]
# Linked, not copied: large, read by the tests, never written by the judge.
LINK = ["models"]
PLUGIN_NAME = "_judge_plugin"
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")


def own_test_name(problem: Problem, test: Path) -> str:
    """Where an exercise test lands in the sandbox: next to the chapter tests and conftest."""
    return f"tests/test_ex{problem.id}_{test.name[len('test_') :]}"


def build(
    root: Path, problem: Problem, learner_file: Path, chapter_tests: Optional[List[str]] = None
) -> Tuple[Path, List[str]]:
    """Create the sandbox; return it and the pytest targets (exercise tests first, then
    ``chapter_tests``, by default all of problem.md's ``tests``)."""
    box = Path(tempfile.mkdtemp(prefix=f"minisgl-judge-{problem.id}-"))
    for name in COPY:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, box / name, ignore=_IGNORE)
        elif src.is_file():
            shutil.copy2(src, box / name)
    for name in LINK:
        if (root / name).exists():
            os.symlink(root / name, box / name)
    target = box / problem.module
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(learner_file, target)
    (box / "tests").mkdir(exist_ok=True)
    targets = []
    for test in problem.own_tests:
        name = own_test_name(problem, test)
        shutil.copyfile(test, box / name)
        targets.append(name)
    targets += problem.tests if chapter_tests is None else chapter_tests
    shutil.copyfile(Path(__file__).with_name("plugin.py"), box / f"{PLUGIN_NAME}.py")
    (box / "tmp").mkdir()
    return box, targets


def remove(box: Path) -> None:
    shutil.rmtree(box, ignore_errors=True)
