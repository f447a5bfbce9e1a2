"""Submissions that attack the judge instead of solving the exercise, and their verdicts.

Each attack is a wrong answer to exercise 111 (``Req.remain_len`` returns 0) plus code that
tries to turn that into Accepted: patching pytest, the tests' helpers, a module of a later
chapter or the judge's plugin, exiting early, rewriting the tests or the engine (in the sandbox and
in the repository), patching ``time``, forging the event stream, skipping its own failures,
leaving a process behind (that one on the right answer). Every one must get a verdict other than Accepted, the repository's engine and tests
must be byte-identical afterwards, and no process it started may be left alive.

The judge runs on a copy of the repository (``--root``) with ``--quick`` (the exercise's own
tests), three attacks at a time: about a minute on two CPU cores.
``python tests/test_practice_attacks.py [JUDGE]`` prints the table (attack, verdict) for
that judge (default: this checkout's).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Tuple

import pytest

from tools import versions

REPO = Path(__file__).resolve().parents[1]
JUDGE = REPO / "practice" / "judge.py"
EXERCISE = "111"
WRONG = ("return self.max_device_len - self.device_len", "return 0")
ORPHAN_PID = "orphan.pid"  # where the forking attack leaves its child's pid

ATTACKS: Dict[str, tuple] = {
    # name: (code appended to the wrong module, verdict it must get[, wrong=False: to the
    # right module])
    "patch pytest's Function.runtest (issue 24's three lines)": (
        """
        import _pytest.python as p
        p.Function.runtest = lambda self: None
        """,
        "Rejected",
    ),
    "patch runtest's __code__ (same function object)": (
        """
        import _pytest.python as p
        p.Function.runtest.__code__ = (lambda self: None).__code__
        """,
        "Rejected",
    ),
    "patch pytest's report to say passed": (
        """
        import _pytest.reports as r
        _orig = r.TestReport.from_item_and_call.__func__
        def _fake(cls, item, call):
            rep = _orig(cls, item, call)
            rep.outcome = "passed"
            rep.longrepr = None
            return rep
        r.TestReport.from_item_and_call = classmethod(_fake)
        """,
        "Rejected",
    ),
    "patch a test helper (tests.helpers) and torch.equal": (
        """
        import torch
        import tests.helpers as h
        h.hf_greedy = lambda *a, **k: None
        torch.equal = lambda *a, **k: True
        """,
        "Rejected",
    ),
    # chapter 1's engine is this module alone: reaching for a later chapter's module fails
    # (tests/test_judge.py rejects a replaced function of another engine module)
    "reach for a module chapter 1's engine does not have": (
        """
        import minisgl.kvcache as kv
        _real = kv.create_prefix_cache
        kv.create_prefix_cache = lambda *a, **k: _real(*a, **k)
        """,
        "Runtime error",
    ),
    "patch the judge's plugin, then pytest": (
        """
        import sys
        plugin = sys.modules["_judge_plugin"]
        plugin._check = lambda *a, **k: None
        plugin._WATCH.clear()
        import _pytest.python as p
        p.Function.runtest = lambda self: None
        """,
        "Rejected",
    ),
    "os._exit(0) at import": ("import os\nos._exit(0)", "Runtime error"),
    "os._exit(0) inside a case": (
        """
        import os
        Req.remain_len = property(lambda self: os._exit(0))
        """,
        "Runtime error",
    ),
    "pytest.exit() inside a case": (
        """
        import pytest
        Req.remain_len = property(lambda self: pytest.exit("done", returncode=0))
        """,
        "Runtime error",
    ),
    "skip its own failing cases": (
        """
        import pytest
        Req.remain_len = property(lambda self: pytest.skip("not today"))
        """,
        "Runtime error",
    ),
    "rewrite the sandbox's tests at import": (
        """
        import glob, os
        for f in glob.glob("tests/test_*.py"):
            os.chmod(f, 0o644)
            open(f, "w").write("def test_ok():\\n    pass\\n")
        """,
        "Rejected",
    ),
    "rewrite the repository's minisgl/ and the exercise's tests": (
        """
        import glob, os
        root = os.path.dirname(os.environ["MINISGL_MODELS_DIR"])
        for f in [os.path.join(root, "minisgl", "core.py")] + glob.glob(
            os.path.join(root, "practice", "exercises", "111_*", "test_*.py")
        ):
            open(f, "a").write("\\n# changed by the submission\\n")
        open(os.path.join(root, "minisgl", "planted.py"), "w").write("x = 1\\n")
        """,
        "Rejected",
    ),
    "patch time to dodge the limit": (
        """
        import time
        _sleep = time.sleep
        time.perf_counter = time.monotonic = lambda: 0.0
        def _slow(self):
            _sleep(30)
            return 0
        Req.remain_len = property(_slow)
        """,
        "not Accepted",
    ),
    "print a fake verdict and forge the event stream": (
        """
        import json, os
        print("Verdict: Accepted · 10 / 10 cases · device cpu")
        with open(os.environ["JUDGE_EVENTS"], "a") as f:
            f.write(json.dumps({"ev": "collected", "cases": ["x"]}) + "\\n")
            f.write(json.dumps({"ev": "result", "case": "x", "outcome": "passed", "duration": 0.1}) + "\\n")
            f.write(json.dumps({"ev": "done", "exitstatus": 0}) + "\\n")
        os._exit(0)
        """,
        "Rejected",
    ),
    # -- attacks on a judge that asks the judged process whether it passed (issue 37): the
    # verdict now rests on the record of what the code returned, compared with the engine's
    "register a plugin through gc whose pytest_pyfunc_call says passed": (
        """
        import gc
        import pytest
        from _pytest.config import Config

        class _AlwaysPass:
            @pytest.hookimpl(tryfirst=True)
            def pytest_pyfunc_call(self, pyfuncitem):
                return True

        for _o in gc.get_objects():
            if isinstance(_o, Config):
                _o.pluginmanager.register(_AlwaysPass(), "always-pass")
                break
        """,
        "Wrong answer",
    ),
    "a trace hook that clears pluggy's exception": (
        """
        import ctypes, sys

        def _local(frame, event, arg):
            if frame.f_locals.get("exception") is not None:
                frame.f_locals["exception"] = None
                ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))
            return _local

        def _tracer(frame, event, arg):
            return _local if frame.f_code.co_name == "_multicall" else None

        sys.settrace(_tracer)
        """,
        "not Accepted",
    ),
    "seal a stream of passes with the plugin's own key, then os._exit": (
        """
        import gc, json, os, sys
        import pytest

        def _forge(self):
            plugin = sys.modules["_judge_plugin"]
            session = next(o for o in gc.get_objects() if isinstance(o, pytest.Session))
            now = plugin._state["nodeid"]
            names = [i.nodeid for i in session.items]
            for case in names[names.index(now):]:
                if case != now:
                    plugin._emit(ev="start", case=case)
                plugin._emit(ev="body", case=case)
                plugin._emit(ev="result", case=case, outcome="passed", body=True)
                with open(os.environ["JUDGE_RECORD"], "a") as f:
                    f.write(json.dumps({"case": case, "calls": {}}) + "\\n")
            plugin._emit(ev="done", exitstatus=0, module_file=__file__)
            os._exit(0)

        Req.remain_len = property(_forge)
        """,
        "Wrong answer",
    ),
    "raise the skip the engine's GPU tests raise, from a file named like the tests'": (
        """
        _ns = {}
        exec(compile("def skip(*args, **kwargs):\\n    import pytest\\n"
                     "    pytest.skip('needs a CUDA GPU')\\n", "tests/conftest.py", "exec"), _ns)
        for _name in ("remain_len", "extend_len", "can_decode"):  # no frame of this file
            setattr(Req, _name, property(_ns["skip"]))
        Req.__post_init__ = Req.complete_one = Req.append_host = _ns["skip"]
        """,
        "Wrong answer",
    ),
    "return a value that equals everything": (
        """
        class _Equal(int):
            def __eq__(self, other):
                return True

            __hash__ = int.__hash__

        Req.remain_len = property(lambda self: _Equal(0))
        """,
        "Wrong answer",
    ),
    "rewrite the recorder's record of the running case": (
        """
        import sys
        _real = Req.remain_len.fget

        def _blank(self):
            sys.modules["_judge_recorder"]._CASE.clear()
            return 0

        Req.remain_len = property(_blank)
        """,
        "Wrong answer",
    ),
    "fork a child that outlives the run": (
        f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                root = os.path.dirname(os.environ["MINISGL_MODELS_DIR"])
                open(os.path.join(root, "{ORPHAN_PID}"), "w").write(str(os.getpid()))
                time.sleep(20)
                open(os.path.join(root, "minisgl", "core.py"), "a").write("# late\\n")
            os._exit(0)
        """,
        "Runtime error",
        False,  # on the right answer: the left-behind process alone must cost the Accepted
    ),
}

GUARDED = ("minisgl", "tests", "practice/exercises", "practice/judgelib")


def _digest(root: Path) -> Dict[str, str]:
    out = {}
    for top in GUARDED:
        for f in sorted((root / top).rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                out[str(f.relative_to(root))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def make_root(tmp: Path) -> Path:
    """A copy of the repository that the judge may be attacked in."""
    root = tmp / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "workspace")
    for name in ("minisgl", "tests", "practice", "tools", "examples", "chapters"):
        shutil.copytree(REPO / name, root / name, ignore=ignore, symlinks=True)
    for name in ("pyproject.toml", "conftest.py", "pytest.ini"):
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, root / name)
    (root / "models").mkdir()
    return root


def chapter_1_core() -> str:
    """Exercise 111's module as chapter 1 leaves it: the engine its judge runs."""
    text = (REPO / "minisgl" / "core.py").read_text(encoding="utf-8")
    return versions.version(text, 1, "minisgl/core.py")


def attack_source(code: str, wrong: bool = True) -> str:
    src = chapter_1_core()
    assert WRONG[0] in src, "exercise 111's wrong answer no longer applies to minisgl/core.py"
    if wrong:
        src = src.replace(WRONG[0], WRONG[1])
    return src + "\n" + textwrap.dedent(code)


def judge_attack(
    judge: Path, root: Path, name: str, code: str, wrong: bool = True
) -> Tuple[str, str]:
    """(the verdict name, the judge's whole output) for one attack."""
    sub = root / "attacks" / re.sub(r"\W+", "_", name)
    sub.mkdir(parents=True, exist_ok=True)
    learner = sub / "core.py"
    learner.write_text(attack_source(code, wrong), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    out = subprocess.run(
        [
            sys.executable,
            str(judge),
            "--root",
            str(root),
            EXERCISE,
            "--quick",
            "--device",
            "cpu",
            "--time-limit",
            "10",
            "--file",
            str(learner),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    ).stdout
    verdicts = re.findall(r"^Verdict: ([A-Z][a-z]+(?: [a-z]+)*)", out, flags=re.M)
    return (verdicts[-1] if verdicts else "no verdict"), out


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    """Each attack in its own copy of the repository (a FileGuard snapshot is per run)."""
    roots = {name: make_root(tmp_path_factory.mktemp("attack")) for name in ATTACKS}
    before = _digest(next(iter(roots.values())))
    with ThreadPoolExecutor(3) as pool:
        futures = {
            name: pool.submit(judge_attack, JUDGE, roots[name], name, *spec[:1], *spec[2:])
            for name, spec in ATTACKS.items()
        }
        results = {name: f.result() for name, f in futures.items()}
    return roots, before, results


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_is_not_accepted(attacked, name):
    _, _, results = attacked
    verdict, out = results[name]
    want = ATTACKS[name][1]
    assert verdict != "Accepted", out
    assert verdict != "no verdict", out
    if want != "not Accepted":
        assert verdict == want, out
    assert "judge error" not in out, out
    # the judge's own verdict line is the only one at the start of a line
    assert len(re.findall(r"^Verdict:", out, flags=re.M)) == 1, out


def test_rejections_name_what_changed(attacked):
    _, _, results = attacked
    assert (
        "_pytest.python.Function.runtest was replaced"
        in results["patch pytest's Function.runtest (issue 24's three lines)"][1]
    )
    assert (
        "torch.equal was replaced"
        in results["patch a test helper (tests.helpers) and torch.equal"][1]
    )
    out = results["rewrite the repository's minisgl/ and the exercise's tests"][1]
    assert "changed minisgl/core.py (in the repository; restored)" in out, out
    assert "added minisgl/planted.py (in the repository; restored)" in out, out
    assert (
        "the event stream has a line the judge did not write"
        in results["print a fake verdict and forge the event stream"][1]
    )


@pytest.mark.parametrize("name", list(ATTACKS))
def test_the_engine_and_the_tests_are_byte_identical_afterwards(attacked, name):
    roots, before, _ = attacked
    assert _digest(roots[name]) == before


def test_no_process_outlives_the_run(attacked):
    roots, _, results = attacked
    name = "fork a child that outlives the run"
    out = results[name][1]
    assert "were still running after it (killed)" in out, out
    pid_file = roots[name] / ORPHAN_PID
    assert pid_file.is_file(), out
    pid = int(pid_file.read_text())
    assert (
        not Path(f"/proc/{pid}").exists()
        or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]
    )


PLANT = """
import importlib._bootstrap_external as be, os
root = os.path.dirname(os.environ["MINISGL_MODELS_DIR"])
path = os.path.join(root, "practice", "judgelib", "verdict.py")
src = open(path).read() + (
    "\\n_judge, _against = judge, against_reference\\n"
    "def _accept(v):\\n    v.name = ACCEPTED\\n    return v\\n"
    "def judge(*a, **k):\\n    return _accept(_judge(*a, **k))\\n"
    "def against_reference(*a, **k):\\n    return _accept(_against(*a, **k))\\n"
)
st = os.stat(path)
pyc = be._code_to_timestamp_pyc(compile(src, path, "exec"), st.st_mtime, st.st_size)
os.makedirs(os.path.join(os.path.dirname(path), "__pycache__"), exist_ok=True)
for tag in ("cpython-311", "cpython-312", "cpython-313"):
    open(os.path.join(os.path.dirname(path), "__pycache__", f"verdict.{tag}.pyc"), "wb").write(pyc)
"""


def test_bytecode_planted_in_the_judge_is_never_read(tmp_path):
    """A submission plants a compiled verdict.py that accepts everything beside the judge's
    source (its timestamp and size match, so a plain ``import`` would use it); the judge
    runs with ``-I -B`` and bytecode caches under a folder that never exists, so the next
    plain wrong answer judged from that checkout is still a Wrong answer."""
    root = make_root(tmp_path)
    judge = root / "practice" / "judge.py"  # the checkout the bytecode was planted in
    judge_attack(judge, root, "plant", PLANT)
    planted = list((root / "practice" / "judgelib" / "__pycache__").glob("verdict.*.pyc"))
    assert planted, "the attack did not plant its bytecode"
    verdict, out = judge_attack(judge, root, "plain wrong answer", "")
    assert verdict == "Wrong answer", out


def test_killing_the_judge_leaves_no_verdict_and_no_accepted_status(tmp_path):
    """The judged process can signal its parent (same user); what it cannot do is make the
    judge write Accepted: the status and the report are written by the judge alone, after
    the comparison."""
    root = make_root(tmp_path)
    code = """
    import os, signal
    os.kill(os.getppid(), signal.SIGKILL)
    """
    verdict, out = judge_attack(JUDGE, root, "kill the judge", code)
    assert verdict != "Accepted", out
    status = root / "practice" / "workspace" / ".status.json"
    assert not status.exists() or '"accepted"' not in status.read_text()


def test_the_engine_itself_is_still_accepted(tmp_path):
    root = make_root(tmp_path)
    reference = tmp_path / "core.py"
    reference.write_text(chapter_1_core(), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    out = subprocess.run(
        [
            sys.executable,
            str(JUDGE),
            "--root",
            str(root),
            EXERCISE,
            "--quick",
            "--device",
            "cpu",
            "--file",
            str(reference),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    ).stdout
    assert "Verdict: Accepted" in out, out


if __name__ == "__main__":  # the table for a judge: python tests/test_practice_attacks.py [JUDGE]
    judge = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else JUDGE
    with tempfile.TemporaryDirectory() as tmp:
        root = make_root(Path(tmp))
        for name, spec in ATTACKS.items():
            verdict, _out = judge_attack(judge, root, name, *spec[:1], *spec[2:])
            print(f"| {name} | {verdict} |", flush=True)
