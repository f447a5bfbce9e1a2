"""`judge.py bug ID`: spot the bug. The engine's module with one known wrong answer
planted (one of the exercise's ``broken/*.toml``, chosen without saying which), written to
``practice/workspace/bug_<id>_<slug>.py``; the learner finds the bug with the tests and
the harness, fixes it, and judges the file until it is Accepted. ``--reveal`` then shows
what the bug was (the variant's sentence and the lines it changed).
"""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Optional

from . import broken, chapter
from .judging import rel
from .problems import Problem


def _paths(root: Path, problem: Problem) -> tuple[Path, Path]:
    ws = root / "practice" / "workspace"
    return ws / f"bug_{problem.workspace_name}", ws / f".bug_{problem.id}.json"


def _choose(problem: Problem, seed: str, variant: Optional[int]) -> Path:
    variants = problem.wrong_answers
    if variant is not None:
        if not 1 <= variant <= len(variants):
            raise SystemExit(f"exercise {problem.id} has bugs 1 to {len(variants)}")
        return variants[variant - 1]
    # the same machine and exercise get the same bug until --new; nothing in the name shows
    digest = int(hashlib.sha256(f"{seed}:{problem.id}".encode()).hexdigest(), 16)
    return variants[digest % len(variants)]


def cmd_bug(root: Path, problem: Problem, variant: Optional[int], reveal: bool, new: bool) -> int:
    dest, state = _paths(root, problem)
    if not problem.wrong_answers:
        print(f"exercise {problem.id} has no known bugs (no broken/*.toml)")
        return 2
    engine = chapter.engine_source(root, problem)
    if reveal:
        try:
            chosen = Path(json.loads(state.read_text(encoding="utf-8"))["variant"])
        except (OSError, ValueError, KeyError):
            print(
                f"no bug planted for {problem.id}; run: python practice/judge.py bug {problem.id}"
            )
            return 2
        wrong = broken.load(problem.dir / "broken" / chosen.name)
        print(f"The bug: {wrong.about.rstrip('.')}.")
        print(f"The test that catches it first: {wrong.expect}\n")
        planted = wrong.apply(engine, problem.module)
        diff = difflib.unified_diff(
            planted.splitlines(keepends=True),
            engine.splitlines(keepends=True),
            f"bug_{problem.workspace_name} (planted)",
            f"{problem.module} (chapter {problem.chapter}'s engine)",
            n=2,
        )
        print("".join(diff), end="")
        return 0
    if dest.exists() and not new and variant is None:
        print(f"{rel(root, dest)} exists; keeping it (--new plants another bug)")
    else:
        seed = hashlib.sha256(str(root.resolve()).encode()).hexdigest()
        chosen = _choose(problem, seed, variant)
        if new and variant is None:  # the next known bug after the one planted last
            try:
                last = json.loads(state.read_text(encoding="utf-8"))["variant"]
                names = [p.name for p in problem.wrong_answers]
                chosen = problem.wrong_answers[(names.index(last) + 1) % len(names)]
            except (OSError, ValueError, KeyError):
                pass
        try:
            planted = broken.load(chosen).apply(engine, problem.module)
        except broken.WrongAnswerError as e:
            print(f"cannot plant that bug: {e}")
            return 3
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(planted, encoding="utf-8")
        state.write_text(json.dumps({"variant": chosen.name}), encoding="utf-8")
        print(f"wrote {rel(root, dest)}: {problem.module} with one bug planted")
    print(
        f"\n# Spot the bug: {problem.id}. {problem.title}   (chapter {problem.chapter})\n\n"
        f"The file is the engine's own {problem.module}, except for one mistake somewhere in\n"
        f"{', '.join(problem.symbols)}.\n"
        "Find it the way you would in a real engine: judge the file, read the first failing\n"
        "case and its values, run that test with your own prints, read the code it calls.\n\n"
        f"  python practice/judge.py {problem.id} --file {rel(root, dest)}\n\n"
        "Fix it in place until the verdict is Accepted; then see what it was:\n\n"
        f"  python practice/judge.py bug {problem.id} --reveal"
    )
    return 0
