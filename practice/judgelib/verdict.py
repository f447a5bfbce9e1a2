"""From a RunResult to a verdict, and the text the learner reads."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from .problems import Problem
from .runner import Case, RunResult

ACCEPTED = "Accepted"
WRONG = "Wrong answer"
RUNTIME = "Runtime error"
TLE = "Time limit exceeded"
COMPILE = "Compile error"
REJECTED = "Rejected"  # the submission changed the judge (integrity.py)
TOO_SLOW = "Too slow"  # right, but under an exercise's speed threshold (speed.py)
MAX_LINES = 30
MAX_LINE = 200


@dataclass
class Verdict:
    name: str
    passed: int
    total: Optional[int]
    skipped: int = 0
    detail: str = ""  # the first failure, formatted
    case: Optional[str] = None  # the case the verdict is about
    hint: Optional[str] = None
    record: Optional[dict] = None  # per-case outcomes, device, versions (record.py)
    speed: Optional[str] = None  # the speed part of the verdict line (speed.py)

    @property
    def accepted(self) -> bool:
        return self.name == ACCEPTED


def trim(text: str, max_lines: int = MAX_LINES, tail: bool = False) -> str:
    lines = [
        ln if len(ln) <= MAX_LINE else ln[:MAX_LINE] + " [...]" for ln in text.rstrip().splitlines()
    ]
    if len(lines) > max_lines:
        cut = len(lines) - max_lines
        lines = (
            ([f"[... {cut} lines cut ...]"] + lines[-max_lines:])
            if tail
            else (lines[:max_lines] + [f"[... {cut} lines cut ...]"])
        )
    return "\n".join(lines)


def short_name(nodeid: str) -> str:
    return nodeid.removeprefix("tests/")


def compile_check(path: Path, shown_as: str) -> Optional[str]:
    """None if the file compiles, else ``file:line:col: message`` plus the line and a caret."""
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return f"{shown_as}: cannot read the file: {e}"
    try:
        compile(source, shown_as, "exec")
    except SyntaxError as e:
        out = f"{shown_as}:{e.lineno}:{e.offset or 0}: {type(e).__name__}: {e.msg}"
        if e.text:
            line = e.text.rstrip("\n")
            stripped = line.lstrip()
            col = max(0, (e.offset or 1) - 1 - (len(line) - len(stripped)))
            out += f"\n    {stripped}\n    {' ' * col}^"
        return out
    except ValueError as e:  # e.g. null bytes
        return f"{shown_as}: {e}"
    return None


def _describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "the test process stopped"
    if code < 0:
        try:
            return f"the test process was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"the test process was killed by signal {-code}"
    return f"the test process exited with code {code}"


_REPR_NOISE = re.compile(
    r"<\[(\w+)\((?:[^\[\]]|\[[^\]]*\])*?\) raised in repr\(\)\] (\w+) object at 0x[0-9a-f]+>"
)


def clean(text: str) -> str:
    """pytest's ``<[AttributeError(...) raised in repr()] Batch object at 0x7f..>`` (an
    object whose __repr__ failed while the traceback was written) as ``<Batch object>``."""
    return _REPR_NOISE.sub(lambda m: f"<{m.group(2)} object>", text)


def _failure_text(case: Case) -> str:
    f = {k: clean(v) if isinstance(v, str) else v for k, v in (case.failure or {}).items()}
    parts = []
    if f.get("longrepr"):
        parts.append(trim(f["longrepr"], tail=True))
    elif f.get("message"):
        parts.append(trim(f["message"]) + (f"\n  at {f['location']}" if f.get("location") else ""))
    for stream in ("stdout", "stderr"):
        if f.get(stream):
            parts.append(f"captured {stream}:\n" + trim(f[stream], 10))
    return "\n".join(parts)


def judge(
    problem: Problem,
    res: RunResult,
    time_limit: float,
    total_limit: float,
    reference_total: Optional[int] = None,
) -> Verdict:
    ran = [c for c in res.cases if c.outcome != "skipped"]
    passed = sum(c.outcome == "passed" for c in ran)
    skipped = len(res.cases) - len(ran)
    total = len(ran) if not res.collect_errors else reference_total
    v = Verdict(ACCEPTED, passed, total, skipped)
    if res.tampered:
        seen = list(dict.fromkeys(res.tampered))
        return _with(
            v,
            REJECTED,
            None,
            problem,
            "the submission changed the judge:\n"
            + "\n".join(f"- {t}" for t in seen[:200])
            + (f"\n[... {len(seen) - 12} more]" if len(seen) > 12 else ""),
        )
    if res.collect_errors:
        err = res.collect_errors[0]
        name = COMPILE if "SyntaxError" in err.get("message", "") else RUNTIME
        return _with(
            v,
            name,
            None,
            problem,
            f"while importing {err.get('nodeid') or 'the tests'}:\n"
            + trim(err.get("longrepr", ""), tail=True),
        )
    first: Optional[Case] = next((c for c in ran if c.outcome != "passed"), None)
    if first is None:
        if res.killed_for == "total":
            return _with(
                v, TLE, None, problem, f"the run went past its total limit of {total_limit:.0f} s"
            )
        if res.killed_for == "collect":
            return _with(
                v,
                TLE,
                None,
                problem,
                "importing your module and the tests did not finish "
                "(a loop at module level?)\n" + trim(res.log_tail, 15, tail=True),
            )
        if not res.finished or res.returncode not in (0, 5):
            return _with(
                v,
                RUNTIME,
                None,
                problem,
                _describe_exit(res.returncode)
                + " outside any test case\n"
                + trim(res.log_tail, 15, tail=True),
            )
        if not res.cases:
            return _with(
                v, RUNTIME, None, problem, "no test case ran\n" + trim(res.log_tail, 15, tail=True)
            )
        if res.survivors:
            return _with(
                v,
                RUNTIME,
                None,
                problem,
                "processes started by the run were still running after it (killed):\n"
                + "\n".join(f"- {s}" for s in res.survivors[:5]),
            )
        return v
    if first.outcome == "timeout":
        limit = (res.case_limit or time_limit) if res.killed_for == "case" else total_limit
        what = {"case": "case", "setup": "fixture setup"}.get(res.killed_for or "", "run")
        return _with(
            v,
            TLE,
            first.nodeid,
            problem,
            f"{short_name(first.nodeid)} ran past the {what} limit of {limit:g} s (killed)"
            + (
                "\nwhere it was when stopped (innermost first):\n" + res.hang_stack
                if res.hang_stack
                else ""
            ),
        )
    if first.outcome == "crashed":
        return _with(
            v,
            RUNTIME,
            first.nodeid,
            problem,
            f"{_describe_exit(res.returncode)} while running {short_name(first.nodeid)}\n"
            + trim(res.log_tail, 15, tail=True),
        )
    if first.outcome == "not run":
        return _with(
            v,
            RUNTIME,
            first.nodeid,
            problem,
            f"{short_name(first.nodeid)} did not run\n" + trim(res.log_tail, 15, tail=True),
        )
    exc = (first.failure or {}).get("exc_type")
    name = WRONG if exc in ("AssertionError", "Failed", None) else RUNTIME
    v = _with(v, name, first.nodeid, problem, _failure_text(first))
    message = (first.failure or {}).get("message", "")
    if exc == "NotImplementedError" and "Exercise" in message:
        v.hint = (
            "this is still the starter's placeholder: "
            + message.split("Exercise", 1)[1].split(":", 1)[-1].strip()
        )
    elif name == RUNTIME:
        # a hint is about a wrong value; an exception in the code is its own message
        v.hint = None
    return v


def against_reference(
    v: Verdict, problem: Problem, res: RunResult, reference: List[str], differ: dict
) -> Verdict:
    """The verdict once the records are compared (compare.py). The cases are the ones the
    engine's own module passed (``reference``); the learner's process saying a case passed
    is needed, never enough: its record must agree with the engine's, and a case it did not
    run, skipped or reported twice is a failure. A verdict that is already a failure of the
    learner's run (an exception, a time-out, a changed judge) stays as it is."""
    outcome = {c.nodeid: c.outcome for c in res.cases}
    v.total = len(reference)
    v.passed = sum(outcome.get(c) == "passed" and c not in differ for c in reference)
    v.skipped = sum(c.outcome == "skipped" and c.nodeid not in reference for c in res.cases)
    if not v.accepted:
        return v
    if not reference:
        return _with(v, RUNTIME, None, problem, "the engine's own module passed no case here")
    for case in reference:
        if outcome.get(case) != "passed":
            state = outcome.get(case, "not reported")
            return _with(
                v, WRONG, case, problem, f"{short_name(case)} was {state} where the engine's ran"
            )
        if case in differ:
            return _with(
                v,
                WRONG,
                case,
                problem,
                f"{short_name(case)} was reported passed, but your code did not do what the "
                f"engine's did on the same inputs:\n{differ[case]}",
            )
    return v


GENERAL = "general advice from the statement, not about this failure: "


def _with(v: Verdict, name: str, case: Optional[str], problem: Problem, detail: str) -> Verdict:
    """Set the verdict; the hint only where it matches: the one keyed by the failing test
    for a wrong answer, else (an exercise test's wrong answer) the statement's general
    advice, marked as such; none for anything else."""
    v.name, v.case, v.detail = name, case, detail
    v.hint = None
    if name != WRONG or not case:
        return v
    test = case.split("::")[-1]
    keyed = problem.hint_for(test, general=False)
    if keyed:
        v.hint = keyed
    elif case.startswith(f"tests/test_ex{problem.id}_"):
        general = problem.hint_for("\0", general=True)
        v.hint = GENERAL + general if general else None
    return v


def verdict_line(v: Verdict, device: str) -> str:
    total = "?" if v.total is None else str(v.total)
    skipped = f" ({v.skipped} skipped)" if v.skipped else ""
    speed = f" · {v.speed}" if v.speed else ""
    return f"Verdict: {v.name} · {v.passed} / {total} cases{skipped}{speed} · device {device}"


def case_line(nodeid: str, outcome: str, duration: float, width: int = 64) -> str:
    mark = {"passed": "✓", "skipped": "○", "timeout": "⏱"}.get(outcome, "✗")
    note = {"timeout": "  time limit exceeded", "crashed": "  crashed", "skipped": "  skipped"}.get(
        outcome, ""
    )
    return f"  {mark} {short_name(nodeid):<{width}} {duration:6.2f}s{note}"


def first_failure_block(v: Verdict) -> List[str]:
    if v.accepted:
        return []
    head = f"First failure: {short_name(v.case)}" if v.case else "Failure:"
    lines = [head] + ["  " + ln for ln in v.detail.splitlines()]
    if v.hint:
        lines.append(f"Hint: {v.hint}")
    return lines
