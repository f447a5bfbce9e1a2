"""The practice judge, proven on a toy engine in a temporary repository.

A toy module (``minisgl/toy.py``), a chapter test and exercise 901 are written to a temp
dir; ``practice/judge.py --root TMP`` then judges learner files that are right, wrong,
raising, hanging, exiting, flooding the output or not even Python, and every run must end
in the right verdict, never a judge traceback, with the engine file untouched.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from practice.judgelib import runner
from practice.judgelib.problems import load_all
from practice.judgelib.signatures import drift

REPO = Path(__file__).resolve().parents[1]
JUDGE = REPO / "practice" / "judge.py"

TOY = '''\
"""A toy engine module."""


def add(a: int, b: int) -> int:
    """Return a + b."""
    return a + b


class Counter:
    """Counts up."""

    def __init__(self, start: int = 0) -> None:
        self.value = start

    def bump(self, by: int = 1) -> int:
        """Add ``by`` and return the new value."""
        self.value += by
        return self.value

    # >>> ch01: counters start over
    def reset(self) -> None:
        self.value = 0

    # <<< ch01
'''

PROBLEM = """\
+++
id = 901
title = "Toy: add"
chapter = 0
difficulty = "easy"
module = "minisgl/toy.py"
symbols = ["add"]
tests = ["tests/test_ch00_toy.py"]
gpu = false
time_limit = 2
total_time_limit = 30
+++
Implement `add`.

## Hints
- `test_add_small`: one plus two is three.
- Read the docstring.

## What the tests check
Sums.
"""

OWN_TESTS = """\
from minisgl.toy import add


def test_add_small():
    assert add(1, 2) == 3, f"add(1, 2) should be 3, got {add(1, 2)}"


def test_add_negative():
    assert add(-5, 2) == -3
"""

CHAPTER_TESTS = """\
from minisgl.helper import double
from minisgl.toy import Counter, add


def test_counter_counts():
    c = Counter()
    assert c.bump() == 1 and c.bump(2) == 3


def test_add_large():
    assert add(10**6, 10**6) == double(10**6)
"""


def body(expr: str) -> str:
    """The toy module with the body of ``add`` replaced."""
    return TOY.replace("    return a + b", textwrap.indent(textwrap.dedent(expr), "    "))


def chapter(root: Path, n: int, slug: str, new: list[str]) -> None:
    """Chapter ``n``'s manifest, main and test file (``CHAPTER_TESTS`` in chapter 0)."""
    (root / "chapters" / f"ch{n:02d}_{slug}").mkdir(parents=True)
    (root / "chapters" / f"ch{n:02d}_{slug}" / "chapter.toml").write_text(
        f'title = "{slug}"\nstage = 1\nmain = "examples/ch{n:02d}_{slug}.py"\n'
        f'tests = ["tests/test_ch{n:02d}_{slug}.py"]\nnew = {new!r}\n'.replace("'", '"')
    )
    (root / "examples").mkdir(exist_ok=True)
    (root / "examples" / f"ch{n:02d}_{slug}.py").write_text("print(1)\n")
    tests = CHAPTER_TESTS if n == 0 else RESET_TESTS
    (root / "tests" / f"test_ch{n:02d}_{slug}.py").write_text(tests)


RESET_TESTS = """\
from minisgl.toy import Counter


def test_reset():
    c = Counter(5)
    c.reset()
    assert c.value == 0
"""


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """A book of two chapters: 0 brings in ``minisgl/toy.py``, 1 adds ``Counter.reset``."""
    root = tmp_path / "repo"
    (root / "minisgl").mkdir(parents=True)
    (root / "minisgl" / "__init__.py").write_text("")
    (root / "minisgl" / "toy.py").write_text(TOY)
    (root / "minisgl" / "helper.py").write_text("def double(x):\n    return 2 * x\n")
    (root / "tests").mkdir()
    chapter(root, 0, "toy", ["minisgl/__init__.py", "minisgl/toy.py", "minisgl/helper.py"])
    chapter(root, 1, "more", [])
    ex = root / "practice" / "exercises" / "901_toy_add"
    ex.mkdir(parents=True)
    (ex / "problem.md").write_text(PROBLEM)
    (ex / "test_toy_add.py").write_text(OWN_TESTS)
    return root


# an exercise whose starter passes: its tests never call the one body it blanks out
UNSOUND = {'symbols = ["add"]': 'symbols = ["Counter.bump"]', '"tests/test_ch00_toy.py"': ""}


def rewrite(path: Path, changes: dict) -> None:
    text = path.read_text()
    for old, new in changes.items():
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)


def judge(root: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(JUDGE), "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def judge_source(root: Path, source: str, *args: str) -> subprocess.CompletedProcess:
    learner = root / "learner.py"
    learner.write_text(source)
    before = hashlib.sha256((root / "minisgl" / "toy.py").read_bytes()).hexdigest()
    out = judge(root, "901", "--file", str(learner), "--device", "cpu", *args)
    assert hashlib.sha256((root / "minisgl" / "toy.py").read_bytes()).hexdigest() == before, (
        "engine modified"
    )
    assert "Traceback" not in out.stdout.split("First failure")[0], out.stdout
    assert "judge error" not in out.stdout, out.stdout
    return out


def test_correct_file_is_accepted(toy):
    out = judge_source(toy, TOY)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Verdict: Accepted · 4 / 4 cases · device cpu" in out.stdout
    assert "✓ test_ex901_toy_add.py::test_add_small" in out.stdout  # exercise tests run first
    assert "✓ test_ch00_toy.py::test_counter_counts" in out.stdout  # then the chapter tests
    assert "Judge time:" in out.stdout


def test_wrong_answer_shows_the_values_and_the_keyed_hint(toy):
    out = judge_source(toy, body("return a - b"))
    assert out.returncode == 1
    assert "Verdict: Wrong answer · 1 / 4 cases" in out.stdout  # only the counter passes
    assert "First failure: test_ex901_toy_add.py::test_add_small" in out.stdout
    assert "add(1, 2) should be 3, got -1" in out.stdout
    assert "Hint: one plus two is three." in out.stdout


def test_untouched_starter_is_a_runtime_error_with_the_placeholder_hint(toy):
    assert "wrote practice/workspace/901_toy_add.py" in judge(toy, "start", "901").stdout
    out = judge_source(toy, (toy / "practice" / "workspace" / "901_toy_add.py").read_text())
    assert "Verdict: Runtime error · 1 / 4 cases" in out.stdout
    assert "NotImplementedError: Exercise 901: implement add" in out.stdout
    assert "Hint: this is still the starter's placeholder: implement add" in out.stdout


def test_infinite_loop_is_killed_at_the_case_limit(toy):
    out = judge_source(toy, body("while True:\n    pass"))
    assert out.returncode == 1
    assert "⏱ test_ex901_toy_add.py::test_add_small" in out.stdout
    assert "Verdict: Time limit exceeded · 0 / 4 cases" in out.stdout
    assert "ran past the case limit of 2 s" in out.stdout


def test_time_limit_option_overrides_the_problem(toy):
    out = judge_source(toy, body("import time\ntime.sleep(1.5)\nreturn a + b"), "--time-limit", "1")
    assert "Verdict: Time limit exceeded" in out.stdout and "limit of 1 s" in out.stdout


def test_syntax_error_is_a_compile_error_with_line_and_caret(toy):
    out = judge_source(toy, body("return a +* b"))
    assert out.returncode == 1
    assert "learner.py:6:" in out.stdout and "SyntaxError" in out.stdout
    assert "return a +* b" in out.stdout and "^" in out.stdout
    assert "Verdict: Compile error · 0 / 4 cases" in out.stdout


def test_sys_exit_is_a_runtime_error(toy):
    out = judge_source(toy, body("import sys\nsys.exit(3)"))
    assert "Verdict: Runtime error · 1 / 4 cases" in out.stdout
    assert "SystemExit" in out.stdout


def test_os_exit_kills_the_process_and_is_reported(toy):
    out = judge_source(toy, body("import os\nos._exit(0)"))
    assert "Verdict: Runtime error · 0 / 4 cases" in out.stdout
    assert "exited with code 0 while running test_ex901_toy_add.py::test_add_small" in out.stdout


def test_error_at_import_time_is_a_runtime_error(toy):
    out = judge_source(toy, TOY + "\nundefined_name + 1\n")
    assert "Verdict: Runtime error · 0 / 4 cases" in out.stdout
    assert "NameError" in out.stdout


def test_megabytes_of_print_are_trimmed(toy):
    out = judge_source(toy, body("print('x' * 5_000_000)\nreturn a - b"))
    assert "Verdict: Wrong answer" in out.stdout
    assert len(out.stdout) < 30_000  # the flood never reaches the learner's terminal


def test_no_sandbox_is_left_behind(toy):
    before = set(Path(tempfile.gettempdir()).glob("minisgl-judge-901-*"))
    judge_source(toy, TOY)
    assert set(Path(tempfile.gettempdir()).glob("minisgl-judge-901-*")) <= before


def test_two_judges_side_by_side_do_not_interfere(toy):
    (toy / "good.py").write_text(TOY)
    (toy / "bad.py").write_text(body("return a - b"))
    cmd = [sys.executable, str(JUDGE), "--root", str(toy), "901", "--device", "cpu", "--file"]
    procs = [
        subprocess.Popen(cmd + [str(toy / f)], stdout=subprocess.PIPE, text=True)
        for f in ("good.py", "bad.py")
    ]
    good, bad = (p.communicate(timeout=60)[0] for p in procs)
    assert "Verdict: Accepted" in good and "Verdict: Wrong answer" in bad


def test_start_writes_the_starter_made_from_the_engine_module(toy):
    out = judge(toy, "start", "901")
    assert (
        "wrote practice/workspace/901_toy_add.py, made from minisgl/toy.py as chapter 0 leaves it"
        in out.stdout
    )
    assert "Implement `add`." in out.stdout and "one plus two" not in out.stdout  # no hints
    written = (toy / "practice" / "workspace" / "901_toy_add.py").read_text()
    chapter_0 = TOY.split("\n\n    # >>> ch01")[0] + "\n"
    assert written == chapter_0.replace(
        "    return a + b", '    raise NotImplementedError("Exercise 901: implement add")'
    )


def test_start_names_a_symbol_the_engine_no_longer_has(toy):
    (toy / "minisgl" / "toy.py").write_text(TOY.replace("def add(", "def plus("))
    out = judge(toy, "start", "901")
    assert out.returncode == 3, out.stdout
    assert "cannot write the starter: exercise 901: add is not defined in minisgl/toy.py" in (
        out.stdout
    )
    assert not (toy / "practice" / "workspace" / "901_toy_add.py").exists()


def test_start_list_and_status(toy):
    judge(toy, "start", "901")
    assert "started" in judge(toy, "list").stdout
    (toy / "practice" / "workspace" / "901_toy_add.py").write_text(TOY)
    assert "exists; keeping it" in judge(toy, "start", "901").stdout  # never overwrites
    assert judge(toy, "901", "--device", "cpu").returncode == 0
    assert "accepted" in judge(toy, "list").stdout
    assert (toy / "minisgl" / "toy.py").read_text() == TOY


def test_list_is_in_chapter_order(toy):
    rewrite(
        toy / "practice" / "exercises" / "901_toy_add" / "problem.md",
        {"chapter = 0": "chapter = 8"},
    )
    ex = toy / "practice" / "exercises" / "899_toy_later"
    ex.mkdir()
    (ex / "problem.md").write_text(
        PROBLEM.replace("id = 901", "id = 899").replace("chapter = 0", "chapter = 11")
    )
    ex = toy / "practice" / "exercises" / "905_toy_early"
    ex.mkdir()
    (ex / "problem.md").write_text(
        PROBLEM.replace("id = 901", "id = 905").replace("chapter = 0", "chapter = 2")
    )
    rows = judge(toy, "list").stdout.splitlines()[1:]
    assert [r.split()[0] for r in rows] == ["905", "901", "899"], rows


def test_a_missing_file_is_named_with_the_right_advice(toy):
    out = judge(toy, "901", "--file", str(toy / "nope.py"))
    assert (
        out.returncode == 2 and "nope.py does not exist (the file given with --file)" in out.stdout
    )
    out = judge(toy, "901")
    assert out.returncode == 2 and "run: python practice/judge.py start 901" in out.stdout


def test_solution_asks_first(toy):
    assert "not shown" in judge(toy, "solution", "901").stdout
    out = judge(toy, "solution", "901", "--yes")
    assert "add" in out.stdout and "lines 4-6" in out.stdout, out.stdout
    reference = toy / "practice" / "workspace" / "reference_901_toy_add.py"
    assert "def bump(" in reference.read_text() and "reset" not in reference.read_text()
    accepted = judge(toy, "901", "--file", str(reference), "--device", "cpu")
    assert "Verdict: Accepted" in accepted.stdout, accepted.stdout


def test_check_passes_on_a_sound_exercise(toy):
    out = judge(toy, "check", "--device", "cpu")
    assert out.returncode == 0 and "✓ sound" in out.stdout, out.stdout
    assert (
        "    starter                              Runtime error 0/4 at test_add_small" in out.stdout
    )


def test_check_names_a_symbol_the_engine_no_longer_has(toy):
    (toy / "minisgl" / "toy.py").write_text(TOY.replace("def add(", "def plus("))
    out = judge(toy, "check", "901", "--device", "cpu")
    assert out.returncode == 1
    assert "✗ no starter: exercise 901: add is not defined in minisgl/toy.py" in out.stdout


def test_check_fails_when_the_starter_passes(toy):
    rewrite(toy / "practice" / "exercises" / "901_toy_add" / "problem.md", UNSOUND)
    out = judge(toy, "check", "901", "--device", "cpu")
    assert out.returncode == 1 and "starter is accepted but must fail" in out.stdout


WRONG_ANSWER = """\
about = "subtracts"
expect = "test_add_small"

[[replace]]
old = "return a + b"
new = "return a - b"
"""


def test_check_proves_a_wrong_answer_fails_where_it_says(toy):
    broken = toy / "practice" / "exercises" / "901_toy_add" / "broken"
    broken.mkdir()
    (broken / "subtracts.toml").write_text(WRONG_ANSWER)
    out = judge(toy, "check", "901", "--device", "cpu")
    assert out.returncode == 0, out.stdout
    assert "broken/subtracts.toml                Wrong answer 0/4 at test_add_small" in out.stdout
    (broken / "subtracts.toml").write_text(WRONG_ANSWER.replace("small", "negative"))
    out = judge(toy, "check", "901", "--device", "cpu")
    assert out.returncode == 1
    assert "broken/subtracts.toml should fail first at test_add_negative, failed first at " in (
        out.stdout
    )


def test_check_wants_the_verdict_a_wrong_answer_names(toy):
    broken = toy / "practice" / "exercises" / "901_toy_add" / "broken"
    broken.mkdir()
    (broken / "raises.toml").write_text(
        WRONG_ANSWER.replace('"test_add_small"', '"test_add_small"\nverdict = "Runtime error"')
    )
    out = judge(toy, "check", "901", "--device", "cpu")
    assert out.returncode == 1
    assert "broken/raises.toml should get Runtime error, got Wrong answer" in out.stdout


def test_check_reports_a_wrong_answer_the_engine_outgrew(toy):
    broken = toy / "practice" / "exercises" / "901_toy_add" / "broken"
    broken.mkdir()
    (broken / "subtracts.toml").write_text(WRONG_ANSWER)
    (toy / "minisgl" / "toy.py").write_text(TOY.replace("return a + b", "return b + a"))
    out = judge(toy, "check", "901", "--device", "cpu")
    assert out.returncode == 1
    assert (
        "broken/subtracts.toml: replacement 1 no longer applies: its old text (starting "
        "'return a + b') occurs 0 times in minisgl/toy.py, not once" in out.stdout
    )


GPU_OWN_TESTS = """\
import os

import pytest

from minisgl.toy import add

ON_CUDA = os.environ.get("MINISGL_DEVICE") == "cuda"


def test_add_on_the_cpu():
    assert add(2, 2) == 4


@pytest.mark.skipif(not ON_CUDA, reason="needs CUDA")
def test_add_on_the_gpu():
    assert add(3, 3) == 6
"""


@pytest.fixture
def toy_gpu(toy: Path) -> Path:
    """Exercise 902: ``gpu = true``, one CPU case and one CUDA-only case."""
    ex = toy / "practice" / "exercises" / "902_toy_gpu"
    ex.mkdir()
    (ex / "problem.md").write_text(
        PROBLEM.replace("id = 901", "id = 902")
        .replace("gpu = false", "gpu = true")
        .replace("Toy: add", "Toy: add on a GPU")
    )
    (ex / "test_toy_gpu.py").write_text(GPU_OWN_TESTS)
    return toy


def test_check_without_cuda_only_partly_checks_a_gpu_exercise(toy_gpu):
    out = judge(toy_gpu, "check", "902", "--device", "cpu")
    assert out.returncode == 0, out.stdout
    assert "✓ sound" not in out.stdout, out.stdout  # never claimed
    assert "partly checked, NOT judged" in out.stdout and "check 902` on a CUDA GPU" in out.stdout
    assert "(1 GPU cases skipped)" in out.stdout  # its CPU case ran, engine and starter
    assert "checked 0, failed 0 , partly checked without a GPU (not judged) [902]" in out.stdout
    ex = toy_gpu / "practice" / "exercises" / "902_toy_gpu"
    rewrite(ex / "problem.md", {'symbols = ["add"]': 'symbols = ["add", "nope"]'})
    out = judge(toy_gpu, "check", "902", "--device", "cpu")
    assert out.returncode == 1 and "nope is not defined" in out.stdout  # static checks still bite
    rewrite(ex / "problem.md", {'symbols = ["add", "nope"]': 'symbols = ["Counter.bump"]'})
    out = judge(toy_gpu, "check", "902", "--device", "cpu")
    assert (
        out.returncode == 1 and "starter is accepted but must fail" in out.stdout
    )  # so do the CPU cases


def test_a_gpu_exercise_on_the_cpu_is_refused_or_previewed(toy_gpu):
    (toy_gpu / "mine.py").write_text(TOY)
    out = judge(toy_gpu, "902", "--file", str(toy_gpu / "mine.py"), "--device", "cpu")
    assert (
        out.returncode == 2
        and "needs a CUDA GPU" in out.stdout
        and "--quick --device cpu" in out.stdout
    )
    out = judge(toy_gpu, "902", "--file", str(toy_gpu / "mine.py"), "--device", "cpu", "--quick")
    assert "Verdict: Accepted · 1 / 1 cases (1 skipped)" in out.stdout, out.stdout
    assert "CPU preview only: 1 GPU cases were skipped" in out.stdout


def test_check_with_jobs_prints_the_same_report_and_verdicts_as_one_at_a_time(toy_gpu):
    """`check --jobs 2` (three exercises: sound, GPU-only, unsound): each exercise's report
    whole, in the exercises' order, the same summary and the same exit status."""
    ex = toy_gpu / "practice" / "exercises" / "903_toy_unsound"
    ex.mkdir()
    (ex / "problem.md").write_text(
        PROBLEM.replace("id = 901", "id = 903").replace("Toy: add", "Toy: unsound")
    )
    rewrite(ex / "problem.md", UNSOUND)
    (ex / "test_toy_add.py").write_text(OWN_TESTS)
    one = judge(toy_gpu, "check", "--device", "cpu", timeout=300)
    two = judge(toy_gpu, "check", "--device", "cpu", "--jobs", "2", timeout=300)
    assert one.returncode == two.returncode == 1, one.stdout + two.stdout
    assert "failed 1 [903], partly checked without a GPU (not judged) [902]" in two.stdout, (
        two.stdout
    )
    assert "903 Toy: unsound" in two.stdout and "starter is accepted but must fail" in two.stdout

    def untimed(out: str) -> str:
        return re.sub(r" in \d+\.\d s$", "", out.rstrip())

    assert untimed(two.stdout) == untimed(one.stdout)


def test_doctor_runs(toy):
    out = judge(toy, "doctor", timeout=120)
    assert out.returncode == 0 and "Python" in out.stdout and "901" in out.stdout


def test_real_exercises_make_starters_that_match_the_engine():
    from practice.judgelib import broken, chapter
    from practice.judgelib.starter import placeholder, starter_source

    exercises = load_all(REPO / "practice" / "exercises")
    for p in exercises:
        assert p.own_tests, p.dir
        starter = starter_source(REPO, p)  # every symbol is in the chapter's engine module
        compile(starter, p.module, "exec")
        engine = chapter.engine_source(REPO, p)
        problems, _ = drift(starter, engine)
        assert not problems, f"{p.id}: starter drifted from {p.module}:\n" + "\n".join(problems)
        for symbol in p.symbols:
            assert placeholder(p.id, symbol) in starter
        for path in p.wrong_answers:
            assert broken.load(path).apply(engine, p.module) != engine  # still applies


def test_191_engine_passes_and_starter_and_known_wrong_answers_fail():
    """judge.py check 191 --quick: the engine is Accepted; the starter, and the versions that
    admit past the KV limit, skip a request that does not fit, or forget the decode
    reservation, each fail first on the test that names their mistake."""
    out = subprocess.run(
        [sys.executable, str(JUDGE), "check", "191", "--quick", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for line in (
        "engine ",
        "Accepted",
        "starter ",
        "Runtime error",
        "past_kv_limit.toml",
        "at test_refuses_a_request_past_the_kv_limit",
        "skips_misfit.toml",
        "at test_queue_stops_at_the_first_request_that_does_not_fit",
        "forgets_decode_reservation.toml",
        "at test_queue_keeps_the_decode_reservation",
    ):
        assert line in out.stdout, out.stdout


def test_the_sandbox_keeps_installed_paths_but_not_another_minisgl(tmp_path, monkeypatch):
    """Regression (found on the H200): the child's PYTHONPATH was the sandbox alone, so
    packages installed with `pip install --target` (FlashInfer there) vanished."""
    site, other_repo = tmp_path / "site", tmp_path / "other"
    site.mkdir()
    (other_repo / "minisgl").mkdir(parents=True)
    box = tmp_path / "box"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(other_repo)]))
    env = runner.child_env(box, "cpu", "minisgl.core", box / "events.jsonl")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(box), str(site)]


def test_an_exercise_is_written_and_judged_in_its_chapters_engine(toy):
    judge(toy, "start", "901")
    starter = (toy / "practice" / "workspace" / "901_toy_add.py").read_text()
    assert "def bump(" in starter and "reset" not in starter  # chapter 1 adds reset
    out = judge_source(toy, body("return a + b"))
    assert "Verdict: Accepted · 4 / 4 cases" in out.stdout  # chapter 1's test is not run
    rewrite(
        toy / "practice" / "exercises" / "901_toy_add" / "problem.md",
        {'"tests/test_ch00_toy.py"': '"tests/test_ch00_toy.py", "tests/test_ch01_more.py"'},
    )
    out = judge(toy, "check", "901", "--device", "cpu")
    assert out.returncode == 1
    assert "tests/test_ch01_more.py is not in chapter 0's tree" in out.stdout, out.stdout


def test_list_sends_a_newcomer_to_the_easiest_exercise_first(tmp_path):
    (tmp_path / "practice").mkdir()  # the book's exercises, and no progress yet
    (tmp_path / "practice" / "exercises").symlink_to(REPO / "practice" / "exercises")
    out = subprocess.run(
        [sys.executable, str(JUDGE), "--root", str(tmp_path), "list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    first = out.stdout.splitlines()[0]
    assert first.startswith("New here? Start with 171, DecodeManager"), out.stdout
    assert "(easy, chapter 7): python practice/judge.py start 171" in first


def test_replacing_a_function_of_another_engine_module_is_rejected(toy):
    """Even by one that computes the same: the tests must run the chapter's engine."""
    patch = "\nimport minisgl.helper\n\nminisgl.helper.double = lambda x: x + x\n"
    out = judge_source(toy, TOY + patch)
    assert out.returncode == 1
    assert "Verdict: Rejected" in out.stdout, out.stdout
    assert "minisgl.helper.double was replaced" in out.stdout, out.stdout


def test_check_names_an_exercise_test_that_imports_a_later_chapters_module(toy):
    (toy / "minisgl" / "later.py").write_text("def more():\n    return 1\n")
    rewrite(
        toy / "chapters" / "ch01_more" / "chapter.toml", {"new = []": 'new = ["minisgl/later.py"]'}
    )
    test = toy / "practice" / "exercises" / "901_toy_add" / "test_toy_add.py"
    test.write_text("from minisgl.later import more\n" + OWN_TESTS)
    out = judge(toy, "check", "901", "--device", "cpu")
    assert out.returncode == 1
    assert "test_toy_add.py imports minisgl.later, which chapter 0's version lacks" in out.stdout
