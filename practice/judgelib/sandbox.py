"""A throw-away copy of the engine with the learner's file laid over one module.

The copy is the exercise's chapter's tree (chapter.py: the engine, mains and tests as that
chapter leaves them, with the tools and ``models/`` linked). Everything happens in a fresh
``tempfile.mkdtemp`` directory, so the repository, the other exercises and a second judge
running side by side are never touched.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import List, Optional, Tuple

from . import chapter
from .problems import Problem

PLUGIN_NAME = "_judge_plugin"
RECORDER_NAME = "_judge_recorder"


def own_test_name(problem: Problem, test: Path) -> str:
    """Where an exercise test lands in the sandbox: next to the chapter tests and conftest."""
    return f"tests/test_ex{problem.id}_{test.name[len('test_') :]}"


def build(
    root: Path,
    problem: Problem,
    learner_file: Optional[Path],
    chapter_tests: Optional[List[str]] = None,
) -> Tuple[Path, List[str]]:
    """Create the sandbox with ``learner_file`` over the exercise's module (None: the
    chapter's own); return it and the pytest targets (exercise tests first, then
    ``chapter_tests``, by default all of problem.md's ``tests``)."""
    box = Path(tempfile.mkdtemp(prefix=f"minisgl-judge-{problem.id}-"))
    chapter.write_tree(root, problem, box)
    if learner_file is not None:
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
    shutil.copyfile(Path(__file__).with_name("recorder.py"), box / f"{RECORDER_NAME}.py")
    (box / "tmp").mkdir()
    return box, targets


def remove(box: Path) -> None:
    shutil.rmtree(box, ignore_errors=True)
