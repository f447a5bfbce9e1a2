"""`judge.py check`: the maintainer's proof that every exercise is sound.

For each exercise, from the engine module as the exercise's chapter leaves it (chapter.py),
and in that chapter's tree: every test problem.md names is in the tree, and the exercise's
own tests import nothing the tree lacks; the starter is
generated (starter.py; a symbol the module no longer has fails here, naming it), compiles,
and has the engine's public signatures and docstrings; the engine's own module is
Accepted; the starter is not; and every known wrong answer (``broken/<name>.toml``,
broken.py: replacements applied to the engine module, so a stale one is reported) is not
Accepted, gets the verdict it names (Wrong answer by default) and fails first on the case
it names. An exercise graded on speed (``[speed]``, speed.py) needs right but slow answers,
``slow/<name>.toml``: each must pass every case and, on a CUDA GPU, be judged Too slow
while the engine's module is Accepted with its ratio; without a GPU their speed is a note.

A ``gpu = true`` exercise on a machine without CUDA is only *partly* checked: the static
checks, then its own tests on the CPU (the GPU cases skip), engine against starter; a wrong
answer that only the GPU cases catch is a note there, not an error (the starter must still
fail). The report says so and never calls such an exercise sound: only ``check`` on a CUDA
machine judges it.

``check --jobs N`` checks N exercises at once, each in a worker process of its own whose
report is printed as one block when it is done, in the exercises' order (tools/jobs.py, as
``python -m tools.steps check --jobs``). Side by side they cannot collide: every run has its
own sandbox and ``TMPDIR`` (the engine's IPC sockets and rendezvous files live there), and a
server under test takes a free port from the kernel.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Optional

from tools.jobs import in_order

from . import broken, chapter
from . import problems as P
from .judging import (
    NEEDS_GPU,
    Options,
    cannot_judge,
    chapter_tests,
    judge_file,
    record_reference_times,
)
from .signatures import drift
from .starter import StarterError, starter_source
from .verdict import ACCEPTED, TOO_SLOW, compile_check


@dataclass
class Run:
    label: str  # as printed: engine, starter, broken/<name>.toml
    file: Path
    must_pass: bool
    verdict: Optional[str] = None  # the verdict a failing run must get
    expect: Optional[str] = None  # the case it must fail first on
    slow: bool = False  # right but slow: every case passes, then Too slow on a GPU


def _runs(root: Path, p: P.Problem, tmp: Path, errors: List[str]) -> List[Run]:
    """The files to judge: the engine's module, the generated starter, each wrong answer.
    Static problems (a starter that cannot be made or drifted, a stale wrong answer) go to
    ``errors``."""
    try:
        engine = chapter.engine_source(root, p)
    except chapter.ChapterError as e:
        errors.append(str(e))
        return []
    file = tmp / "engine.py"
    file.write_text(engine, encoding="utf-8")
    runs = [Run("engine", file, True)]
    _, absent = chapter_tests(root, p, Options())
    errors += [f"{t} is not in chapter {p.chapter}'s tree" for t in absent]
    errors += chapter.later_imports(root, p)
    try:
        starter = starter_source(root, p)
    except StarterError as e:
        errors.append(f"no starter: {e}")
        return runs
    problems, notes = drift(starter, engine)
    errors += [f"drift: {x}" for x in problems]
    for note in notes:
        print(f"    note (private, not failing): {note}")
    file = tmp / "starter.py"
    file.write_text(starter, encoding="utf-8")
    error = compile_check(file, "the generated starter")
    if error:
        errors.append(f"the starter does not compile: {error}")
    runs.append(Run("starter", file, False))
    if not p.own_tests:
        errors.append("no test_*.py in the exercise directory")
    for path in p.wrong_answers:
        try:
            wrong = broken.load(path)
            file = tmp / f"broken_{path.stem}.py"
            file.write_text(wrong.apply(engine, p.module), "utf-8")
        except broken.WrongAnswerError as e:
            errors.append(str(e))
            continue
        runs.append(Run(f"broken/{path.name}", file, False, wrong.verdict, wrong.expect))
    if p.speed is not None and not p.slow_answers:
        errors.append("graded on speed, but no slow/*.toml shows that a slow answer fails")
    for path in p.slow_answers:
        if p.speed is None:
            errors.append(f"slow/{path.name}: the exercise has no [speed] table")
            continue
        try:
            slow = broken.load_slow(path)
            file = tmp / f"slow_{path.stem}.py"
            file.write_text(slow.apply(engine, p.module), "utf-8")
        except broken.WrongAnswerError as e:
            errors.append(str(e))
            continue
        runs.append(Run(f"slow/{path.name}", file, False, TOO_SLOW, slow=True))
    return runs


def _check_slow(run: Run, v, errors: List[str]) -> None:
    """A right but slow answer: every case passes; Too slow where the speed is graded."""
    graded = bool(((v.record or {}).get("speed") or {}).get("graded"))
    if v.name not in (ACCEPTED, TOO_SLOW):
        errors.append(f"{run.label} must pass every case, got {v.name}")
    elif v.accepted and graded:
        errors.append(f"{run.label} is accepted at {v.speed} but must be Too slow")
    elif v.accepted:
        print(f"    note: {run.label} passes every case; its speed is graded only on a CUDA GPU")


def check_one(root: Path, p: P.Problem, opts: Options, partial: bool = False) -> List[str]:
    """Problems found (empty when sound); prints progress. ``partial``: a GPU exercise run
    on the CPU (see the module docstring)."""
    errors: List[str] = []
    opts = replace(opts, references={})  # one run of the engine's module for every variant
    tmp = Path(tempfile.mkdtemp(prefix=f"minisgl-check-{p.id}-"))
    try:
        for run in _runs(root, p, tmp, errors):
            # a run that must fail is decided by its first failing case: stop there (saves
            # most of the chapter tests' time); the engine's own module runs every case
            full = run.must_pass or run.slow
            try:
                v = judge_file(
                    root, p, run.file, opts if full else replace(opts, first_failure=True)
                )
            except RuntimeError as e:  # the engine's own module failed its reference run
                errors.append(f"{run.label}: {e}")
                break
            shown = (
                f"{v.name} {v.passed}/{v.total}"
                + (f" at {v.case.split('::')[-1]}" if v.case else "")
                + (f" · {v.speed}" if v.speed else "")
            )
            print(
                f"    {run.label:<36} {shown}"
                + (f" ({v.skipped} GPU cases skipped)" if partial and v.skipped else "")
            )
            if run.must_pass and v.accepted and not partial and not opts.quick:
                record_reference_times(p, v)  # the per-case limits of judging.case_limits
            unrecorded = ((v.record or {}).get("reference") or {}).get("unrecorded")
            if run.must_pass and unrecorded:
                errors.append(f"the recorder cannot watch {', '.join(unrecorded)} (problem.md)")
            if run.must_pass and not v.accepted:
                detail = "\n".join("      " + ln for ln in v.detail.splitlines()[:25])
                errors.append(f"{run.label} is not accepted: {v.name}\n{detail}")
            if run.must_pass and partial and v.accepted and not v.total:
                print("    note: no case runs on the CPU; only the static checks were done here")
                break
            if run.must_pass:
                continue
            if run.slow:
                _check_slow(run, v, errors)
                continue
            if v.accepted:
                if partial and run.label != "starter":  # the starter must fail the CPU cases too
                    print(
                        f"    note: {run.label} passes the CPU cases; only the GPU cases can catch it"
                    )
                else:
                    errors.append(f"{run.label} is accepted but must fail")
                continue
            wrong = []
            if run.verdict and v.name != run.verdict:
                wrong.append(f"get {run.verdict}, got {v.name}")
            if run.expect and (not v.case or run.expect not in v.case):
                wrong.append(f"fail first at {run.expect}, failed first at {v.case or 'no case'}")
            for what in wrong:
                if partial:
                    print(f"    note: on the CPU, {run.label} did not {what}")
                else:
                    errors.append(f"{run.label} should {what}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return errors


def check_exercise(root: Path, p: P.Problem, opts: Options) -> str:
    """Check one exercise, printing its report; return "sound", "failed", "partly" or "skipped"."""
    print(f"{p.id} {p.title}")
    why = cannot_judge(root, p, opts.device)
    if why == NEEDS_GPU:
        print("    no CUDA here: static checks and the exercise's own tests on the CPU only")
        cpu = replace(opts, device="cpu", quiet=True, quick=True)
        errors = check_one(root, p, cpu, partial=True)
        for e in errors:
            print(f"  ✗ {e}")
        print(
            "  ✗ NOT SOUND"
            if errors
            else f"  ◐ partly checked, NOT judged: run `python practice/judge.py check {p.id}` on a CUDA GPU"
        )
        return "failed" if errors else "partly"
    if why:
        print(f"    skipped: {why}")
        return "skipped"
    errors = check_one(root, p, opts)
    for e in errors:
        print(f"  ✗ {e}")
    print(f"  {'✓ sound' if not errors else '✗ NOT SOUND'}")
    return "failed" if errors else "sound"


def _report_of(root: Path, pid: int, opts: Options) -> tuple[str, str]:
    """In a worker process: (the report ``check_exercise`` prints, its result)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # a worker checks one exercise at a time
        result = check_exercise(root, P.find(root / "practice" / "exercises", pid), opts)
    return out.getvalue(), result


def check(root: Path, ids: List[int], opts: Options, jobs: int = 1) -> int:
    """Check the exercises ``ids`` (all when empty), ``jobs`` at a time; 1 when any is not sound."""
    t0 = time.perf_counter()
    all_problems = P.load_all(root / "practice" / "exercises")
    chosen = [p for p in all_problems if not ids or p.id in ids]
    if jobs <= 1:  # in this process, each line printed as it comes
        results = [check_exercise(root, p, opts) for p in chosen]
    else:
        results = []
        calls = [(_report_of, (root, p.id, opts)) for p in chosen]
        for report, result in in_order(calls, jobs, processes=True):
            print(report, end="", flush=True)
            results.append(result)
    failed = [p.id for p, r in zip(chosen, results, strict=True) if r == "failed"]
    skipped = [p.id for p, r in zip(chosen, results, strict=True) if r == "skipped"]
    partly = [p.id for p, r in zip(chosen, results, strict=True) if r == "partly"]
    print(
        f"\nchecked {len(chosen) - len(skipped) - len(partly)}, failed {len(failed)} {failed or ''}"
        f"{f', partly checked without a GPU (not judged) {partly}' if partly else ''}"
        f"{f', skipped {skipped}' if skipped else ''} in {time.perf_counter() - t0:.1f} s"
    )
    return 1 if failed else 0
