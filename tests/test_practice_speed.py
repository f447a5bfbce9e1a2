"""The judge's speed part (practice/judgelib/speed.py and bench.py), on the CPU.

What needs no GPU is all here: the ``[speed]`` table, the grading rules (ratio, threshold,
the wall-clock cross-checks, the wording of the verdict), the snapshot that catches a
patched timing function, the speed run's child process (sealed result, tampering, an early
exit), the timing loop with a CPU clock in place of CUDA events, and the CPU verdict of a
whole judge run (``speed not graded: needs a CUDA GPU``). The CUDA timing itself runs in
``judge.py check 451`` on a GPU.
"""

from __future__ import annotations

import json
import textwrap
import time
import types
from pathlib import Path

import pytest
import torch

from practice.judgelib import bench, speed
from practice.judgelib.problems import Speed, load_problem, parse_front_matter
from practice.judgelib.problems import _speed as speed_table
from practice.judgelib.verdict import (
    ACCEPTED,
    REJECTED,
    RUNTIME,
    TLE,
    TOO_SLOW,
    WRONG,
    Verdict,
    verdict_line,
)
from tests.helpers import ROOT
from tests.test_judge import PROBLEM, judge, judge_source, toy  # noqa: F401 - toy: fixture

SPEED = Speed(bench="bench_x.py", threshold=0.8, warmup=10, repeat=50)


def raw(*workloads) -> dict:
    """bench.py's result for workloads given as (name, ref ms, mine ms[, ref wall, mine wall])."""
    out = []
    for name, ref, mine, *wall in workloads:
        ref_wall, mine_wall = wall or (ref + 0.02, mine + 0.02)
        out.append(
            {
                "name": name,
                "ref_ms": [ref] * 50,
                "mine_ms": [mine] * 50,
                "ref_wall_ms": [ref_wall] * 50,
                "mine_wall_ms": [mine_wall] * 50,
                "same_output": True,
            }
        )
    return {"workloads": out, "device_name": "a GPU"}


# -- the [speed] table ------------------------------------------------------------------


def test_exercise_451_declares_its_speed_part():
    p = load_problem(ROOT / "practice" / "exercises" / "451_triton_kv_store")
    assert p.speed is not None and p.speed.threshold == 0.8
    assert (p.dir / p.speed.bench).is_file()
    assert p.slow_answers, "a right but slow answer shows the speed part can fail"


@pytest.mark.parametrize(
    "table, error",
    [
        ('[speed]\nbench = "b.py"\nthreshold = 0.8\nrepeats = 9', "unknown key speed.repeats"),
        ('[speed]\nbench = "b.py"\nthreshold = "fast"', "speed.threshold = 'fast' is not a number"),
        ('[speed]\nbench = "b.py"', "needs bench and threshold"),
        ('[speed]\nbench = "b.py"\nthreshold = 0', "threshold > 0"),
        ("speed = 3", "speed = 3 is not a table"),
    ],
)
def test_a_wrong_speed_table_is_an_error_naming_the_key(table, error):
    text = PROBLEM.replace("total_time_limit = 30\n", f"total_time_limit = 30\n{table}\n")
    with pytest.raises(ValueError, match=error):
        meta, _ = parse_front_matter(text, "problem.md")
        speed_table(meta.get("speed"), "problem.md")


# -- grading ----------------------------------------------------------------------------


def test_median_of_odd_and_even_counts():
    assert speed.median([3.0, 1.0, 2.0]) == 2.0
    assert speed.median([4.0, 1.0, 3.0, 2.0]) == 2.5


def test_as_fast_as_the_reference_is_accepted_with_the_method_stated():
    sr = speed.grade(raw(("decode", 0.010, 0.0098), ("prefill", 0.050, 0.049)), SPEED)
    assert sr.verdict is None and sr.graded
    assert sr.summary() == "1.02x the reference (median of 50, CUDA events)"


def test_under_the_threshold_is_too_slow_and_says_what_it_needs():
    sr = speed.grade(raw(("decode", 0.010, 0.010), ("prefill", 0.050, 0.160)), SPEED)
    assert sr.verdict == TOO_SLOW
    assert sr.summary() == "0.31x the reference (needs 0.80x)"
    assert "prefill: yours 160.0 µs, the reference 50.0 µs" in sr.detail


def test_the_threshold_itself_passes_and_the_worst_workload_decides():
    at = speed.grade(raw(("a", 0.008, 0.010)), SPEED)  # exactly 0.80x
    assert at.verdict is None and at.ratio == pytest.approx(0.8)
    under = speed.grade(raw(("a", 0.020, 0.010), ("b", 0.0079, 0.010)), SPEED)
    assert under.verdict == TOO_SLOW and under.ratio == pytest.approx(0.79)


def test_an_output_that_differs_on_the_benchmark_is_a_wrong_answer():
    r = raw(("prefill", 0.05, 0.05))
    r["workloads"][0]["same_output"] = False
    sr = speed.grade(r, SPEED)
    assert sr.verdict == WRONG and "'prefill'" in sr.detail


def test_events_longer_than_the_wall_clock_are_rejected():
    sr = speed.grade(raw(("decode", 0.50, 0.01, 0.05, 0.05)), SPEED)  # the reference's faked up
    assert sr.verdict == REJECTED
    assert "the reference's calls" in sr.detail and "wall clock saw take 0.0500 ms" in sr.detail


def test_a_machine_slower_while_the_events_ran_is_not_a_tamper():
    # measured on a 2-core CPU: both sides' events about twice their wall clock, the machine
    # slower during the event rounds than during the wall-clock rounds
    sr = speed.grade(raw(("store", 0.0354, 0.640, 0.0158, 0.356)), SPEED)
    assert sr.verdict == TOO_SLOW, sr.detail
    # one side's events past what the other side's drift allows: still Rejected
    sr = speed.grade(raw(("store", 0.050, 0.640, 0.0158, 0.640)), SPEED)
    assert sr.verdict == REJECTED and "the reference's calls" in sr.detail


def test_a_pass_by_the_events_that_the_wall_clock_contradicts_is_rejected():
    # yours: 5 µs by the events, 400 µs by the wall clock (work on a stream the events miss)
    sr = speed.grade(raw(("prefill", 0.05, 0.005, 0.07, 0.40)), SPEED)
    assert sr.verdict == REJECTED and "wall clock 0.18x" in sr.detail
    # the same wall clock for an honest 0.5x: Too slow, not Rejected
    assert speed.grade(raw(("prefill", 0.05, 0.10, 0.07, 0.40)), SPEED).verdict == TOO_SLOW


@pytest.mark.parametrize(
    "result, verdict, text",
    [
        ({"tamper": ["torch.cuda.Event.elapsed_time was replaced"]}, REJECTED, "elapsed_time"),
        ({"killed": True}, TLE, "past its limit of 300 s"),
        ({"error": "your module raised"}, RUNTIME, "your module raised"),
        ({"workloads": []}, RUNTIME, "timed no workload"),
    ],
)
def test_how_the_speed_run_ended_is_the_verdict(result, verdict, text):
    sr = speed.grade(result, SPEED)
    assert sr.verdict == verdict and text in sr.detail


def test_the_verdict_line_carries_the_speed_part():
    v = Verdict(ACCEPTED, 7, 7, record={})
    speed.apply(v, speed.not_graded(SPEED, "needs a CUDA GPU"))
    assert verdict_line(v, "cpu (x86_64)") == (
        "Verdict: Accepted · 7 / 7 cases · speed not graded: needs a CUDA GPU · device cpu (x86_64)"
    )
    assert v.record["speed"]["graded"] is False
    slow = Verdict(ACCEPTED, 7, 7, record={})
    speed.apply(slow, speed.grade(raw(("prefill", 0.031, 0.100)), SPEED))
    assert verdict_line(slow, "cuda (H200)") == (
        "Verdict: Too slow · 7 / 7 cases · 0.31x the reference (needs 0.80x) · device cuda (H200)"
    )
    rec = slow.record["speed"]
    assert rec["ratio"] == pytest.approx(0.31) and rec["workloads"][0]["mine_ms"] == 0.1
    assert len(rec["samples"]["prefill"]["mine_ms"]) == 50  # the raw times, for the record


# -- the snapshot of the timing machinery -----------------------------------------------


@pytest.mark.parametrize(
    "owner, name, label",
    [
        (torch.cuda.Event, "elapsed_time", "torch.cuda.Event.elapsed_time"),
        (torch.cuda.Event, "record", "torch.cuda.Event.record"),
        (torch.cuda, "synchronize", "torch.cuda.synchronize"),
        (time, "perf_counter", "time.perf_counter"),
        (torch.Tensor, "zero_", "torch.Tensor.zero_"),
    ],
)
def test_a_patched_timing_function_is_named(monkeypatch, owner, name, label):
    watch = bench.watch_timing(torch)
    assert watch.changed() == []
    monkeypatch.setattr(owner, name, lambda *a, **k: 0.0)
    assert f"{label} was replaced" in watch.changed()


def test_a_replaced_function_body_and_a_patched_reference_are_named(monkeypatch):
    ref = types.ModuleType("ref")

    def store_cache():
        return None

    ref.store_cache = store_cache
    watch = bench.watch_timing(torch, [("the reference", ref)])
    monkeypatch.setattr(store_cache, "__code__", (lambda: 1).__code__)
    assert "the reference.store_cache.__code__ was replaced" in watch.changed()
    ref.store_cache = print
    assert "the reference.store_cache was replaced" in watch.changed()


# -- the timing loop, with a CPU clock for the CUDA events ------------------------------

CPU_BENCH = """
import torch

def workloads():
    return ["store 64 tokens"]

def make(name, device):
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(64, 4, 8, generator=g), torch.randn(64, 4, 8, generator=g)
    loc = torch.randperm(256, generator=g)[:64]
    return {"k_cache": torch.zeros(256, 4, 8), "v_cache": torch.zeros(256, 4, 8), "loc": loc, "k": k, "v": v}

def call(module, case):
    module.store_cache(case["k_cache"], case["v_cache"], case["loc"], case["k"], case["v"])

def output(case):
    return case["k_cache"], case["v_cache"]
"""


class Stopwatch:
    """A CPU stand-in for ``torch.cuda.Event(enable_timing=True)``."""

    def __init__(self, enable_timing: bool = True) -> None:
        self.t = 0.0


def cpu_tools() -> dict:
    def record(ev, stream):
        ev.t = time.perf_counter()

    return {
        "Event": Stopwatch,
        "record": record,
        "elapsed": lambda a, b: (b.t - a.t) * 1e3,
        "sync": lambda: None,
        "now": time.perf_counter,
        "flush": lambda: None,
        "stream": None,
        "equal": torch.equal,
        "zero": torch.Tensor.zero_,
    }


def learner(store) -> types.ModuleType:
    mod = types.ModuleType("learner")
    mod.store_cache = store
    return mod


def per_token_loop(k_cache, v_cache, loc, k, v):
    for i, slot in enumerate(loc.tolist()):
        k_cache[slot].copy_(k[i])
        v_cache[slot].copy_(v[i])


def test_the_loop_interleaves_and_a_slow_right_answer_is_too_slow(tmp_path):
    (tmp_path / "bench_cpu.py").write_text(CPU_BENCH)
    workloads = bench.load_file(str(tmp_path / "bench_cpu.py"), "_test_bench_cpu")
    from minisgl.kernel import torch_ops

    order = []

    def traced(name, fn):
        def store(*args):
            order.append(name)
            fn(*args)

        return learner(store)

    cfg = {"warmup": 2, "repeat": 6}
    result = bench.time_workload(
        workloads,
        traced("ref", torch_ops.store_cache),
        traced("mine", per_token_loop),
        "store 64 tokens",
        "cpu",
        cfg,
        cpu_tools(),
    )
    timed = order[4:16]  # after the warm-up: the event rounds; the side that goes first alternates
    assert timed == ["ref", "mine", "mine", "ref"] * 3
    assert result["same_output"] and len(result["mine_ms"]) == 6
    # graded on its events alone: the check of events against the wall clock has its own tests
    # above, and on a shared CPU another job can slow one of the two timing loops and not the
    # other, which that check would read as faked events
    events = dict(result, ref_wall_ms=result["ref_ms"], mine_wall_ms=result["mine_ms"])
    sr = speed.grade({"workloads": [events]}, Speed("bench_cpu.py", 0.8, 2, 6))
    assert sr.verdict == TOO_SLOW, sr.table()  # 64 Python-level copies against one index_put_


def test_a_function_that_stops_working_once_timed_gives_a_different_output(tmp_path):
    (tmp_path / "bench_cpu.py").write_text(CPU_BENCH)
    workloads = bench.load_file(str(tmp_path / "bench_cpu.py"), "_test_bench_cpu2")
    from minisgl.kernel import torch_ops

    calls = [0]

    def lazy(*args):
        calls[0] += 1
        if calls[0] <= 3:  # right for the warm-up, then does nothing
            torch_ops.store_cache(*args)

    result = bench.time_workload(
        workloads,
        learner(torch_ops.store_cache),
        learner(lazy),
        "store 64 tokens",
        "cpu",
        {"warmup": 2, "repeat": 4},
        cpu_tools(),
    )
    assert result["same_output"] is False
    assert speed.grade({"workloads": [result]}, SPEED).verdict == WRONG


# -- the speed run's child process ------------------------------------------------------

REFERENCE = "def store(x):\n    return x\n"


def speed_box(tmp_path: Path, learner_source: str):
    """A repository with an engine module and an exercise graded on speed, and a sandbox
    holding the learner's version of that module."""
    root, box = tmp_path / "repo", tmp_path / "box"
    for top, source in ((root, REFERENCE), (box, learner_source)):
        (top / "minisgl").mkdir(parents=True)
        (top / "minisgl" / "__init__.py").write_text("")
        (top / "minisgl" / "fast.py").write_text(source)
    manifest = root / "chapters" / "ch19_fast" / "chapter.toml"  # the chapter that brings it in
    manifest.parent.mkdir(parents=True)
    manifest.write_text(
        'title = "Fast"\nstage = 4\nmain = "examples/ch19_fast.py"\n'
        'new = ["minisgl/__init__.py", "minisgl/fast.py"]\n'
    )
    ex = root / "practice" / "exercises" / "902_fast"
    ex.mkdir(parents=True)
    (ex / "problem.md").write_text(
        '+++\nid = 902\ntitle = "Fast"\nchapter = 19\nmodule = "minisgl/fast.py"\n'
        'symbols = ["store"]\n[speed]\nbench = "bench_fast.py"\nthreshold = 0.8\n'
        "time_limit = 60\n+++\nBe fast.\n"
    )
    (ex / "bench_fast.py").write_text(
        "import torch\n\ndef workloads():\n    return ['one']\n\n"
        "def make(name, device):\n    return {'x': torch.zeros(4, device=device)}\n\n"
        "def call(module, case):\n    module.store(case['x'])\n\n"
        "def output(case):\n    return (case['x'],)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    return root, box, load_problem(ex), env


def test_the_speed_run_rejects_an_import_that_patches_the_events(tmp_path):
    root, box, problem, env = speed_box(
        tmp_path,
        "import torch\ntorch.cuda.Event.elapsed_time = lambda self, end: 1e-6\n" + REFERENCE,
    )
    result = speed.run_bench(box, root, problem, env)
    assert result == {
        "tamper": ["torch.cuda.Event.elapsed_time was replaced (when your module was imported)"]
    }
    assert speed.grade(result, problem.speed).verdict == REJECTED


def test_the_speed_run_of_an_honest_module_needs_cuda(tmp_path):
    root, box, problem, env = speed_box(tmp_path, REFERENCE)
    result = speed.run_bench(box, root, problem, env)
    if torch.cuda.is_available():
        assert [w["name"] for w in result["workloads"]] == ["one"], result
    else:
        assert result == {"error": "no CUDA device in the speed run"}


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import os\nos._exit(0)\n", "ended without its result (exit code 0)"),
        (
            "import json, sys, os\n"
            "cfg = json.loads(sys.argv[1])\n"
            "open(cfg['out'], 'a').write(json.dumps({'s': '{\"workloads\": []}', 'm': '0' * 64}) + '\\n')\n"
            "os._exit(0)\n",
            "a line the judge did not write",
        ),
        ("raise SystemExit(3)\n", "importing your module failed"),
    ],
)
def test_an_early_exit_or_a_forged_result_is_never_a_result(tmp_path, source, expected):
    root, box, problem, env = speed_box(tmp_path, source + REFERENCE)
    result = speed.run_bench(box, root, problem, env)
    assert expected in json.dumps(result, ensure_ascii=False), result
    assert speed.grade(result, problem.speed).verdict in (REJECTED, RUNTIME)


# -- a whole judge run on the CPU -------------------------------------------------------

TOY_BENCH = textwrap.dedent(
    """
    def workloads():
        return ["add"]

    def make(name, device):
        return {}

    def call(module, case):
        module.add(1, 2)

    def output(case):
        return ()
    """
)


def with_speed(root: Path, slow: bool = True) -> Path:
    ex = root / "practice" / "exercises" / "901_toy_add"
    text = (ex / "problem.md").read_text()
    (ex / "problem.md").write_text(
        text.replace(
            "total_time_limit = 30\n",
            'total_time_limit = 30\n[speed]\nbench = "bench_toy.py"\nthreshold = 0.8\n',
        )
    )
    (ex / "bench_toy.py").write_text(TOY_BENCH)
    if slow:
        (ex / "slow").mkdir()
        (ex / "slow" / "sleepy.toml").write_text(
            'about = "sleeps"\n[[replace]]\nold = "return a + b"\n'
            "new = \"__import__('time').sleep(0.001)\\n    return a + b\"\n"
        )
    return ex


def test_on_the_cpu_the_verdict_says_the_speed_part_was_not_graded(toy, tmp_path):  # noqa: F811
    with_speed(toy)
    from tests.test_judge import TOY

    report = tmp_path / "record.json"
    out = judge_source(toy, TOY, "--report", str(report))
    assert out.returncode == 0, out.stdout
    assert (
        "Verdict: Accepted · 4 / 4 cases · speed not graded: needs a CUDA GPU · device cpu"
        in out.stdout
    )
    assert json.loads(report.read_text())["speed"]["graded"] is False
    failing = judge_source(toy, TOY.replace("return a + b", "return a - b"))
    assert "speed" not in failing.stdout.split("Verdict:")[1]  # correctness first


def test_check_of_a_speed_exercise_on_the_cpu(toy):  # noqa: F811
    with_speed(toy)
    out = judge(toy, "check", "901", "--device", "cpu", timeout=120)
    assert "slow/sleepy.toml" in out.stdout and "Accepted 4/4 · speed not graded" in out.stdout
    assert "its speed is graded only on a CUDA GPU" in out.stdout
    assert "✓ sound" in out.stdout, out.stdout


def test_check_wants_a_slow_answer_for_a_speed_exercise(toy):  # noqa: F811
    with_speed(toy, slow=False)
    out = judge(toy, "check", "901", "--device", "cpu", timeout=120)
    assert "no slow/*.toml shows that a slow answer fails" in out.stdout
    assert out.returncode == 1


def test_a_slow_answer_names_no_expected_failure(tmp_path):
    from practice.judgelib import broken

    path = tmp_path / "slow.toml"
    path.write_text('about = "a loop"\nexpect = "test_x"\n[[replace]]\nold = "a"\nnew = "b"\n')
    with pytest.raises(broken.WrongAnswerError, match="slow/slow.toml: unknown keys expect"):
        broken.load_slow(path)
    path.write_text('about = "a loop"\n[[replace]]\nold = "a"\nnew = "b"\n')
    slow = broken.load_slow(path)
    assert slow.verdict == TOO_SLOW and slow.apply("a", "m.py") == "b"
    with pytest.raises(broken.WrongAnswerError, match="slow/slow.toml: replacement 1"):
        slow.apply("c", "m.py")
