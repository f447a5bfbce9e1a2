"""Run pytest in the sandbox as a child process and watch it.

The child writes JSON events (see plugin.py); this side reads them as they come, and kills
the child's whole process group when a case runs past its limit or the run past the total
limit. Whatever the learner's code does (raise, hang, exit, flood the output), the result
is a RunResult, never an exception in the judge.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from . import integrity
from .sandbox import PLUGIN_NAME

MAX_FILE_BYTES = 256 * 1024 * 1024  # a learner printing without end hits this, not the disk
POLL_S = 0.05
COLLECT_LIMIT_S = 300.0  # importing the engine and the tests (torch, transformers) on a slow CPU


@dataclass
class Case:
    nodeid: str
    outcome: str = "not run"  # passed | failed | skipped | timeout | crashed | not run
    duration: float = 0.0
    failure: Optional[dict] = None


@dataclass
class RunResult:
    cases: List[Case] = field(default_factory=list)
    collect_errors: List[dict] = field(default_factory=list)
    device: str = "?"
    device_name: str = ""
    module_file: Optional[str] = None
    finished: bool = False  # the child reached the end of the session
    returncode: Optional[int] = None
    killed_for: Optional[str] = None  # "case", "setup" (a fixture), "collect" or "total"
    log_tail: str = ""
    case_limit: float = 0.0  # the limit of the last case that started its body
    hang_stack: str = ""  # where a case past its limit was (faulthandler), its frames only
    tampered: List[str] = field(default_factory=list)  # how the judge's machinery changed
    survivors: List[str] = field(default_factory=list)  # processes that outlived the run
    unrecorded: List[str] = field(default_factory=list)  # symbols the recorder could not watch
    versions: Dict[str, str] = field(default_factory=dict)
    wall: Dict[str, float] = field(default_factory=dict)  # case -> seconds, the judge's clock


def limit_child() -> None:
    """In a judged child before it runs: output files capped, no core dumps."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    _signal_group(proc, signal.SIGKILL)
    proc.wait()


def _tail(path: Path, limit: int = 3000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def child_env(
    box: Path,
    device: Optional[str],
    module_name: str,
    events: Path,
    models_dir: Optional[Path] = None,
) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(
        JUDGE_EVENTS=str(events),
        JUDGE_MODULE=module_name,
        # the sandbox first; what was on the path stays after it (packages installed with
        # --target on a GPU machine, say), except folders with their own minisgl/
        PYTHONPATH=os.pathsep.join(
            [str(box)]
            + [
                p
                for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                if p and not (Path(p) / "minisgl").is_dir()
            ]
        ),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        TMPDIR=str(box / "tmp"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    env.pop("PYTEST_ADDOPTS", None)
    if (
        models_dir is not None
    ):  # the tests build missing models into the repo's cache, not the sandbox
        env.setdefault("MINISGL_MODELS_DIR", str(models_dir))
    if device:
        env["MINISGL_DEVICE"] = device
    else:
        env.pop("MINISGL_DEVICE", None)
    return env


def uses_hypothesis(box: Path, targets: List[str]) -> bool:
    files = [box / t.split("::")[0] for t in targets] + list(box.glob("**/conftest.py"))
    for f in files:
        try:
            if "hypothesis" in f.read_text(encoding="utf-8", errors="replace"):
                return True
        except OSError:
            continue
    return False


def pytest_command(box: Path, targets: List[str], extra: Optional[List[str]] = None) -> List[str]:
    # hypothesis' pytest plugin costs seconds at startup; load it only for tests that use it
    skip = [] if uses_hypothesis(box, targets) else ["-p", "no:hypothesispytest"]
    return [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        PLUGIN_NAME,
        "-p",
        "no:cacheprovider",
        *skip,
        "-q",
        "--no-header",
        "-rN",
        "--tb=short",
        *(extra or []),
        *targets,
    ]


def run(
    box: Path,
    targets: List[str],
    env: Dict[str, str],
    time_limit: float,
    total_limit: float,
    on_event=None,
    setup_limit: Optional[float] = None,
    extra: Optional[List[str]] = None,
    case_limits: Optional[Dict[str, float]] = None,
    limits_device: str = "?",
) -> RunResult:
    """Run the targets; ``on_event(event)`` is called for each event as it arrives;
    ``extra``: more pytest arguments (``-x``).

    A case's body and teardown get ``time_limit`` seconds; its fixture setup (loading a
    model, say) gets ``setup_limit`` (default: the total limit), since that is not the
    learner's code running; ``case_limits`` (case -> seconds) overrides ``time_limit`` per
    case (judging.py ties it to the case's reference time) when the run's device is
    ``limits_device``, the one those times were measured on. Only sealed events count (plugin.py); a line that does not
    verify, a tamper event, or a pass whose test function never returned fills
    ``tampered``; the run stops at the first of them.
    """
    setup_limit = total_limit if setup_limit is None else setup_limit
    events_path = Path(env["JUDGE_EVENTS"])
    events_path.touch()
    log = box / "pytest.log"
    res = RunResult()
    by_id: Dict[str, Case] = {}
    key = os.urandom(32)
    key_r, key_w = os.pipe()  # the key reaches the plugin before any learner code runs
    os.write(key_w, key)
    os.close(key_w)
    hang = box / "hang.txt"
    env = dict(env, JUDGE_SEAL_FD=str(key_r), JUDGE_HANG_FILE=str(hang))
    if uses_hypothesis(box, targets):
        env["JUDGE_HYPOTHESIS"] = "1"
    integrity.become_subreaper()
    before = integrity.children()
    try:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                pytest_command(box, targets, extra),
                cwd=box,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=limit_child,
                pass_fds=(key_r,),
            )
    finally:
        os.close(key_r)
    t0 = time.monotonic()
    running: Optional[Case] = None
    case_t0 = phase_t0 = 0.0
    limit = time_limit
    collected = False
    buf = ""
    seq = 0

    def opened(line: str) -> Optional[dict]:
        nonlocal seq
        try:
            outer = json.loads(line)
            body, mac = outer["s"], outer["m"]
        except (ValueError, TypeError, KeyError):
            outer = None
        if outer is None or not hmac.compare_digest(
            hmac.new(key, body.encode(), hashlib.sha256).hexdigest(), str(mac)
        ):
            res.tampered.append(
                f"the event stream has a line the judge did not write: {line[:120]!r}"
            )
            return None
        ev = json.loads(body)
        if ev.get("seq") != seq + 1:
            res.tampered.append("the event stream was replayed or cut (out of sequence)")
            return None
        seq += 1
        return ev

    try:
        with open(events_path, encoding="utf-8", errors="replace") as stream:
            while True:
                exited = proc.poll() is not None
                buf += stream.read()
                *lines, buf = buf.split("\n")
                for line in lines:
                    if not line.strip():
                        continue
                    ev = opened(line)
                    if ev is None:
                        break
                    kind = ev.get("ev")
                    if kind == "session":
                        res.device, res.device_name = ev["device"], ev.get("device_name", "")
                        res.versions = ev.get("versions", {})
                    elif kind == "tamper":
                        res.tampered += ev.get("what", [])
                    elif kind == "record_missing":
                        res.unrecorded += [str(x) for x in ev.get("symbols", [])]
                    elif kind == "collect_error":
                        res.collect_errors.append(ev)
                    elif kind == "collected":
                        collected = True
                        res.cases = [Case(n) for n in ev["cases"]]
                        by_id = {c.nodeid: c for c in res.cases}
                        res.module_file = ev.get("module_file") or res.module_file
                    elif kind == "start":
                        running = by_id.setdefault(ev["case"], Case(ev["case"]))
                        case_t0, limit = time.monotonic(), setup_limit
                    elif kind == "phase":  # the body (and its teardown) gets the case limit
                        phase_t0 = time.monotonic()
                        same = res.device.split(":")[0] == limits_device
                        limit = (
                            (case_limits or {}).get(ev["case"], time_limit) if same else time_limit
                        )
                        res.case_limit = limit
                    elif kind == "result":
                        case = by_id.setdefault(ev["case"], Case(ev["case"]))
                        if case.outcome != "not run":
                            res.tampered.append(f"{case.nodeid} was reported twice")
                        case.outcome, case.failure = ev["outcome"], ev.get("failure")
                        # the judge's clock, not the child's (which the learner can patch)
                        case.duration = time.monotonic() - case_t0
                        res.wall[case.nodeid] = case.duration
                        if case.outcome == "passed" and not ev.get("body"):
                            res.tampered.append(
                                f"{case.nodeid} was reported passed, but its test function "
                                "never returned (pytest's way of running tests was changed)"
                            )
                        ev = dict(ev, duration=case.duration)
                        running = None
                    elif kind == "done":
                        res.finished = True
                        res.module_file = ev.get("module_file") or res.module_file
                    if on_event is not None:
                        on_event(ev)
                if res.tampered:
                    _kill_group(proc)
                    break
                if exited:
                    break
                now = time.monotonic()
                if running is not None and now - max(case_t0, phase_t0) > limit:
                    res.killed_for = "case" if phase_t0 >= case_t0 else "setup"
                elif now - t0 > total_limit:
                    res.killed_for = "total"
                elif not collected and now - t0 > COLLECT_LIMIT_S:  # a loop at import time
                    res.killed_for = "collect"
                if res.killed_for:
                    # where it hung: the child's faulthandler prints every thread's stack
                    _signal_group(proc, signal.SIGUSR1)
                    time.sleep(0.5)
                    _kill_group(proc)
                    if running is not None:
                        running.outcome, running.duration = "timeout", now - case_t0
                        if on_event is not None:
                            on_event(
                                {
                                    "ev": "result",
                                    "case": running.nodeid,
                                    "outcome": "timeout",
                                    "duration": running.duration,
                                }
                            )
                    break
                time.sleep(POLL_S)
    finally:
        if proc.poll() is None:
            _kill_group(proc)
        res.survivors = integrity.reap_descendants(proc.pid, before)
    res.returncode = proc.returncode
    if running is not None and running.outcome == "not run":
        running.outcome, running.duration = "crashed", time.monotonic() - case_t0
        if on_event is not None:
            on_event(
                {
                    "ev": "result",
                    "case": running.nodeid,
                    "outcome": "crashed",
                    "duration": running.duration,
                }
            )
    res.log_tail = _tail(log)
    if res.killed_for:
        res.hang_stack = where_it_hung(hang, box)
    return res


def where_it_hung(path: Path, box: Path) -> str:
    """The main thread's frames from the faulthandler dump that are the sandbox's code
    (the learner's module, the engine, the tests), innermost first."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    threads = text.split("\n\n")
    main = next((t for t in threads if "Current thread" in t), threads[0] if threads else "")
    frames = []
    for line in main.splitlines():
        line = line.strip()
        if line.startswith("File ") and str(box) in line and "_judge_plugin" not in line:
            frames.append(line.replace(f"{box}/", ""))
    return "\n".join(frames[:8])
