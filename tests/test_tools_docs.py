"""The book's site machinery: the @@macro@@ resolver, outputs capture, notebooks, upstream index.

Every test builds a small repository in a temp folder, so none depends on the engine or the
chapters being written yet. The one mkdocs build (strict, twice) is the slowest, ~3 s.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tools.docs.chapters import find_exercise, load_chapters
from tools.docs.macros import MAIN_CELLS, Context, expand
from tools.docs.symbols import find_symbol, symbol_table

ROOT = Path(__file__).resolve().parents[1]

REPO = "https://github.com/example/book"

DEMO = '''\
"""A demo module."""
import functools

LIMIT: int = 8
Pair = tuple[int, int]


def helper(x: int) -> int:
    return x + 1


@functools.lru_cache(maxsize=None)
def cached(x: int) -> int:
    return helper(x) * 2


class Adder:
    """Adds things."""

    budget = 3

    def __init__(self, budget: int) -> None:
        self.budget = budget

    @property
    def left(self) -> int:
        return self.budget

    class Inner:
        def go(self) -> None:
            pass
'''

MAIN = '''\
"""Chapter 7: a demo main."""

import sys

from minisgl.demo import helper

# the answer, computed
x = helper(41)
print("answer", x)

for i in range(2):
    print(i)
'''


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write(tmp_path / "minisgl" / "__init__.py", "")
    (tmp_path / "minisgl" / "demo.py").write_text(DEMO, encoding="utf-8")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "ch07_demo.py").write_text(MAIN, encoding="utf-8")
    write(
        tmp_path / "chapters" / "ch07_demo" / "chapter.toml",
        """\
        title = "A demo chapter"
        stage = 2
        stage_title = "Scheduling it well"
        main = "examples/ch07_demo.py"
        new = ["minisgl/__init__.py", "minisgl/demo.py"]
        exercises = [191]
        """,
    )
    write(
        tmp_path / "chapters" / "ch07_demo" / "chapter.md",
        """\
        # A demo chapter

        The lead.

        @@code minisgl/demo.py:Adder.left@@
        """,
    )
    write(tmp_path / "outputs" / "ch07_demo.txt", "answer 42\n0\n1\n")
    write(
        tmp_path / "practice" / "exercises" / "191_prefill_adder" / "problem.md",
        """\
        +++
        title = "PrefillAdder: admission control"
        chapter = 7
        difficulty = "medium"
        +++
        # 191. PrefillAdder

        Write it.
        """,
    )
    index = {
        "repository": "https://github.com/sgl-project/mini-sglang",
        "commit": "a" * 40,
        "root": "python/minisgl",
        "files": {"scheduler/scheduler.py": {"Scheduler.normal_loop": [108, 118]}},
    }
    write(tmp_path / "docs" / "upstream_index.json", json.dumps(index))
    return tmp_path


def ctx_for(root: Path, mode: str = "site") -> Context:
    chapter = load_chapters(root)[0]
    return Context(
        root=root, repo_url=REPO, page="chapters/ch07_demo.md", chapter=chapter, mode=mode
    )


def render(root: Path, text: str, mode: str = "site"):
    return expand(textwrap.dedent(text), ctx_for(root, mode))


# ------------------------------------------------------------------ symbols


def test_symbol_table_finds_classes_methods_functions_and_module_names():
    table = symbol_table(DEMO)
    assert table["LIMIT"] == (4, 4)
    assert table["Pair"] == (5, 5)
    assert table["helper"] == (8, 9)
    assert table["cached"] == (12, 14)  # starts at the decorator
    assert table["Adder.left"] == (25, 27)
    assert table["Adder.Inner.go"] == (30, 31)
    assert table["Adder.budget"] == (20, 20)
    assert "functools" not in table  # imports are not symbols


def test_find_symbol_dedents_a_method_and_keeps_its_decorator():
    span = find_symbol(DEMO, "Adder.left")
    assert span.text.startswith("@property\ndef left(self) -> int:")
    assert (span.start, span.end) == (25, 27)


# ------------------------------------------------------------------ @@code@@


def test_code_macro_renders_the_symbol_titled_and_linked_to_its_lines(project):
    out = render(project, "@@code minisgl/demo.py:cached@@")
    assert out.errors == []
    assert '```python title="minisgl/demo.py · cached"' in out.text
    assert "@functools.lru_cache(maxsize=None)\ndef cached(x: int) -> int:" in out.text
    assert f"({REPO}/blob/main/minisgl/demo.py#L12-L14)" in out.text
    assert "lines 12–14" in out.text


def test_code_macro_without_symbol_shows_the_whole_file(project):
    out = render(project, "@@code examples/ch07_demo.py@@")
    assert out.errors == []
    assert 'title="examples/ch07_demo.py"' in out.text and 'print("answer", x)' in out.text
    assert f"({REPO}/blob/main/examples/ch07_demo.py)" in out.text


def test_renamed_symbol_fails_with_a_message_naming_macro_and_chapter(project):
    demo = project / "minisgl" / "demo.py"
    demo.write_text(DEMO.replace("def cached(", "def memoised("), encoding="utf-8")
    out = render(project, "@@code minisgl/demo.py:cached@@")
    assert len(out.errors) == 1
    message = out.errors[0]
    assert "@@code minisgl/demo.py:cached@@" in message
    assert "chapter 7" in message and "chapters/ch07_demo.md" in message
    assert "'cached' is not defined" in message
    assert "Broken macro" in out.text  # a non-strict build shows it in place


def test_missing_file_and_unparsable_file_are_errors(project):
    assert "does not exist" in render(project, "@@code minisgl/nope.py:X@@").errors[0]
    (project / "minisgl" / "bad.py").write_text("def broken(:\n", encoding="utf-8")
    assert "does not parse" in render(project, "@@code minisgl/bad.py:broken@@").errors[0]


def test_an_edited_body_changes_the_rendering(project):
    before = render(project, "@@code minisgl/demo.py:helper@@").text
    demo = project / "minisgl" / "demo.py"
    demo.write_text(DEMO.replace("return x + 1", "return x + 2  # changed"), encoding="utf-8")
    after = render(project, "@@code minisgl/demo.py:helper@@").text
    assert "return x + 1" in before and "return x + 2  # changed" in after


def test_block_macro_in_a_list_item_keeps_the_indentation(project):
    out = render(
        project,
        """\
        1. Pick a batch:

           @@code minisgl/demo.py:helper@@
        """,
    )
    lines = out.text.split("\n")
    assert lines[2] == '   ```python title="minisgl/demo.py · helper"'
    assert lines[3] == "   def helper(x: int) -> int:"
    assert lines[4] == "       return x + 1"


def test_block_macro_inside_a_sentence_is_an_error(project):
    out = render(project, "see @@code minisgl/demo.py:helper@@ here")
    assert "must stand alone" in out.errors[0]


def test_macros_in_code_blocks_and_code_spans_are_left_alone(project):
    text = (
        "Write `@@code path:Sym@@` to show code.\n\n```markdown\n@@code minisgl/nope.py:X@@\n```\n"
    )
    out = render(project, text)
    assert out.errors == [] and out.text == text


def test_unknown_macro_is_an_error(project):
    assert "unknown macro 'cod'" in render(project, "@@cod minisgl/demo.py:helper@@").errors[0]


def test_code_fence_grows_when_the_code_contains_backticks(project):
    (project / "minisgl" / "md.py").write_text(
        'def f():\n    """```python\n    x\n    ```"""\n', encoding="utf-8"
    )
    out = render(project, "@@code minisgl/md.py:f@@")
    assert out.text.startswith("````python title=")


# ------------------------------------------------------------------ other macros


def test_output_macro_renders_the_capture_and_fails_when_missing(project):
    out = render(project, "@@output ch07_demo@@")
    assert out.errors == []
    assert '```text title="python examples/ch07_demo.py"\nanswer 42\n0\n1\n```' in out.text
    missing = render(project, "@@output ch99_none@@")
    assert "outputs/ch99_none.txt does not exist" in missing.errors[0]


def test_tree_macro_draws_this_chapters_tree_from_the_manifests_under_the_root(project):
    out = render(project, "@@tree@@")
    assert out.errors == []
    assert "```text\nFiles so far: 2 (2 new, 0 modified, 0 brought in early)\n" in out.text
    assert "demo.py" in out.text
    toml = project / "chapters" / "ch07_demo" / "chapter.toml"
    toml.write_text(toml.read_text() + 'early = { "minisgl/later.py" = "eight" }\n')
    error = render(project, "@@tree@@").errors[0]
    assert "the tree of chapter 7" in error and "'early' must map paths" in error


def test_upstream_macro_links_the_pinned_commit_and_lines(project):
    out = render(project, "- the loop: @@upstream scheduler/scheduler.py:Scheduler.normal_loop@@")
    assert out.errors == []
    url = f"https://github.com/sgl-project/mini-sglang/blob/{'a' * 40}/python/minisgl/scheduler/scheduler.py#L108-L118"
    assert f"({url})" in out.text and "(lines 108–118)" in out.text
    bad = render(project, "@@upstream scheduler/scheduler.py:Scheduler.nope@@")
    assert "has no symbol 'Scheduler.nope'" in bad.errors[0]


def test_exercises_macro_reads_title_difficulty_and_judge_command(project):
    out = render(project, "@@exercises@@")
    assert out.errors == []
    assert "**191. PrefillAdder: admission control** (medium)" in out.text
    assert "`python practice/judge.py 191`" in out.text
    shutil.rmtree(project / "practice")
    assert "exercise 191" in render(project, "@@exercises@@").errors[0]


def test_exercise_title_from_heading_and_difficulty_line(tmp_path):
    write(
        tmp_path / "practice" / "exercises" / "12_radix" / "problem.md",
        "# Exercise 12: The radix tree\n\n**Difficulty:** Hard\n",
    )
    ex = find_exercise(tmp_path, 12)
    assert (ex.title, ex.difficulty, ex.judge_command) == (
        "The radix tree",
        "hard",
        "python practice/judge.py 12",
    )


def test_notebook_macro_links_relative_to_the_page(project):
    out = render(project, "Get @@notebook@@.")
    assert "(../notebooks/ch07_demo.ipynb)" in out.text


def test_chapters_and_practice_tables(project):
    ctx = Context(root=project, repo_url=REPO, page="chapters.md")
    out = expand("@@chapters@@\n\n@@practice@@", ctx)
    assert out.errors == []
    assert (
        "| 7 | [A demo chapter](chapters/ch07_demo.md) | 2 | `examples/ch07_demo.py` | 191 |"
        in out.text
    )
    assert "| 191 | [PrefillAdder: admission control]" in out.text


def test_the_practice_table_is_in_chapter_order(project):
    write(
        project / "chapters" / "ch05_early" / "chapter.toml", 'title = "Early"\nexercises = [281]\n'
    )
    write(
        project / "practice" / "exercises" / "281_cache" / "problem.md",
        '+++\ntitle = "A later id in an earlier chapter"\nchapter = 5\n+++\n',
    )
    out = expand("@@practice@@", Context(root=project, repo_url=REPO, page="judge.md"))
    assert out.errors == [], out.errors
    ids = [line.split("|")[1].strip() for line in out.text.splitlines()[2:]]
    assert ids == ["281", "191"]


# ------------------------------------------------------------------ the mkdocs build


def _mkdocs_project(project: Path) -> Path:
    (project / "docs" / "index.md").write_text("# Home\n\n@@chapters@@\n", encoding="utf-8")
    (project / "docs" / "chapters.md").write_text("# Chapters\n", encoding="utf-8")
    config = project / "mkdocs.yml"
    config.write_text(
        textwrap.dedent(f"""\
        site_name: test book
        repo_url: {REPO}
        docs_dir: docs
        site_dir: site
        hooks:
          - {ROOT / "mkdocs_hooks.py"}
        exclude_docs: |
          upstream_index.json
        nav:
          - Home: index.md
          - Chapters: chapters.md
        theme:
          name: mkdocs
        markdown_extensions:
          - attr_list
          - admonition
          - pymdownx.superfences
          - pymdownx.emoji
        """),
        encoding="utf-8",
    )
    return config


def test_mkdocs_strict_build_renders_chapters_and_fails_on_a_broken_macro(project):
    pytest.importorskip("mkdocs")
    pytest.importorskip("jupytext")
    config = _mkdocs_project(project)
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(config)]
    ok = subprocess.run(cmd, capture_output=True, text=True, cwd=project)
    assert ok.returncode == 0, ok.stderr
    page = (project / "site" / "chapters" / "ch07_demo" / "index.html").read_text(encoding="utf-8")
    assert "minisgl/demo.py · Adder.left" in page and "#L25-L27" in page
    assert (project / "site" / "notebooks" / "ch07_demo.ipynb").is_file()
    demo = project / "minisgl" / "demo.py"
    demo.write_text(DEMO.replace("def left(", "def remaining("), encoding="utf-8")
    broken = subprocess.run(cmd, capture_output=True, text=True, cwd=project)
    assert broken.returncode != 0
    assert "chapters/ch07_demo.md (chapter 7): @@code minisgl/demo.py:Adder.left@@" in broken.stderr


# ------------------------------------------------------------------ notebooks


def test_split_main_at_top_level_statement_runs_and_percent_markers():
    from tools.notebooks import split_main

    cells = split_main(MAIN)
    assert cells[0] == ("markdown", "Chapter 7: a demo main.")
    assert [c for k, c in cells if k == "code"] == [
        "import sys\n\nfrom minisgl.demo import helper",
        '# the answer, computed\nx = helper(41)\nprint("answer", x)',
        "for i in range(2):\n    print(i)",
    ]
    percent = split_main("# %%\nimport os\n\n# %% [markdown]\n# Hello\n\n# %%\nprint(os.sep)\n")
    assert [k for k, _ in percent] == ["code", "markdown", "code"]


def test_notebook_puts_the_main_where_the_prose_shows_it(project):
    import nbformat

    from tools.notebooks import build_notebook

    write(
        project / "chapters" / "ch07_demo" / "chapter.md",
        """\
        # A demo chapter

        ??? answer "Answer"
            Because.

        ## Running it

        @@code examples/ch07_demo.py@@

        ## What it prints

        @@output ch07_demo@@
        """,
    )
    errors: list = []
    nb = build_notebook(project, load_chapters(project)[0], REPO, errors)
    nbformat.validate(nb)
    assert errors == []
    kinds = [c.cell_type for c in nb.cells]
    assert kinds[0] == "code" and "os.chdir(ROOT)" in nb.cells[0].source
    assert any("<details><summary>Answer</summary>" in c.source for c in nb.cells)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert "x = helper(41)" in "\n".join(code)
    assert not any(MAIN_CELLS in c.source for c in nb.cells)
    last = nb.cells[-1].source
    assert last.startswith("## What it prints") and "answer 42" in last


def test_notebook_executes_with_nbclient(project, tmp_path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from tools.notebooks import main

    write(
        project / "chapters" / "ch07_demo" / "chapter.md",
        "# Demo\n\n@@code examples/ch07_demo.py@@\n",
    )
    out = tmp_path / "nb"
    assert (
        main(["--root", str(project), "--out", str(out), "--execute", "ch07", "--timeout", "60"])
        == 0
    )
    nb = json.loads((out / "ch07_demo.ipynb").read_text(encoding="utf-8"))
    printed = "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))
    assert "answer 42" in printed


def test_notebook_execute_fails_when_a_cell_raises(project, tmp_path, monkeypatch, capsys):
    nbclient = pytest.importorskip("nbclient")
    import tools.notebooks as notebooks

    def boom(path, root, timeout):
        raise nbclient.exceptions.CellExecutionError("SystemError: boom", "SystemError", "boom")

    monkeypatch.setattr(notebooks, "execute", boom)  # a real kernel run is the test above
    args = ["--root", str(project), "--out", str(tmp_path / "nb"), "--execute", "ch07"]
    assert notebooks.main(args) == 1
    assert "ch07_demo failed while executing" in capsys.readouterr().err


# ------------------------------------------------------------------ outputs


def test_outputs_capture_check_and_nondeterministic_marker(project, capsys):
    from tools.outputs import discover, main

    write(
        project / "examples" / "timing.py",
        """\
        # capture-output
        # output: mask \\d+\\.\\d+ s
        import time
        print("took", f"{time.perf_counter() % 1:.4f} s")
        """,
    )
    write(
        project / "examples" / "noisy.py",
        "# capture-output\n# output: nondeterministic\nimport random\nprint(random.random())\n",
    )
    write(project / "examples" / "ignored.py", "print('not captured')\n")
    found = {e.name: e for e in discover(project)}
    assert set(found) == {"ch07_demo", "timing", "noisy"}
    assert not found["noisy"].deterministic and found["timing"].masks == [r"\d+\.\d+ s"]
    root = ["--root", str(project)]
    assert main(root) == 0
    assert (project / "outputs" / "ch07_demo.txt").read_text() == "answer 42\n0\n1\n"
    assert main(root + ["--check"]) == 0  # the masked timing and the skipped noise pass
    (project / "outputs" / "ch07_demo.txt").write_text("answer 41\n0\n1\n", encoding="utf-8")
    capsys.readouterr()
    assert main(root + ["--check"]) == 1
    out, err = capsys.readouterr()
    assert "-answer 41" in out and "+answer 42" in out and "outputs/ch07_demo.txt" in err


# ------------------------------------------------------------------ upstream index


def test_upstream_index_records_only_line_numbers(tmp_path):
    from tools.upstream_index import build_index, dumps

    git = (
        shutil.which("git") or "git"
    )  # the book is cloned with git: its absence is an error, not a skip
    write(
        tmp_path / "python" / "minisgl" / "core.py", "class Req:\n    def go(self):\n        pass\n"
    )
    run = lambda *a: subprocess.run([git, "-C", str(tmp_path), *a], check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    run("add", ".")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    index = build_index(tmp_path)
    assert index["files"] == {"core.py": {"Req": [1, 3], "Req.go": [2, 3]}}
    assert len(index["commit"]) == 40
    assert json.loads(dumps(index)) == index


def test_committed_upstream_index_is_pinned_and_has_the_seed_symbols():
    index = json.loads((ROOT / "docs" / "upstream_index.json").read_text(encoding="utf-8"))
    assert len(index["commit"]) == 40
    sched = index["files"]["scheduler/scheduler.py"]
    assert sched["Scheduler.normal_loop"] == [108, 118]
    assert index["files"]["scheduler/decode.py"]["DecodeManager"] == [9, 39]
    spans = [s for f in index["files"].values() for s in f.values()]
    assert all(isinstance(a, int) and isinstance(b, int) and a <= b for a, b in spans)
