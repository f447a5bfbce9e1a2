"""The judge's hints, hang reports, per-case limits and verdict records, on the toy engine
of tests/test_judge.py (a temp repository judged with ``--root``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from practice.judgelib.judging import LIMIT_FLOOR, REFERENCE_TIMES, Options, case_limits
from practice.judgelib.problems import load_problem
from practice.judgelib.verdict import clean
from tests.test_judge import TOY, body, judge, judge_source, toy  # noqa: F401 - toy: fixture


def test_an_exception_gets_no_hint_meant_for_a_wrong_value(toy):  # noqa: F811
    out = judge_source(toy, body("raise AttributeError(\"'Req' object has no attribute 'x'\")"))
    assert "Verdict: Runtime error" in out.stdout
    assert "AttributeError" in out.stdout
    assert "Hint:" not in out.stdout, out.stdout  # "one plus two is three" would mislead


def test_without_a_keyed_hint_the_general_advice_is_marked_as_such(toy):  # noqa: F811
    out = judge_source(toy, body("return abs(a) + b"))  # right for add(1, 2), wrong for -5
    assert "First failure: test_ex901_toy_add.py::test_add_negative" in out.stdout
    assert (
        "Hint: general advice from the statement, not about this failure: Read the docstring."
        in out.stdout
    )


def test_a_hang_says_where_it_was(toy):  # noqa: F811
    out = judge_source(toy, body("while True:\n    a += 0"))
    assert "Verdict: Time limit exceeded" in out.stdout
    where = out.stdout.split("where it was when stopped (innermost first):")[1]
    assert re.search(r'File "learner.py", line [67] in add', where), out.stdout
    assert "test_ex901_toy_add.py" in where and "test_add_small" in where


def test_repr_noise_is_cleaned():
    text = (
        "batch = <[AttributeError(\"'Batch' object has no attribute 'input_ids'\") "
        "raised in repr()] Batch object at 0x7f3a2b10>"
    )
    assert clean(text) == "batch = <Batch object>"


def test_case_limits_follow_the_reference_times(toy):  # noqa: F811
    problem = load_problem(toy / "practice" / "exercises" / "901_toy_add")
    (problem.dir / REFERENCE_TIMES).write_text(
        json.dumps({"cases": {"fast": 0.01, "slow": 3.0, "slower": 50.0}})
    )
    limits = case_limits(problem, 60.0, Options())
    assert limits == {"fast": LIMIT_FLOOR, "slow": 30.0, "slower": 60.0}
    assert case_limits(problem, 60.0, Options(time_limit=5)) == {}  # --time-limit wins


def test_report_then_verify(toy, tmp_path):  # noqa: F811
    learner = toy / "learner.py"
    report = tmp_path / "record.json"
    out = judge_source(toy, TOY, "--report", str(report))
    assert f"record written to {report}" in out.stdout
    rec = json.loads(report.read_text())
    assert rec["exercise"] == 901 and rec["verdict"] == "Accepted" and rec["passed"] == 4
    assert rec["submission"]["sha256"] and rec["tests"] and rec["versions"]["python"]
    assert [c["outcome"] for c in rec["cases"]] == ["passed"] * 4
    assert all(c["seconds"] >= 0 for c in rec["cases"])

    ok = judge(toy, "verify", str(report))
    assert ok.returncode == 0 and "Record verified: Accepted · 4 / 4 cases" in ok.stdout

    forged = dict(rec, verdict="Accepted", passed=4)
    learner.write_text(body("return a - b"))  # a different file than the one recorded
    Path(report).write_text(json.dumps(forged))
    bad = judge(toy, "verify", str(report))
    assert bad.returncode == 1, bad.stdout
    assert "the submitted file is not the one recorded" in bad.stdout
    assert "verdict: recorded 'Accepted', now 'Wrong answer'" in bad.stdout
    assert "Record NOT verified" in bad.stdout


PROPERTY_TEST = """\
from hypothesis import given, settings, strategies as st

from minisgl.toy import add


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.integers(), st.integers())
def test_add_is_plus(a, b):
    assert add(a, b) == a + b, f"add({a}, {b}) = {add(a, b)}"
"""


def test_a_property_test_reports_a_wrong_answer_without_shrinking(toy):  # noqa: F811
    ex = toy / "practice" / "exercises" / "901_toy_add"
    (ex / "test_toy_add.py").write_text(PROPERTY_TEST)
    wrong = body("return a + b if abs(a) < 10**6 else a - b")  # wrong for big numbers only
    out = judge_source(toy, wrong)
    assert "Verdict: Wrong answer" in out.stdout, out.stdout
    assert "First failure: test_ex901_toy_add.py::test_add_is_plus" in out.stdout
    assert "Falsifying example" in out.stdout, out.stdout
    # no shrink phase (judge mode): the example shown is the first that failed, not the
    # minimal a=±1_000_000 that shrinking would spend the case's time looking for
    assert re.search(r"a=-?1_?000_?000,", out.stdout) is None, out.stdout


def test_spot_the_bug_plants_a_known_bug_and_reveals_it(toy):  # noqa: F811
    from tests.test_judge import WRONG_ANSWER

    broken = toy / "practice" / "exercises" / "901_toy_add" / "broken"
    broken.mkdir()
    (broken / "subtracts.toml").write_text(WRONG_ANSWER)
    out = judge(toy, "bug", "901")
    planted = toy / "practice" / "workspace" / "bug_901_toy_add.py"
    assert "wrote practice/workspace/bug_901_toy_add.py" in out.stdout, out.stdout
    assert "subtract" not in out.stdout  # which bug it is stays hidden
    assert planted.read_text() != TOY
    wrong = judge(toy, "901", "--file", str(planted), "--device", "cpu")
    assert "Verdict: Wrong answer" in wrong.stdout
    planted.write_text(TOY)  # the learner's fix
    fixed = judge(toy, "901", "--file", str(planted), "--device", "cpu")
    assert "Verdict: Accepted" in fixed.stdout
    reveal = judge(toy, "bug", "901", "--reveal")
    assert "The bug: " in reveal.stdout and "+    return a + b" in reveal.stdout, reveal.stdout
