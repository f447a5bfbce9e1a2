"""The speed part of an exercise graded on speed (``[speed]`` in problem.md).

Correctness first: only a run whose every case passed is timed, and only on a CUDA GPU (on
a CPU the verdict says the speed part was not graded). The timing is bench.py, in a child
process of its own started with ``python -I``: the learner's module and the engine's own
(the reference), side by side in that one process, interleaved, each call between two CUDA
events after an L2 flush, ``warmup`` untimed calls first, the median of ``repeat``. The
exercise's ratio is the reference's median over the learner's, on the workload where the
learner does worst; it must reach ``threshold``.

Two cross-checks against the harness's wall clock (the same calls again, each between two
device synchronizes): a call's events may not report more time than the wall clock saw
(events cannot measure time that did not pass), and a ratio that passes by the events must
not be far below ``threshold`` by the wall clock (the wall clock adds the same launch and
synchronize cost to both sides, which pulls its ratio toward 1, never far under the
events': work the events did not see, on another stream say, is what does that).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from . import chapter, integrity, runner
from .problems import Problem, Speed
from .verdict import ACCEPTED, REJECTED, RUNTIME, TLE, TOO_SLOW, WRONG, Verdict

METHOD = "CUDA events"
WALL_SLACK = 0.5  # a pass by the events needs threshold * WALL_SLACK by the wall clock
# An event median may exceed its wall median by 25 % + 0.02 ms, times however much the other
# side's events exceed its own: a machine slower while the events ran slows both sides alike.
EVENT_SLACK = (1.25, 0.02)


def median(xs: List[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        raise ValueError("the median of no samples")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


@dataclass
class Workload:
    name: str
    ref_ms: float  # medians
    mine_ms: float
    ref_wall_ms: float
    mine_wall_ms: float
    same_output: bool

    @property
    def ratio(self) -> float:
        """How many times the reference's speed: above 1 is faster than the reference."""
        return self.ref_ms / self.mine_ms if self.mine_ms > 0 else float("inf")

    @property
    def wall_ratio(self) -> float:
        return self.ref_wall_ms / self.mine_wall_ms if self.mine_wall_ms > 0 else float("inf")


@dataclass
class SpeedResult:
    graded: bool
    threshold: float
    repeat: int
    warmup: int
    verdict: Optional[str] = None  # None: the correctness verdict stands (Accepted)
    detail: str = ""
    why_not: str = ""  # why it was not graded
    workloads: List[Workload] = field(default_factory=list)
    samples: Dict[str, dict] = field(default_factory=dict)  # workload -> the raw times, ms
    device_name: str = ""

    @property
    def ratio(self) -> Optional[float]:
        """The exercise's ratio: the workload where the learner does worst decides."""
        return min((w.ratio for w in self.workloads), default=None)

    def summary(self) -> str:
        """The verdict line's speed part."""
        if not self.graded:
            return f"speed not graded: {self.why_not}"
        if self.ratio is None:
            return "speed not measured"
        if self.verdict == TOO_SLOW:
            return f"{self.ratio:.2f}x the reference (needs {self.threshold:.2f}x)"
        return f"{self.ratio:.2f}x the reference (median of {self.repeat}, {METHOD})"

    def table(self) -> List[str]:
        if not self.workloads:
            return []
        width = max(len(w.name) for w in self.workloads)
        lines = [
            f"  speed: {METHOD}, {self.warmup} warm-up calls, median of {self.repeat}, "
            f"interleaved with the reference in one process, L2 flushed before each call"
        ]
        for w in self.workloads:
            lines.append(
                f"    {w.name:<{width}}  yours {w.mine_ms * 1e3:9.1f} µs  reference "
                f"{w.ref_ms * 1e3:9.1f} µs  {w.ratio:5.2f}x  (wall clock {w.wall_ratio:.2f}x)"
            )
        return lines

    def record(self) -> dict:
        out = asdict(self)
        out["ratio"] = self.ratio
        out["method"] = f"{METHOD}, warm-up {self.warmup}, median of {self.repeat}"
        for w, d in zip(self.workloads, out["workloads"], strict=True):
            d["ratio"], d["wall_ratio"] = w.ratio, w.wall_ratio
        return out


def not_graded(speed: Speed, why: str) -> SpeedResult:
    return SpeedResult(False, speed.threshold, speed.repeat, speed.warmup, why_not=why)


def grade(raw: dict, speed: Speed) -> SpeedResult:
    """From bench.py's result (or the judge's note of how the run ended) to a SpeedResult:
    Rejected, Runtime error, Time limit exceeded or Wrong answer when the run says so,
    Too slow under the threshold, else no verdict of its own (the Accepted stands)."""
    sr = SpeedResult(True, speed.threshold, speed.repeat, speed.warmup)
    sr.device_name = raw.get("device_name", "")
    if raw.get("tamper"):
        sr.verdict = REJECTED
        sr.detail = "the submission changed the judge's timing:\n" + "\n".join(
            f"- {t}" for t in raw["tamper"]
        )
        return sr
    if raw.get("killed"):
        sr.verdict = TLE
        sr.detail = f"the speed run went past its limit of {speed.time_limit:g} s (killed)"
        return sr
    if raw.get("error"):
        sr.verdict = RUNTIME
        sr.detail = raw["error"]
        return sr
    for w in raw.get("workloads", []):
        sr.workloads.append(
            Workload(
                w["name"],
                median(w["ref_ms"]),
                median(w["mine_ms"]),
                median(w["ref_wall_ms"]),
                median(w["mine_wall_ms"]),
                bool(w["same_output"]),
            )
        )
        sr.samples[w["name"]] = {k: w[k] for k in w if k.endswith("_ms")}
    if not sr.workloads:
        sr.verdict = RUNTIME
        sr.detail = "the speed run timed no workload"
        return sr
    for w in sr.workloads:
        if not w.same_output:
            sr.verdict = WRONG
            sr.detail = (
                f"on the benchmark's workload {w.name!r} your function's output differs from "
                "the reference's (the tests passed: look at what is different at this size)"
            )
            return sr
    scale, plus = EVENT_SLACK
    for w in sr.workloads:
        sides = (("your", w.mine_ms, w.mine_wall_ms), ("the reference's", w.ref_ms, w.ref_wall_ms))
        for (who, ev, wall), (_, other_ev, other_wall) in zip(sides, sides[::-1]):
            drift = max(1.0, other_ev / other_wall) if other_wall > 0 else 1.0
            if ev > wall * scale * drift + plus:
                sr.verdict = REJECTED
                sr.detail = (
                    f"{w.name}: the CUDA events measured {ev:.4f} ms for {who} calls, which "
                    f"the judge's wall clock saw take {wall:.4f} ms: the events were faked"
                )
                return sr
    for w in sr.workloads:
        if w.ratio >= speed.threshold and w.wall_ratio < speed.threshold * WALL_SLACK:
            sr.verdict = REJECTED
            sr.detail = (
                f"{w.name}: the CUDA events say {w.ratio:.2f}x the reference, the judge's "
                f"wall clock {w.wall_ratio:.2f}x: the events did not see part of your "
                "function's work (another stream, or work left running after it returned)"
            )
            return sr
    if sr.ratio < speed.threshold:
        worst = min(sr.workloads, key=lambda w: w.ratio)
        sr.verdict = TOO_SLOW
        sr.detail = (
            f"{worst.name}: yours {worst.mine_ms * 1e3:.1f} µs, the reference "
            f"{worst.ref_ms * 1e3:.1f} µs, {worst.ratio:.2f}x the reference; the exercise "
            f"needs {speed.threshold:.2f}x on every workload"
        )
    return sr


def apply(v: Verdict, sr: SpeedResult) -> None:
    """Put the speed part into the verdict (its name when the speed run decides it)."""
    v.speed = sr.summary()
    if v.record is not None:
        v.record["speed"] = sr.record()
    if sr.verdict and v.name == ACCEPTED:
        v.name, v.case, v.detail, v.hint = sr.verdict, None, sr.detail, None


def _opened(line: str, key: bytes) -> Optional[dict]:
    try:
        outer = json.loads(line)
        body, mac = outer["s"], str(outer["m"])
    except (ValueError, TypeError, KeyError):
        return None
    good = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
    return json.loads(body) if hmac.compare_digest(good, mac) else None


def run_bench(box: Path, root: Path, problem: Problem, env: Dict[str, str]) -> dict:
    """Run bench.py on the sandbox ``box`` (the learner's module in it) against the chapter's
    own module (chapter.py); return its result, or ``killed``/``error``/``tamper`` as the judge
    saw the run end."""
    speed = problem.speed
    assert speed is not None
    work = Path(tempfile.mkdtemp(prefix=f"minisgl-speed-{problem.id}-"))
    try:
        # a module cache the earlier run could have planted would be read instead of a source
        for cache in list(box.rglob("__pycache__")):
            shutil.rmtree(cache, ignore_errors=True)
        shutil.copyfile(Path(__file__).with_name("bench.py"), work / "_judge_bench.py")
        reference = work / "reference" / Path(problem.module).name
        reference.parent.mkdir()
        reference.write_text(chapter.engine_source(root, problem), encoding="utf-8")
        shutil.copyfile(problem.dir / speed.bench, work / speed.bench)
        # the sandbox, then what the tests had (PYTHONPATH) and what this judge has (a user
        # site, say, which -I leaves out), without another folder holding a minisgl/
        path = [str(box)] + [
            p
            for p in env.get("PYTHONPATH", "").split(os.pathsep) + sys.path
            if p and not (Path(p) / "minisgl").is_dir()
        ]
        cfg = {
            "module": problem.module_name,
            "reference": str(reference),
            "bench": str(work / speed.bench),
            "warmup": speed.warmup,
            "repeat": speed.repeat,
            "out": str(work / "result.jsonl"),
            "path": path,
        }
        key = os.urandom(32)
        key_r, key_w = os.pipe()
        os.write(key_w, key)
        os.close(key_w)
        child_env = {k: v for k, v in env.items() if not k.startswith("JUDGE_")}
        child_env["JUDGE_SEAL_FD"] = str(key_r)
        integrity.become_subreaper()
        before = integrity.children()
        log = work / "bench.log"
        try:
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-B", str(work / "_judge_bench.py"), json.dumps(cfg)],
                    cwd=work,
                    env=child_env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=runner.limit_child,
                    pass_fds=(key_r,),
                )
        finally:
            os.close(key_r)
        killed = False
        try:
            proc.wait(timeout=speed.time_limit)
        except subprocess.TimeoutExpired:
            killed = True
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
            survivors = integrity.reap_descendants(proc.pid, before)
        if killed:
            return {"killed": True}
        try:
            lines = [
                ln
                for ln in (work / "result.jsonl").read_text(encoding="utf-8").splitlines()
                if ln.strip()
            ]
        except OSError:
            lines = []
        results = [_opened(ln, key) for ln in lines]
        if any(r is None for r in results) or len(results) > 1:
            return {"tamper": ["the speed run's result has a line the judge did not write"]}
        if survivors:
            return {
                "error": "processes started by the speed run were still running after it "
                "(killed):\n" + "\n".join(f"- {s}" for s in survivors[:5])
            }
        if not results:
            tail = log.read_text(encoding="utf-8", errors="replace")[-2000:]
            return {
                "error": f"the speed run ended without its result (exit code "
                f"{proc.returncode})\n{tail}"
            }
        return results[0]
    finally:
        shutil.rmtree(work, ignore_errors=True)
