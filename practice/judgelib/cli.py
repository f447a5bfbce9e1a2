"""Command line of practice/judge.py: list, start, test (the default), doctor, solution, check."""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import List, Optional

from . import chapter
from . import problems as P
from .judging import NEEDS_GPU, Options, cannot_judge, judge_file, read_status, rel, write_status
from .signatures import locate
from .starter import StarterError, starter_source

DEFAULT_ROOT = Path(__file__).resolve().parents[2]
CHECK_SEED = 1  # `check` proves the tests and wrong answers on one fixed draw


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="judge.py",
        description="Judge your implementation of an engine component.",
        epilog="`judge.py 191` is short for `judge.py test 191`.",
    )
    p.add_argument(
        "--root", type=Path, default=DEFAULT_ROOT, help="repository root (default: this checkout)"
    )
    sub = p.add_subparsers(dest="cmd")
    sub.add_parser("list", help="exercises in chapter order, and your progress")
    s = sub.add_parser(
        "start", help="write the starter into practice/workspace/ and show the statement"
    )
    s.add_argument("id", type=int)
    s.add_argument("--force", action="store_true", help="overwrite your workspace file")
    t = sub.add_parser("test", help="judge your file (the default command)")
    t.add_argument("id", type=int)
    t.add_argument(
        "--file", type=Path, help="judge this file instead of practice/workspace/<id>_<slug>.py"
    )
    t.add_argument("--report", type=Path, help="write the verdict record (JSON) to this file")
    ve = sub.add_parser(
        "verify", help="re-judge the file a verdict record names and compare with the record"
    )
    ve.add_argument("record", type=Path)
    ve.add_argument("--file", type=Path, help="the submitted file, if it moved since")
    c = sub.add_parser("check", help="maintainers: engine passes, starter fails, signatures match")
    c.add_argument("ids", type=int, nargs="*")
    c.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=1,
        help="exercises checked at once, each report printed whole when done (default 1)",
    )
    for q in (t, c, ve):
        q.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
        q.add_argument(
            "--time-limit", type=float, help="seconds per case (default: from problem.md)"
        )
        q.add_argument("--keep", action="store_true", help="keep the sandbox directory")
        q.add_argument(
            "--quick", action="store_true", help="only the exercise's own tests (no chapter tests)"
        )
    for q, default in ((t, "drawn for the run"), (c, f"{CHECK_SEED}, so `check` repeats itself")):
        q.add_argument("--seed", type=int, help=f"the seed of the drawn cases (default: {default})")
    b = sub.add_parser("bug", help="spot the bug: the engine's module with a known bug planted")
    b.add_argument("id", type=int)
    b.add_argument("--reveal", action="store_true", help="show what the planted bug was")
    b.add_argument("--new", action="store_true", help="plant another of the known bugs")
    b.add_argument("--variant", type=int, help="plant this one (1, 2, ...) of the known bugs")
    sub.add_parser("doctor", help="what this machine can judge")
    so = sub.add_parser("solution", help="where the reference implementation lives")
    so.add_argument("id", type=int)
    so.add_argument("--yes", action="store_true", help="skip the confirmation")
    return p


def _problem(root: Path, pid: int) -> P.Problem:
    try:
        return P.find(root / "practice" / "exercises", pid)
    except KeyError:
        ids = ", ".join(str(p.id) for p in P.load_all(root / "practice" / "exercises"))
        raise SystemExit(f"no exercise {pid}; exercises: {ids or 'none'}") from None


FIRST = 171  # the easiest exercise: where the README's first hour sends a newcomer


def cmd_list(root: Path) -> int:
    status = read_status(root)
    problems = P.load_all(root / "practice" / "exercises")
    first = next((p for p in problems if p.id == FIRST), None)
    if first is not None and status.get(str(FIRST), {}).get("status") != "accepted":
        print(
            f"New here? Start with {first.id}, {first.title} ({first.difficulty}, chapter "
            f"{first.chapter}): python practice/judge.py start {first.id}\n"
        )
    rows = [
        (
            str(p.id),
            p.title,
            f"ch{p.chapter:02d}",
            p.difficulty,
            "GPU" if p.gpu else ("CPU ok, speed on GPU" if p.speed else "CPU ok"),
            status.get(str(p.id), {}).get("status", "not started").replace("_", " "),
        )
        for p in sorted(problems, key=lambda p: (p.chapter, p.id))
    ]
    head = ("id", "title", "chapter", "difficulty", "device", "status")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


def cmd_start(root: Path, pid: int, force: bool) -> int:
    problem = _problem(root, pid)
    dest = root / "practice" / "workspace" / problem.workspace_name
    if dest.exists() and not force:
        print(f"{rel(root, dest)} exists; keeping it (use --force to start over)")
    else:
        try:
            starter = starter_source(root, problem)
        except StarterError as e:
            print(f"cannot write the starter: {e}")
            print(
                f"(the engine changed; {rel(root, problem.dir / 'problem.md')} no longer fits it)"
            )
            return 3
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(starter, encoding="utf-8")
        print(
            f"wrote {rel(root, dest)}, made from {problem.module} "
            f"as chapter {problem.chapter} leaves it"
        )
        if read_status(root).get(str(pid), {}).get("status") != "accepted":
            write_status(root, pid, "started")
    print()
    print(f"# {problem.id}. {problem.title}   (chapter {problem.chapter}, {problem.difficulty})\n")
    print(problem.statement())
    print(f"\nEdit {rel(root, dest)}, then run: python practice/judge.py {pid}")
    print(f"Hints: {rel(root, problem.dir / 'problem.md')} (## Hints)")
    return 0


def cmd_test(root: Path, args) -> int:
    problem = _problem(root, args.id)
    file = args.file or root / "practice" / "workspace" / problem.workspace_name
    if not file.is_file():
        if args.file:
            print(f"{args.file} does not exist (the file given with --file)")
        else:
            print(
                f"{rel(root, file)} does not exist; run: python practice/judge.py start {args.id}"
            )
        return 2
    why = cannot_judge(root, problem, args.device)
    preview = why == NEEDS_GPU and args.quick
    if why and not preview:
        more = (
            f"; `judge.py {args.id} --quick --device cpu` runs its CPU tests as a preview"
            if why == NEEDS_GPU
            else ""
        )
        print(f"cannot judge {args.id} on this machine: {why}{more}")
        return 2
    device = "cpu" if preview else args.device
    v = judge_file(
        root,
        problem,
        file,
        Options(device, args.time_limit, args.keep, quick=args.quick, seed=args.seed),
    )
    if preview:
        # the GPU cases are skipped when collected, or deselected before (the repo's conftest)
        ran = f"{v.skipped} GPU cases were skipped" if v.skipped else "no case that needs CUDA ran"
        print(f"CPU preview only: {ran}. Exercise {args.id} is judged on a CUDA GPU.")
    if args.report:
        from . import record

        record.write(args.report, record.make(root, problem, file, v, args.quick))
        print(f"record written to {args.report}")
    if args.file is None:
        write_status(
            root,
            problem.id,
            "accepted" if v.accepted and not args.quick else "started",
            f"{v.passed}/{v.total}",
        )
    return 0 if v.accepted else 1


def cmd_verify(root: Path, args) -> int:
    import json

    from . import record

    try:
        old = json.loads(args.record.read_text(encoding="utf-8"))
        pid, file = int(old["exercise"]), Path(args.file or old["submission"]["path"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"{args.record} is not a verdict record: {e}")
        return 2
    problem = _problem(root, pid)
    if not file.is_file():
        print(f"{file} (the file the record names) does not exist; give it with --file")
        return 2
    quick = bool(old.get("quick"))
    opts = Options(
        args.device or old.get("device"),
        args.time_limit,
        args.keep,
        quick=quick,
        seed=old.get("seed"),  # the same inputs as the recorded run
    )
    v = judge_file(root, problem, file, opts)
    diffs = record.compare(old, record.make(root, problem, file, v, quick))
    errors = [d for d in diffs if not d.startswith("note:")]
    for d in diffs:
        print(f"  {d}")
    print(
        f"Record {'verified' if not errors else 'NOT verified'}: {old['verdict']} · "
        f"{old['passed']} / {old['total']} cases, exercise {pid}, {args.record}"
    )
    return 0 if not errors else 1


def cmd_solution(root: Path, pid: int, yes: bool) -> int:
    problem = _problem(root, pid)
    if not yes:
        try:
            answer = input(
                f"Show where the reference for {pid} lives? This spoils the exercise. [y/N] "
            )
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("not shown")
            return 1
    n, module = problem.chapter, problem.module
    try:
        source = chapter.engine_source(root, problem)
    except chapter.ChapterError as e:
        print(e)
        return 2
    dest = root / "practice" / "workspace" / f"reference_{problem.workspace_name}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(source, encoding="utf-8")
    print(f"The reference is the engine itself, as chapter {n} leaves {module}: {rel(root, dest)}")
    print(f"(python -m tools.steps show {n} {module} prints it too)")
    for sym, first, last in locate(source, problem.symbols):
        print(f"  {sym:<40} lines {first}-{last}")
    print(f"Judge it to see it pass: python practice/judge.py {pid} --file {rel(root, dest)}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        sys.stdout.reconfigure(errors="replace")  # type: ignore[attr-defined]
    except AttributeError:
        pass
    # `judge.py 191 ...` means `judge.py test 191 ...`
    i = next(
        (
            k
            for k, a in enumerate(argv)
            if not a.startswith("-") and not (k and argv[k - 1] == "--root")
        ),
        None,
    )
    if i is not None and argv[i].isdigit():
        argv.insert(i, "test")
    args = _parser().parse_args(argv)
    root = args.root.resolve()
    try:
        if args.cmd == "list":
            return cmd_list(root)
        if args.cmd == "start":
            return cmd_start(root, args.id, args.force)
        if args.cmd == "test":
            return cmd_test(root, args)
        if args.cmd == "bug":
            from .bug import cmd_bug

            return cmd_bug(root, _problem(root, args.id), args.variant, args.reveal, args.new)
        if args.cmd == "verify":
            return cmd_verify(root, args)
        if args.cmd == "solution":
            return cmd_solution(root, args.id, args.yes)
        if args.cmd == "doctor":
            from .doctor import doctor

            return doctor(root)
        if args.cmd == "check":
            from .check import check

            return check(
                root,
                args.ids,
                Options(
                    args.device,
                    args.time_limit,
                    args.keep,
                    quiet=True,
                    quick=args.quick,
                    guard_repo=False,
                    seed=CHECK_SEED if args.seed is None else args.seed,
                ),
                args.jobs,
            )
        _parser().print_help()
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted")
        return 130
    except Exception:  # noqa: BLE001 - a bug in the judge, not in the learner's code
        print("judge error (a bug in the judge, not in your code):")
        traceback.print_exc(file=sys.stdout)
        return 3
