"""Judge one file for one exercise: compile, build the sandbox, run, report."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import chapter, compare, integrity, runner, sandbox, speed
from .problems import Problem
from .verdict import (
    COMPILE,
    Verdict,
    against_reference,
    case_line,
    compile_check,
    first_failure_block,
    judge,
    short_name,
    verdict_line,
)


@dataclass
class Options:
    device: Optional[str] = None  # None: CUDA when available (decided in the child)
    time_limit: Optional[float] = None  # overrides problem.md's per-case limit
    keep: bool = False  # keep the sandbox for debugging
    quiet: bool = False  # no per-case lines (used by `check`)
    quick: bool = False  # only the exercise's own tests, not the chapter tests
    first_failure: bool = (
        False  # stop at the first case that does not pass (`check` of a wrong answer)
    )
    # restore the repository's engine, tests and judge after the run (`test`, `verify`);
    # never in `check`, whose files are the maintainer's and whose repository they edit
    guard_repo: bool = True
    seed: Optional[int] = None  # the seed of the drawn cases; None: drawn for each run
    # the engine's own runs, kept across the judgements of one `check` (reference_run)
    references: Optional[Dict[tuple, "Reference"]] = None


def chapter_tests(root: Path, problem: Problem, opts: Options) -> Tuple[List[str], List[str]]:
    """(chapter tests to run, those listed in problem.md that the chapter's tree lacks)."""
    if opts.quick:
        return [], []
    files = set(chapter.tree(root, problem))
    present = [
        t
        for t in problem.tests
        if t.split("::")[0] in files and (root / t.split("::")[0]).is_file()
    ]
    return present, [t for t in problem.tests if t not in present]


def rel(root: Path, path: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


NEEDS_GPU = "this exercise needs a CUDA GPU"
REPO_GUARDED = [
    "minisgl",
    "tests",
    "practice",
    "tools",
    "examples",
    "conftest.py",
    "pyproject.toml",
]
BOX_GUARDED = [
    "minisgl",
    "tests",
    "tools",
    "examples",
    f"{sandbox.PLUGIN_NAME}.py",
    f"{sandbox.RECORDER_NAME}.py",
    "sitecustomize.py",  # the guard that keeps `import minisgl` in the sandbox (tools/steps.py)
]


def cannot_judge(root: Path, problem: Problem, device: Optional[str]) -> Optional[str]:
    """Why this machine cannot judge the exercise, or None (``NEEDS_GPU`` when only a GPU is
    missing: its CPU tests can still run as a preview, never as a verdict)."""
    missing = [r for r in problem.requires if not (root / r).exists()]
    if missing:
        return f"missing {', '.join(missing)} (see the README: make models)"
    if not (root / problem.module).is_file():
        return f"the engine module {problem.module} is not in this checkout"
    if problem.module not in chapter.tree(root, problem):
        return f"the engine module {problem.module} is not in chapter {problem.chapter}'s tree"
    if problem.gpu:
        if device == "cpu" or (device is None and not cuda_available()):
            return NEEDS_GPU
    return None


def interpret_triton(problem: Problem, device: Optional[str], env: Dict[str, str]) -> None:
    """A Triton exercise (``triton = true``) runs its kernels in Triton's interpreter where
    no GPU judges it: ``TRITON_INTERPRET=1`` must be set before triton is imported."""
    if problem.triton and (device == "cpu" or (device is None and not cuda_available())):
        env["TRITON_INTERPRET"] = "1"


def count_cases(root: Path, problem: Problem, opts: Options) -> Optional[int]:
    """How many cases the exercise has, collected with the engine's own module in place."""
    device = opts.device
    box, targets = sandbox.build(root, problem, None, chapter_tests(root, problem, opts)[0])
    try:
        env = runner.child_env(
            box, device or "cpu", problem.module_name, box / "events.jsonl", root / "models"
        )
        interpret_triton(problem, device or "cpu", env)
        import subprocess

        subprocess.run(
            runner.pytest_command(box, targets, ["--collect-only"]),
            cwd=box,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=120,
            check=False,
        )
        for line in (box / "events.jsonl").read_text(encoding="utf-8").splitlines():
            ev = json.loads(json.loads(line)["s"])  # unsealed here: a count, not a verdict
            if ev.get("ev") == "collected":
                return len(ev["cases"])
    except Exception:  # noqa: BLE001 - the count is a courtesy
        return None
    finally:
        sandbox.remove(box)
    return None


@dataclass
class Reference:
    """The engine's own module run on the judged inputs: the cases it passed (the only
    cases a verdict counts) and its record (recorder.py)."""

    seed: int
    cases: List[str]
    record: compare.Record
    seconds: float
    unrecorded: List[str]  # symbols of problem.md the recorder did not find (check: an error)


def recording_env(env: Dict[str, str], box: Path, problem: Problem, seed: int) -> Dict[str, str]:
    """The child's environment for a recorded run on the inputs of ``seed``."""
    return dict(
        env,
        JUDGE_RECORD=str(box / "record.jsonl"),
        JUDGE_SYMBOLS=json.dumps(problem.record or problem.symbols),
        JUDGE_SEED=str(seed),
        PYTHONHASHSEED=str(seed % 4294967295),
    )


def draw_seed() -> int:
    import secrets

    return 1 + secrets.randbelow(2**31 - 2)


def reference_run(
    root: Path, problem: Problem, tests: List[str], opts: Options, seed: int, time_limit: float
) -> Reference:
    """Run the tests with the engine's own module in a fresh sandbox and process; if a case
    fails there on these inputs (a statistical test unlucky with this seed, say), draw
    another seed once. Raises RuntimeError when the engine itself does not pass."""
    key = (problem.id, tuple(tests), opts.device, opts.seed, opts.quick)
    if opts.references is not None and key in opts.references:
        return opts.references[key]
    for attempt in range(2):
        t0 = time.perf_counter()
        box, targets = sandbox.build(root, problem, None, tests)
        try:
            env = runner.child_env(
                box, opts.device, problem.module_name, box / "events.jsonl", root / "models"
            )
            interpret_triton(problem, opts.device, env)
            env = recording_env(env, box, problem, seed)
            res = runner.run(box, targets, env, time_limit, problem.total_time_limit)
            record = compare.load(box / "record.jsonl")
        finally:
            sandbox.remove(box)
        failed = [c.nodeid for c in res.cases if c.outcome not in ("passed", "skipped")]
        if not failed and res.finished and not res.tampered and not record.unreadable:
            ref = Reference(
                seed,
                [c.nodeid for c in res.cases if c.outcome == "passed"],
                record,
                time.perf_counter() - t0,
                res.unrecorded,
            )
            if opts.references is not None:
                opts.references[key] = ref
            return ref
        if opts.seed is not None or attempt:
            break
        seed = draw_seed()
    raise RuntimeError(
        f"the engine's own module does not pass exercise {problem.id}'s cases "
        f"(seed {seed}: {', '.join(failed[:3]) or record.unreadable or 'the run did not finish'}); "
        "this is the judge's problem, not yours: python practice/judge.py check "
        f"{problem.id} shows more"
    )


REFERENCE_TIMES = "reference_times.json"  # beside problem.md, written by `check`
LIMIT_FACTOR = 10.0  # a case may take this many times the engine's own time ...
LIMIT_FLOOR = 10.0  # ... but never less than this many seconds (a slower machine, a cold import)


def case_limits(problem: Problem, time_limit: float, opts: Options) -> Dict[str, float]:
    """Per-case limits from the engine's times that `check` recorded: ``LIMIT_FACTOR`` times
    the reference, at least ``LIMIT_FLOOR`` s, at most the exercise's ``time_limit``. An
    explicit ``--time-limit`` wins over all of them."""
    if opts.time_limit:
        return {}
    try:
        ref = json.loads((problem.dir / REFERENCE_TIMES).read_text(encoding="utf-8"))["cases"]
    except (OSError, ValueError, KeyError):
        return {}
    return {
        case: min(time_limit, max(LIMIT_FLOOR, LIMIT_FACTOR * float(sec)))
        for case, sec in ref.items()
    }


def reference_device(problem: Problem) -> str:
    """The device the reference times were measured on (they hold only there)."""
    try:
        return json.loads((problem.dir / REFERENCE_TIMES).read_text(encoding="utf-8"))["device"]
    except (OSError, ValueError, KeyError):
        return "?"


def record_reference_times(problem: Problem, v: Verdict) -> None:
    """After the engine is Accepted in `check`: its per-case times, for ``case_limits``
    (kept as they are while the cases are the same, so `check` does not churn the file)."""
    import platform

    cases = {
        c["case"]: c["seconds"]
        for c in (v.record or {}).get("cases", [])
        if c["outcome"] == "passed"
    }
    data = {
        "note": "seconds the engine's own module took per case, measured by `judge.py check`",
        "machine": (v.record or {}).get("device_name") or platform.machine(),
        "device": (v.record or {}).get("device", "?"),
        "date": time.strftime("%Y-%m-%d"),
        "cases": dict(sorted(cases.items())),
    }
    path = problem.dir / REFERENCE_TIMES
    try:
        if set(json.loads(path.read_text(encoding="utf-8"))["cases"]) == set(cases):
            return
    except (OSError, ValueError, KeyError):
        pass
    path.write_text(json.dumps(data, indent=1) + "\n", "utf-8")


def speed_part(
    root: Path, problem: Problem, box: Path, env: Dict[str, str], device: str, say
) -> speed.SpeedResult:
    """After every case passed: time the learner's module against the engine's on a CUDA
    GPU (speed.py), printing the table; on a CPU, the note that the speed part needs one."""
    assert problem.speed is not None
    if not device.startswith("cuda"):
        return speed.not_graded(problem.speed, "needs a CUDA GPU")
    say(f"  timing your module against the reference ({problem.speed.bench}) ...")
    sr = speed.grade(speed.run_bench(box, root, problem, env), problem.speed)
    for line in sr.table():
        say(line)
    return sr


def _digest(record: compare.Record) -> str:
    import hashlib

    text = json.dumps(record.cases, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def judge_file(root: Path, problem: Problem, file: Path, opts: Options) -> Verdict:
    t0 = time.perf_counter()
    say = (lambda *a: None) if opts.quiet else print  # noqa: E731
    time_limit = opts.time_limit or problem.time_limit
    shown = rel(root, file)
    say(f"Judging {problem.id} · {problem.title}")
    say(f"  file {shown} → {problem.module}, in chapter {problem.chapter}'s engine")
    error = compile_check(file, shown)
    if error is not None:
        v = Verdict(COMPILE, 0, count_cases(root, problem, opts), detail=error)
        for line in first_failure_block(v):
            say(line)
        say(verdict_line(v, opts.device or "-"))
        say(f"Judge time: {time.perf_counter() - t0:.1f} s")
        return v
    tests, missing = chapter_tests(root, problem, opts)
    for t in missing:
        say(f"  note: {t} is not in chapter {problem.chapter}'s tree; judging without it")
    # what a submission could rewrite: the repository's engine, tests and judge (restored
    # and named after the run), and the sandbox's copies (hashed)
    repo_guard = (
        integrity.FileGuard(root, REPO_GUARDED, skip=["practice/workspace"])
        if opts.guard_repo
        else None
    )
    seed = opts.seed if opts.seed is not None else draw_seed()
    say("  running the engine's own module on this run's inputs ...")
    reference = reference_run(root, problem, tests, opts, seed, time_limit)
    seed = reference.seed
    box, targets = sandbox.build(root, problem, file, tests)
    box_guard = integrity.FileGuard(box, BOX_GUARDED, skip=[problem.module], keep=False)
    integrity.protect(box, BOX_GUARDED, leave=box / problem.module)
    try:
        env = runner.child_env(
            box, opts.device, problem.module_name, box / "events.jsonl", root / "models"
        )
        interpret_triton(problem, opts.device, env)
        env = recording_env(env, box, problem, seed)
        width = 60
        limits = case_limits(problem, time_limit, opts)
        ref_device = reference_device(problem)

        def on_event(ev: dict) -> None:
            nonlocal width
            if ev.get("ev") == "collected" and ev["cases"]:
                width = min(90, max(len(short_name(c)) for c in ev["cases"]))
            elif ev.get("ev") == "session":
                limit_text = (
                    f"{LIMIT_FACTOR:g}x the engine's time ({LIMIT_FLOOR:g}-{time_limit:g} s)"
                    if limits and ev["device"].split(":")[0] == ref_device
                    else f"{time_limit:g} s"
                )
                say(
                    f"  device {ev['device']} ({ev.get('device_name', '')}), "
                    f"limits {limit_text} per case, {problem.total_time_limit:g} s in all"
                )
            elif ev.get("ev") == "result":
                say(case_line(ev["case"], ev["outcome"], ev.get("duration", 0.0), width))

        res = runner.run(
            box,
            targets,
            env,
            time_limit,
            problem.total_time_limit,
            on_event,
            extra=["-x"] if opts.first_failure else None,
            case_limits=limits,
            limits_device=ref_device,
        )
        res.tampered += [f"{what} (in the sandbox)" for what in box_guard.changes()] + [
            f"{what} (in the repository; restored)"
            for what in (repo_guard.changes(restore=True) if repo_guard else [])
        ]
        if res.module_file and not Path(res.module_file).resolve().is_relative_to(box.resolve()):
            raise RuntimeError(
                f"the tests imported {res.module_file}, not the sandbox copy; "
                "is minisgl installed somewhere that shadows PYTHONPATH?"
            )
        ref_total = count_cases(root, problem, opts) if res.collect_errors else None
        v = judge(problem, res, time_limit, problem.total_time_limit, ref_total)
        # the verdict's evidence: what the code did against what the engine's did
        record = compare.load(box / "record.jsonl")
        recorded = [c for c in reference.cases if problem.recorded(c)]
        agree, differ = compare.compare(record, reference.record, recorded)
        v = against_reference(v, problem, res, reference.cases, differ)
        v.record = {
            "cases": [
                {"case": c.nodeid, "outcome": c.outcome, "seconds": round(c.duration, 4)}
                for c in res.cases
            ],
            "device": res.device,
            "device_name": res.device_name,
            "versions": res.versions,
            "targets": targets,
            "seed": seed,
            "reference": {
                "cases": len(reference.cases),
                "agree": len(agree),
                "record_sha256": _digest(reference.record),
                "unrecorded": reference.unrecorded,
                "differ": dict(list(differ.items())[:5]),
            },
            "record_sha256": _digest(record),
        }
        for prefix in {str(box), str(box.resolve())}:  # show paths as the learner knows them
            v.detail = v.detail.replace(f"{prefix}/{problem.module}", shown).replace(
                f"{prefix}/", ""
            )
        v.detail = v.detail.replace(f"{problem.module}:", f"{shown}:").replace(
            f'"{problem.module}"', f'"{shown}"'
        )
        if problem.speed is not None and v.accepted:
            sr = speed_part(root, problem, box, env, res.device, say)
            changed = [f"{what} (in the sandbox)" for what in box_guard.changes()] + [
                f"{what} (in the repository; restored)"
                for what in (repo_guard.changes(restore=True) if repo_guard else [])
            ]
            if changed:
                sr = speed.grade(
                    {"tamper": [f"{c}, by the speed run" for c in changed]}, problem.speed
                )
            speed.apply(v, sr)
        for line in first_failure_block(v):
            say(line)
        device = f"{res.device} ({res.device_name})" if res.device_name else res.device
        say(verdict_line(v, device))
        if opts.keep:
            say(f"  sandbox kept at {box}")
        say(f"Judge time: {time.perf_counter() - t0:.1f} s")
        return v
    finally:
        if not opts.keep:
            sandbox.remove(box)


# -- the learner's progress ---------------------------------------------------------------


def status_path(root: Path) -> Path:
    return root / "practice" / "workspace" / ".status.json"


def read_status(root: Path) -> dict:
    try:
        return json.loads(status_path(root).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def write_status(root: Path, pid: int, state: str, cases: str = "") -> None:
    path = status_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = read_status(root)
    old = data.get(str(pid), {})
    if old.get("status") == "accepted" and state != "accepted":
        state = "accepted"  # once accepted, stays accepted
    data[str(pid)] = {
        "status": state,
        "cases": cases or old.get("cases", ""),
        "updated": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    tmp = path.with_name(f".status.{os.getpid()}.tmp")  # atomic; judges may run side by side
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)
