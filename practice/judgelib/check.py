"""`judge.py check`: the maintainer's proof that every exercise is sound.

For each exercise: starter and engine module have the same public signatures and
docstrings; the starter raises ``NotImplementedError("Exercise <id>: ...")``; the engine's
own module is Accepted; the untouched starter is not; and every known wrong answer in
``broken/`` is not Accepted and fails first on the case it names. A wrong answer is
``broken/<name>.json``: ``{"about": ..., "expect": "<test name>", "replace": [[old, new], ...]}``
applied to the current engine module (so it follows the engine as it changes; a replacement
that no longer matches is reported), or a whole ``broken/<name>.py`` with a
``# judge-expect: <test name>`` line.

A ``gpu: true`` exercise on a machine without CUDA is only *partly* checked: the static
checks, then its own tests on the CPU (the GPU cases skip), engine against starter; a wrong
answer that only the GPU cases catch is a note there, not an error (the starter must still
fail). The report says so and
never calls such an exercise sound: only ``check`` on a CUDA machine judges it.

``check --jobs N`` checks N exercises at once, each in a worker process of its own whose
report is printed as one block when it is done, in the exercises' order (tools/jobs.py, as
``python -m tools.steps check --jobs``). Side by side they cannot collide: every run has its
own sandbox and ``TMPDIR`` (the engine's IPC sockets and rendezvous files live there), and a
server under test takes a free port from the kernel.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import List

from tools.jobs import in_order

from . import problems as P
from .judging import NEEDS_GPU, Options, cannot_judge, judge_file
from .signatures import drift
from .verdict import compile_check


def _expected_case(path: Path) -> str | None:
    m = re.search(r"^# judge-expect:\s*(\S+)", path.read_text(encoding="utf-8"), flags=re.M)
    return m.group(1) if m else None


def make_broken(engine_source: str, spec_path: Path, out_dir: Path) -> tuple[Path, str | None]:
    """Write the wrong answer described by ``spec_path``; return (file, expected case)."""
    if spec_path.suffix == ".py":
        return spec_path, _expected_case(spec_path)
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    source = engine_source
    for old, new in spec["replace"]:
        if source.count(old) != 1:
            raise ValueError(
                f"{spec_path.name}: {old!r} occurs {source.count(old)} times in the engine module"
            )
        source = source.replace(old, new)
    out = out_dir / f"{spec_path.stem}.py"
    out.write_text(source, encoding="utf-8")
    return out, spec.get("expect")


def check_one(root: Path, p: P.Problem, opts: Options, partial: bool = False) -> List[str]:
    """Problems found (empty when sound); prints progress. ``partial``: a GPU exercise run
    on the CPU (see the module docstring)."""
    errors: List[str] = []
    engine = root / p.module
    problems, notes = drift(p.starter, engine)
    errors += [f"drift: {x}" for x in problems]
    for note in notes:
        print(f"    note (private, not failing): {note}")
    starter_text = p.starter.read_text(encoding="utf-8")
    if f'NotImplementedError("Exercise {p.id}' not in starter_text:
        errors.append(f'starter never raises NotImplementedError("Exercise {p.id}: ...")')
    if not p.own_tests:
        errors.append("no test_*.py in the exercise directory")
    error = compile_check(p.starter, "starter.py")
    if error:
        errors.append(f"the starter does not compile: {error}")
    runs = [("engine", engine, True, None), ("starter", p.starter, False, None)]
    tmp = Path(tempfile.mkdtemp(prefix=f"minisgl-check-{p.id}-"))
    try:
        for spec in sorted((p.dir / "broken").glob("*.*")):
            if spec.suffix in (".py", ".json"):
                try:
                    file, expect = make_broken(engine.read_text(encoding="utf-8"), spec, tmp)
                    runs.append((f"broken/{spec.name}", file, False, expect))
                except ValueError as e:
                    errors.append(f"stale wrong answer: {e}")
        for label, file, should_pass, expect in runs:
            # a run that must fail is decided by its first failing case: stop there (saves
            # most of the chapter tests' time); the engine's own module runs every case
            v = judge_file(
                root, p, file, opts if should_pass else replace(opts, first_failure=True)
            )
            shown = f"{v.name} {v.passed}/{v.total}" + (
                f" at {v.case.split('::')[-1]}" if v.case else ""
            )
            print(
                f"    {label:<36} {shown}"
                + (f" ({v.skipped} GPU cases skipped)" if partial and v.skipped else "")
            )
            if should_pass and not v.accepted:
                detail = "\n".join("      " + ln for ln in v.detail.splitlines()[:25])
                errors.append(f"{label} is not accepted: {v.name}\n{detail}")
            if partial and should_pass and v.accepted and not v.total:
                print("    note: no case runs on the CPU; only the static checks were done here")
                break
            if not should_pass and v.accepted:
                if partial and label != "starter":  # the starter must fail the CPU cases too
                    print(
                        f"    note: {label} passes the CPU cases; only the GPU cases can catch it"
                    )
                else:
                    errors.append(f"{label} is accepted but must fail")
            if expect and v.case and expect not in v.case:
                if partial:
                    print(
                        f"    note: {label} failed first at {v.case.split('::')[-1]} on the CPU, not at {expect}"
                    )
                else:
                    errors.append(
                        f"{label} should fail first at {expect}, failed first at {v.case}"
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return errors


def check_exercise(root: Path, p: P.Problem, opts: Options) -> str:
    """Check one exercise, printing its report; return "sound", "failed", "partly" or "skipped"."""
    print(f"{p.id} {p.title}")
    why = cannot_judge(root, p, opts.device)
    if why == NEEDS_GPU:
        print("    no CUDA here: static checks and the exercise's own tests on the CPU only")
        cpu = Options("cpu", opts.time_limit, opts.keep, quiet=True, quick=True)
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
