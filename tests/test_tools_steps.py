"""tools.steps on a small fake book: manifests, the tree, the static checks, the check run.

Nothing here touches the real engine; each test writes its own repository under tmp_path.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from tools import jobs, outputs, steps

FAKE = {
    0: ("intro", dict(main="examples/ch00_intro.py", new=[])),
    1: ("core", dict(main="examples/ch01_core.py", new=["minisgl/__init__.py", "minisgl/core.py"])),
    2: (
        "layers",
        dict(
            main="examples/ch02_layers.py",
            new=[
                "minisgl/layers/__init__.py",
                "minisgl/layers/linear.py",
                "minisgl/utils/__init__.py",
            ],
            early={"minisgl/dist/info.py": 4},
        ),
    ),
    3: (
        "engine",
        dict(
            main="examples/ch03_engine.py",
            new=["minisgl/engine/__init__.py", "minisgl/engine/engine.py", "minisgl/env.py"],
            early={"minisgl/sched/cache.py": 5, "minisgl/sched/io.py": 6},
            # a marker of chapter 3 in a file of chapter 1: chapter 3 modifies it
            texts={"minisgl/core.py": "x = 1\ny = 2  # " + "+ch03\n"},
        ),
    ),
}


def write_manifest(
    root: Path,
    n: int,
    slug: str,
    main: str,
    new: list[str],
    early: dict[str, int] | None = None,
    extra: str = "",
    texts: dict[str, str] | None = None,
) -> None:
    d = root / "chapters" / f"ch{n:02d}_{slug}"
    d.mkdir(parents=True, exist_ok=True)
    early_lines = "".join(
        f'[early."{p}"]\nchapter = {c}\nwhy = "needed before chapter {c}"\n'
        for p, c in (early or {}).items()
    )
    (d / "chapter.toml").write_text(
        textwrap.dedent(f"""\
        title = "Chapter {n}"
        stage = 1
        main = "{main}"
        tests = ["tests/test_ch{n:02d}_{slug}.py"]
        new = {list(new)!r}
        exercises = []
        {extra}
        """).replace("'", '"')
        + early_lines
    )


def make_repo(root: Path, chapters: dict = FAKE, create_files: bool = True) -> Path:
    for n, (slug, spec) in chapters.items():
        write_manifest(root, n, slug, **spec)
        if create_files:
            for p in [
                *spec.get("new", []),
                *spec.get("early", {}),
                spec["main"],
                f"tests/test_ch{n:02d}_{slug}.py",
            ]:
                (root / p).parent.mkdir(parents=True, exist_ok=True)
                (root / p).touch()
    for n, (slug, spec) in chapters.items():
        for p, text in spec.get("texts", {}).items():
            (root / p).write_text(text)
    return root


def test_manifests_load_with_number_slug_and_path(tmp_path):
    ms = steps.load_manifests(make_repo(tmp_path))
    assert [(m.number, m.slug) for m in ms] == [
        (0, "intro"),
        (1, "core"),
        (2, "layers"),
        (3, "engine"),
    ]
    m = ms[3]
    assert m.early == {"minisgl/sched/cache.py": 5, "minisgl/sched/io.py": 6}
    assert m.early_why["minisgl/sched/io.py"] == "needed before chapter 6"
    assert m.tests == ["tests/test_ch03_engine.py"]
    assert m.path == tmp_path / "chapters" / "ch03_engine"


def test_files_so_far_gives_each_file_its_status_at_that_chapter(tmp_path):
    ms = steps.load_manifests(make_repo(tmp_path))
    assert steps.files_so_far(0, ms) == {}
    at2 = steps.files_so_far(2, ms)
    assert at2["minisgl/core.py"] == "unchanged"
    assert at2["minisgl/layers/linear.py"] == "new"
    assert at2["minisgl/dist/info.py"] == "early"
    at3 = steps.files_so_far(3, ms)
    assert at3["minisgl/core.py"] == "modified"
    assert at3["minisgl/dist/info.py"] == "unchanged"  # early in 2: nothing new at 3
    assert len(at3) == 11


def test_tree_header_counts_and_drawing_match_the_seed_format(tmp_path):
    ms = steps.load_manifests(make_repo(tmp_path))
    assert steps.render_tree(3, manifests=ms) == textwrap.dedent("""\
        Files so far: 11 (3 new, 1 modified, 2 brought in early)

        minisgl/
        ├── __init__.py
        ├── core.py  ← modified in this chapter
        ├── env.py  ← new in this chapter
        ├── dist/  (1 file, unchanged)
        ├── engine/
        │   ├── __init__.py  ← new in this chapter
        │   ├── engine.py  ← new in this chapter
        ├── layers/  (2 files, unchanged)
        ├── sched/
        │   ├── cache.py  ← brought in early (explained in chapter 5; see below)
        │   ├── io.py  ← brought in early (explained in chapter 6; see below)
        ├── utils/  (1 file, unchanged)

        Brought in early:
          sched/cache.py (chapter 5): needed before chapter 5
          sched/io.py (chapter 6): needed before chapter 6""")


def test_tree_of_a_chapter_without_engine_files_and_markdown_fence(tmp_path):
    ms = steps.load_manifests(make_repo(tmp_path))
    assert steps.render_tree(0, manifests=ms).startswith(
        "Files so far: 0 (0 new, 0 modified, 0 brought in early)\n\nminisgl/  (no files yet)"
    )
    md = steps.render_tree(1, "markdown", manifests=ms)
    assert md.startswith("```text\nFiles so far: 2 (2 new, 0 modified, 0 brought in early)")
    assert md.endswith("├── core.py  ← new in this chapter\n```")
    with pytest.raises(ValueError):
        steps.render_tree(1, "html", manifests=ms)


def test_nested_folders_collapse_only_when_nothing_inside_changed(tmp_path):
    chapters = {
        1: (
            "a",
            dict(main="examples/ch01_a.py", new=["minisgl/k/__init__.py", "minisgl/k/t/x.py"]),
        ),
        2: ("b", dict(main="examples/ch02_b.py", new=["minisgl/k/t/y.py"])),
    }
    ms = steps.load_manifests(make_repo(tmp_path, chapters))
    assert steps.render_tree(2, manifests=ms).splitlines()[2:] == [
        "minisgl/",
        "├── k/",
        "│   ├── __init__.py",
        "│   ├── t/",
        "│   │   ├── x.py",
        "│   │   ├── y.py  ← new in this chapter",
    ]


def test_the_fake_book_passes_the_static_checks(tmp_path):
    root = make_repo(tmp_path)
    assert steps.static_problems(steps.load_manifests(root), root) == []


def test_a_file_introduced_twice_is_reported(tmp_path):
    chapters = dict(FAKE)
    chapters[4] = (
        "sched",
        dict(
            main="examples/ch04_sched.py",
            new=["minisgl/sched/cache.py", "minisgl/layers/linear.py"],
        ),
    )
    root = make_repo(tmp_path, chapters)
    problems = steps.static_problems(steps.load_manifests(root), root)
    assert problems == [
        "minisgl/sched/cache.py is introduced twice: chapter 3 (early) and chapter 4 (new)",
        "minisgl/layers/linear.py is introduced twice: chapter 2 (new) and chapter 4 (new)",
    ]


def test_missing_unlisted_and_misordered_files_are_reported(tmp_path):
    chapters = dict(FAKE)
    chapters[4] = (
        "late",
        dict(
            main="examples/ch04_late.py",
            new=["minisgl/late.py"],
            early={"minisgl/soon.py": 4},
        ),
    )
    root = make_repo(tmp_path, chapters)
    (root / "minisgl/late.py").unlink()
    (root / "minisgl/stray.py").touch()
    (root / "examples/stray_demo.py").touch()
    (root / "minisgl/__pycache__").mkdir()
    (root / "minisgl/__pycache__/core.cpython-311.pyc").touch()
    problems = steps.static_problems(steps.load_manifests(root), root)
    assert problems == [
        "chapter 4: minisgl/soon.py is brought in early but explained in chapter 4, "
        "which is not later",
        "chapter 4: minisgl/late.py is listed in ch04_late/chapter.toml but does not exist",
        "minisgl/stray.py is in the engine but no chapter introduces it",
        "examples/stray_demo.py is in no chapter manifest, so check never runs it",
    ]
    allowed = steps.static_problems(steps.load_manifests(root), root, allow_unlisted=True)
    assert "minisgl/stray.py is in the engine but no chapter introduces it" not in allowed


def test_a_bad_manifest_names_its_file(tmp_path):
    d = tmp_path / "chapters" / "ch01_x"
    d.mkdir(parents=True)
    (d / "chapter.toml").write_text('title = "x"\nstage = 1\n')
    with pytest.raises(ValueError, match="ch01_x/chapter.toml: missing key 'main'"):
        steps.load_manifests(tmp_path)


def test_diagnose_names_the_chapter_that_introduces_a_missing_module(tmp_path):
    ms = steps.load_manifests(make_repo(tmp_path))
    out = "Traceback...\nModuleNotFoundError: No module named 'minisgl.engine'\n"
    assert steps.diagnose(out, 1, ms, tmp_path) == [
        "chapter 1 reaches forward: minisgl.engine is imported but not introduced until "
        "chapter 3 (minisgl/engine/__init__.py)"
    ]
    # a namespace package whose __init__.py comes later
    out = "ImportError: cannot import name 'Engine' from 'minisgl.engine' (unknown location)"
    assert (
        "not introduced until chapter 3 (minisgl/engine/__init__.py)"
        in steps.diagnose(out, 2, ms, tmp_path)[0]
    )
    out = "ModuleNotFoundError: No module named 'flashinfer'"
    assert "third-party module 'flashinfer'" in steps.diagnose(out, 2, ms, tmp_path)[0]
    out = f"FileNotFoundError: [Errno 2] No such file or directory: '{tmp_path}/s/minisgl/env.py'"
    assert steps.diagnose(out, 2, ms, tmp_path, step=tmp_path / "s") == [
        "chapter 2 reaches forward: minisgl/env.py is opened but not introduced until "
        "chapter 3 (minisgl/env.py)"
    ]
    assert steps.diagnose("AssertionError: 1 != 2", 2, ms, tmp_path) == []


def test_check_runs_each_step_on_its_own_files_and_catches_a_forward_reach(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # the inner pytest starts faster
    root = make_repo(tmp_path)
    (root / "minisgl/core.py").write_text("VALUE = 42\n")
    (root / "examples/ch01_core.py").write_text(
        "import minisgl, minisgl.core\nprint(minisgl.core.VALUE, minisgl.__file__)\n"
    )
    (root / "tests/test_ch01_core.py").write_text(
        "import os\nimport minisgl.core\n\n"
        "def test_value():\n    assert minisgl.core.VALUE == 42\n"
        "    assert not os.path.exists('minisgl/engine')\n"
    )
    # in chapter 2, an engine module reaches for chapter 3's env, the main for its engine
    (root / "minisgl/layers/linear.py").write_text("import minisgl.env\n")
    (root / "examples/ch02_layers.py").write_text("import minisgl.engine.engine\n")
    ms = steps.load_manifests(root)

    ok = steps.check_chapter(1, ms, root, timeout=120)
    assert ok.ok, ok.problems
    assert ok.ran == ["imports", "examples/ch01_core.py", "tests"]
    assert "imported 2 of 2 engine modules" in ok.log
    assert f"42 {root}/build/steps/01/minisgl/__init__.py" in ok.log

    bad = steps.check_chapter(2, ms, root, timeout=120)
    assert not bad.ok
    assert bad.problems[:2] == [
        "chapter 2 reaches forward: minisgl.env is imported but not introduced until "
        "chapter 3 (minisgl/env.py)",
        "chapter 2 reaches forward: minisgl.engine is imported but not introduced until "
        "chapter 3 (minisgl/engine/__init__.py)",
    ]
    assert (root / "build/steps/02/minisgl/layers/linear.py").exists()
    assert not (root / "build/steps/02/minisgl/engine").exists()


def test_outputs_check_from_steps_reuses_only_a_run_of_the_same_files(
    tmp_path, monkeypatch, capsys
):
    """check keeps each main's stdout with a fingerprint of what it ran; tools.outputs --check
    --from-steps takes it instead of a rerun only while the files are the same, and a stale
    outputs/*.txt fails either way."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    root = make_repo(tmp_path)
    (root / "minisgl/core.py").write_text("VALUE = 42\n")
    (root / "examples/ch01_core.py").write_text(
        "import minisgl.core\nprint('value', minisgl.core.VALUE)\n"
    )
    (root / "tests/test_ch01_core.py").write_text("def test_nothing():\n    pass\n")
    ms = steps.load_manifests(root)
    assert steps.check_chapter(1, ms, root, timeout=120).ok
    (root / "outputs").mkdir()
    (root / "outputs/ch01_core.txt").write_text("value 42\n")
    check = ["--root", str(root), "--check", "--from-steps", "ch01_core"]
    capsys.readouterr()
    assert outputs.main(check) == 0
    assert (
        "ok    ch01_core (stdout of the same files from tools.steps check"
        in capsys.readouterr().out
    )

    (root / "outputs/ch01_core.txt").write_text("value 41\n")  # a stale captured output
    assert outputs.main(check) == 1
    out = capsys.readouterr().out
    assert "-value 41" in out and "+value 42" in out

    (root / "outputs/ch01_core.txt").write_text("value 42\n")
    (root / "minisgl/core.py").write_text("VALUE = 43\n")  # the engine changed since the steps ran
    assert outputs.main(check) == 1  # so the example is rerun, and its new output is stale
    out = capsys.readouterr().out
    assert "+value 43" in out and "from tools.steps" not in out

    (root / "examples/ch01_core.py").write_text("raise SystemExit(3)\n")
    assert not steps.check_chapter(1, ms, root, timeout=120).ok
    assert not (root / "build/steps/stdout/ch01_core.json").exists()  # a failed run leaves nothing

    # a run that went on without a module its step hides (chapter 3's engine) ran other code
    # than a run from the repository would: not kept either
    (root / "examples/ch01_core.py").write_text(
        "try:\n    import minisgl.engine\nexcept ImportError:\n    print('no engine yet')\n"
    )
    assert steps.check_chapter(1, ms, root, timeout=120).ok
    assert not (root / "build/steps/stdout/ch01_core.json").exists()


def test_jobs_hand_results_back_in_order_and_give_each_child_one_thread(monkeypatch):
    import subprocess
    import time

    def late(i: int, delay: float) -> int:
        time.sleep(delay)
        return i

    calls = [(late, (0, 0.3)), (late, (1, 0.0)), (late, (2, 0.1))]
    assert list(jobs.in_order(calls, 3)) == [0, 1, 2]
    assert list(jobs.in_order(calls, 1)) == [0, 1, 2]
    threads = "import os; print(os.environ.get('OMP_NUM_THREADS'))"
    child = (subprocess.check_output, ([sys.executable, "-c", threads],))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert list(jobs.in_order([child, child], 2)) == [b"1\n", b"1\n"]
    assert "OMP_NUM_THREADS" not in os.environ  # put back
    assert list(jobs.in_order([child], 1)) == [b"None\n"]  # one at a time: left alone
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert list(jobs.in_order([child, child], 2)) == [b"3\n", b"3\n"]  # the caller's choice stands


LEAKY_FINDER = """
import sys
from importlib.machinery import PathFinder

class EditableLike:  # what an editable install appends to sys.meta_path
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.startswith("minisgl."):
            return PathFinder.find_spec(fullname, [{engine!r}])

sys.meta_path.append(EditableLike)
import minisgl.core
try:
    import minisgl.engine
    print("leaked", minisgl.engine.__file__)
except ModuleNotFoundError as e:
    print("blocked", e)
"""


def test_an_installed_minisgl_cannot_fill_in_a_later_chapters_module(tmp_path):
    import subprocess

    root = make_repo(tmp_path)
    step, missing = steps.build_step(1, steps.load_manifests(root), root)
    assert missing == []
    code = LEAKY_FINDER.format(engine=str(root / "minisgl"))
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=step,
        env=steps._env(step),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == "blocked No module named 'minisgl.engine'", out.stderr


def test_command_line_tree_list_and_static_check(tmp_path, capsys):
    root = make_repo(tmp_path)
    assert steps.main(["--root", str(root), "tree", "2"]) == 0
    assert capsys.readouterr().out.startswith(
        "Files so far: 6 (3 new, 0 modified, 1 brought in early)\n"
    )
    assert steps.main(["--root", str(root), "list"]) == 0
    assert "03  engine" in capsys.readouterr().out
    assert steps.main(["--root", str(root), "check", "--static-only"]) == 0
    (root / "minisgl/stray.py").touch()
    assert steps.main(["--root", str(root), "check", "--static-only"]) == 1
    assert (
        "minisgl/stray.py is in the engine but no chapter introduces it" in capsys.readouterr().out
    )
    assert steps.main(["--root", str(root), "check", "--static-only", "--allow-unlisted"]) == 0


def test_an_earlier_test_runs_again_only_where_its_imports_reach_a_change(tmp_path):
    root = make_repo(tmp_path)
    (root / "tests/test_ch01_core.py").write_text("import minisgl.core\n")
    (root / "tests/test_ch02_layers.py").write_text("from minisgl.layers import linear\n")
    before, rerun = steps.earlier_tests(3, steps.load_manifests(root), root)
    assert before == [
        "tests/test_ch00_intro.py",
        "tests/test_ch01_core.py",
        "tests/test_ch02_layers.py",
    ]
    assert rerun == ["tests/test_ch01_core.py"]  # chapter 3 marks a line of core.py
    assert steps.earlier_tests(2, steps.load_manifests(root), root)[1] == []


def test_command_line_show_and_changes_give_a_chapters_version_and_diff(tmp_path, capsys):
    root = make_repo(tmp_path)
    assert steps.main(["--root", str(root), "show", "2", "minisgl/core.py"]) == 0
    assert capsys.readouterr().out == "x = 1\n"
    assert steps.main(["--root", str(root), "changes", "3"]) == 0
    out = capsys.readouterr().out
    assert "chapter 3 brings in 7 file(s):\n  minisgl/engine/__init__.py" in out
    assert "and edits 1:\n--- minisgl/core.py" in out and "\n+y = 2  # " + "+ch03" in out


def test_show_refuses_a_file_the_chapter_has_not_brought_in(tmp_path, capsys):
    root = make_repo(tmp_path)
    assert steps.main(["--root", str(root), "show", "2", "minisgl/engine/engine.py"]) == 2
    assert "not in chapter 2's tree (chapter 3 brings it in)" in capsys.readouterr().err


def test_run_gives_a_chapters_main_its_own_tree_and_arguments(tmp_path, capfd):
    root = make_repo(tmp_path)
    main = (
        "import sys\nimport minisgl.core\nprint(open(minisgl.core.__file__).read(), sys.argv[1:])\n"
    )
    (root / "examples/ch02_layers.py").write_text(main)
    (root / "examples/ch03_engine.py").write_text(main)
    assert steps.main(["--root", str(root), "run", "2"]) == 0
    assert capfd.readouterr().out == "x = 1\n []\n"  # chapter 2's version of core.py
    assert steps.main(["--root", str(root), "run", "3", "--flag"]) == 0
    assert capfd.readouterr().out == "x = 1\ny = 2  # " + "+ch03\n ['--flag']\n"
    assert steps.main(["--root", str(root), "run", "9"]) == 2


def test_after_the_full_suite_a_test_reading_the_final_text_is_not_run_again(tmp_path):
    root = make_repo(tmp_path)
    (root / "tests/test_ch01_core.py").write_text("import minisgl.core\n")
    (root / "tests/test_ch02_layers.py").write_text("from minisgl.layers import linear\n")
    ms = steps.load_manifests(root)
    tests = ["tests/test_ch01_core.py", "tests/test_ch02_layers.py"]
    # chapter 3 (the toy book's last) marks a line of core.py: chapter 2's core.py is not final
    assert steps.as_in_final(2, tests, ms, root) == ["tests/test_ch02_layers.py"]
    assert steps.as_in_final(3, tests, ms, root) == tests
