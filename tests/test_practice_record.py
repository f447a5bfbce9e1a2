"""The judge's evidence: what recorder.py writes in a judged process, and how compare.py and
the verdict read it (docs/judge.md, "How a verdict is decided"). In-process and fast; the
judged runs themselves are in test_practice_attacks.py and `judge.py check`."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from practice.judgelib import compare
from practice.judgelib.problems import find
from practice.judgelib.runner import Case, RunResult
from practice.judgelib.verdict import ACCEPTED, WRONG, Verdict, against_reference

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def recorder():
    """A fresh copy of recorder.py, as a judged process imports it."""
    spec = importlib.util.spec_from_file_location(
        "_judge_recorder_under_test", REPO / "practice" / "judgelib" / "recorder.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def learner_module() -> types.ModuleType:
    """A stand-in for an exercise's module: a function, a method using super() (a free
    variable), a property, a generator and a coroutine."""
    mod = types.ModuleType("learner_under_test")
    exec(
        """
class Base:
    def size(self):
        return 1

class Table(Base):
    def __init__(self):
        self.rows = [3, 2, 1]
        self._mine = "private"

    def size(self):
        return super().size() + len(self.rows)

    @property
    def free(self):
        return len(self.rows)

def double(x):
    return 2 * x

def countdown(n):
    while n:
        yield n
        n -= 1
    return "done"

async def later(x):
    return x + 1
""",
        vars(mod),
    )
    return mod


def test_every_caller_reaches_the_recorder_even_one_that_imported_the_name_first(recorder):
    mod = learner_module()
    imported_early = mod.double  # `from module import double`, before the swap
    symbols = ["double", "Table.size", "Table.free", "countdown", "later"]
    assert recorder.install(mod, symbols + ["Table.missing"]) == ["Table.missing"]
    recorder.begin_case()
    assert imported_early(21) == 42
    t = mod.Table()
    assert t.size() == 4 and t.free == 3
    assert list(mod.countdown(3)) == [3, 2, 1]
    assert asyncio.run(mod.later(1)) == 2
    calls = recorder._CASE
    assert calls["double"] == {"n": 1, "calls": [{"r": 42}]}
    size = calls["Table.size"]["calls"][0]
    assert size["r"] == 4
    assert size["self"]["a"] == {
        "rows": {"ints": size["self"]["a"]["rows"]["ints"], "n": 3, "head": [3, 2, 1]}
    }
    assert "_mine" not in size["self"]["a"], "private fields are the learner's own design"
    assert calls["countdown"]["calls"][0]["r"]["d"]["yielded"]["head"] == [3, 2, 1]
    assert calls["later"]["calls"][0]["r"] == 2


def test_a_raising_call_is_recorded_and_still_raises(recorder):
    mod = types.ModuleType("raiser")
    exec("def f(x):\n    raise KeyError(x)\n", vars(mod))
    recorder.install(mod, ["f"])
    recorder.begin_case()
    with pytest.raises(KeyError):
        mod.f(1)
    assert recorder._CASE["f"]["calls"] == [{"raised": "KeyError"}]


def test_a_float_tensor_keeps_sums_and_a_sample_and_an_integer_tensor_its_hash(recorder):
    big = torch.randn(28_311_552)  # a float32 index of its last element rounds past the end
    s = recorder.summarise(big)
    assert s["s"] == [28_311_552] and len(s["x"]) == recorder.SAMPLE
    assert s["x"][-1] == pytest.approx(float(big[-1]))
    a = recorder.summarise(torch.arange(10))
    b = recorder.summarise(torch.arange(10).flip(0))
    assert a["h"] != b["h"] and a["t"] == "int64"


def test_float_noise_is_within_the_tolerance_and_an_integer_is_not(recorder):
    x = torch.randn(1000)
    noisy = x + 1e-6 * torch.randn(1000)
    assert compare.diff(recorder.summarise(noisy), recorder.summarise(x)) is None
    off = x.clone()
    off[0] += 0.5
    assert "value" in compare.diff(recorder.summarise(off), recorder.summarise(x))
    assert compare.diff(3, 4) == "the value: 3 where the engine's is 4"
    assert compare.diff(True, 1) is not None, "a flag is not an integer"


def record(tmp_path: Path, name: str, lines: list) -> compare.Record:
    path = tmp_path / name
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return compare.load(path)


def test_cases_missing_repeated_or_different_never_agree(tmp_path):
    calls = {"f": {"n": 2, "calls": [{"r": 1}, {"r": 2}]}}
    ref = record(tmp_path, "ref", [{"case": "a", "calls": calls}, {"case": "b", "calls": calls}])
    got = record(
        tmp_path,
        "got",
        [
            {"case": "a", "calls": {"f": {"n": 2, "calls": [{"r": 1}, {"r": 3}]}}},
            {"case": "c", "calls": calls},
        ],
    )
    agree, differ = compare.compare(got, ref, ["a", "b"])
    assert agree == []
    assert differ["a"] == "f, call 2 of 2: returned: 3 where the engine's is 2"
    assert differ["b"] == "no record of it was written"
    twice = record(tmp_path, "twice", [{"case": "a", "calls": calls}] * 2)
    assert compare.compare(twice, ref, ["a"])[1]["a"] == "its record was written more than once"
    fewer = record(
        tmp_path, "fewer", [{"case": "a", "calls": {"f": {"n": 1, "calls": [{"r": 1}]}}}]
    )
    assert "f: 1 calls where the engine's made 2" in compare.compare(fewer, ref, ["a"])[1]["a"]


def result(*outcomes) -> RunResult:
    return RunResult(cases=[Case(f"t{i}", o) for i, o in enumerate(outcomes)], finished=True)


def test_accepted_needs_every_case_of_the_engine_passed_and_agreeing():
    problem = find(REPO / "practice" / "exercises", 111)
    ok = against_reference(
        Verdict(ACCEPTED, 2, 2), problem, result("passed", "passed"), ["t0", "t1"], {}
    )
    assert ok.accepted and (ok.passed, ok.total) == (2, 2)
    differ = {"t1": "f, call 1 of 1: returned: 0 where the engine's is 3"}
    v = against_reference(
        Verdict(ACCEPTED, 2, 2), problem, result("passed", "passed"), ["t0", "t1"], differ
    )
    assert v.name == WRONG and v.case == "t1" and "where the engine's is 3" in v.detail
    skipped = against_reference(
        Verdict(ACCEPTED, 1, 1), problem, result("passed", "skipped"), ["t0", "t1"], {}
    )
    assert skipped.name == WRONG and "was skipped where the engine's ran" in skipped.detail
    none = against_reference(Verdict(ACCEPTED, 0, 0), problem, result(), [], {})
    assert not none.accepted, "0 / 0 is never Accepted"


def test_the_recorder_is_a_file_the_sandbox_gets():
    from practice.judgelib import sandbox

    assert (REPO / "practice" / "judgelib" / "recorder.py").is_file()
    assert sandbox.RECORDER_NAME not in sys.modules
