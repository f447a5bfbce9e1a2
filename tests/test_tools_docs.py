"""The book's site machinery: the @@macro@@ resolver, outputs capture, notebooks, upstream index.

Every test builds a small repository in a temp folder, so none depends on the engine or the
chapters being written yet. The one mkdocs build (strict, twice) is the slowest, ~3 s.
"""

from __future__ import annotations

import json
import re
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
    # the site's own source page, never the repository: the link works offline
    assert "(../source/minisgl/demo.py.md#L12-L14){ .code-link }" in out.text
    assert "lines 12–14" in out.text and "github" not in out.text


def test_code_macro_without_symbol_shows_the_whole_file(project):
    out = render(project, "@@code examples/ch07_demo.py@@")
    assert out.errors == []
    assert 'title="examples/ch07_demo.py"' in out.text and 'print("answer", x)' in out.text
    assert "(../source/examples/ch07_demo.py.md){ .code-link }" in out.text


def test_code_links_outside_the_source_browser_need_a_configured_repository(project):
    write(project / "tools" / "helper.py", "def f():\n    pass\n")
    chapter = load_chapters(project)[0]
    bare = Context(root=project, page="chapters/ch07_demo.md", chapter=chapter)
    out = expand("@@code tools/helper.py:f@@", bare)
    assert out.errors == [] and "](" not in out.text and "tools/helper.py, lines 1–2" in out.text
    with_repo = expand("@@code tools/helper.py:f@@", ctx_for(project))
    assert f"]({REPO}/blob/main/tools/helper.py#L1-L2)" in with_repo.text


def test_notebook_code_links_are_repository_paths_unless_a_repository_is_configured(project):
    chapter = load_chapters(project)[0]
    ctx = Context(root=project, page="x", chapter=chapter, mode="notebook")
    out = expand("@@code minisgl/demo.py:cached@@", ctx)
    assert "[minisgl/demo.py, lines 12–14](../minisgl/demo.py)" in out.text
    out = render(project, "@@code minisgl/demo.py:cached@@", mode="notebook")
    assert f"]({REPO}/blob/main/minisgl/demo.py#L12-L14)" in out.text


def test_clone_macro_names_the_repository_only_when_configured(project):
    assert (
        render(project, "Get it: @@clone@@.").text
        == f"Get it: `git clone {REPO} mini-sglang-from-scratch`."
    )
    bare = Context(root=project, page="setup.md")
    assert "<" not in expand("Get it: @@clone@@.", bare).text


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
    assert (
        "the tree of chapter 7" in error and "early file 'minisgl/later.py' needs a table" in error
    )


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
    rows = [line for line in out.text.splitlines()[2:] if line.startswith("|")]
    ids = [row.split("|")[1].strip() for row in rows]
    assert ids == ["281", "191"]


def test_every_chapter_with_practice_problems_links_them():
    """A chapter whose manifest lists exercises shows them (and their judge commands) with
    ``@@exercises@@``: nothing else fails when a page being shortened loses the macro."""
    missing = [
        ch.key
        for ch in load_chapters(ROOT)
        if ch.exercises and "@@exercises@@" not in ch.prose_path.read_text(encoding="utf-8")
    ]
    assert missing == []


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


def test_mkdocs_strict_build_fails_on_a_wrong_symbol_and_a_wrong_chapter_number(project):
    """The docs check (tools/docs/prose_check.py) runs inside the strict build."""
    pytest.importorskip("mkdocs")
    config = _mkdocs_project(project)
    prose = project / "chapters" / "ch07_demo" / "chapter.md"
    prose.write_text(
        "# A demo chapter\n\n`Adder.left` counts down; `Adder.lefty` does not exist.\n\n"
        "Chapter 7 is this one; chapter 14 is not written.\n",
        encoding="utf-8",
    )
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(config)]
    broken = subprocess.run(cmd, capture_output=True, text=True, cwd=project)
    assert broken.returncode != 0
    assert (
        "prose check: chapters/ch07_demo.md line 3: `Adder.lefty`: Adder has no attribute"
        " 'lefty'; did you mean Adder.left?" in broken.stderr
    )
    assert "chapters/ch07_demo.md line 5: 'chapter 14': there is no chapter 14" in broken.stderr
    assert "Adder.left`:" not in broken.stderr and "'Chapter 7'" not in broken.stderr


# ------------------------------------------------------------------ the docs check

PROSE_DEMO = """\
class Base:
    def shared(self) -> None:
        self.count = 0


class Adder(Base):
    def add(self) -> None:
        self.total = 1


ADDER = Adder()
"""


@pytest.fixture
def checker(project):
    from tools.docs.prose_check import Checker

    write(project / "minisgl" / "sums.py", PROSE_DEMO)
    write(
        project / "chapters" / "ch15_server" / "chapter.toml",
        'title = "An OpenAI-compatible API server"\nstage = 3\nmain = "examples/ch07_demo.py"\n',
    )
    return Checker.for_root(project, {"files": {"scheduler/scheduler.py": {}}})


def findings(checker, text: str) -> list:
    return [f.split(": ", 1)[1] for f in checker.check(textwrap.dedent(text), "page.md")]


def test_docs_check_resolves_methods_inherited_and_instance_attributes(checker):
    ok = """\
        `Adder.add`, `Adder.total`, `Adder.shared()`, `Adder.count`, `ADDER.total`,
        `minisgl.sums.Adder.add`, `sums.ADDER`, `Adder.Inner.go` and `demo.helper(41)`.
        Not ours: `torch.cuda.synchronize`, `self.nope`, `engine.add` (a variable), `x.y`.
        """
    assert findings(checker, ok) == []
    assert findings(checker, "`Adder.ad` and `sums.Addr`") == [
        "`Adder.ad`: Adder has no attribute 'ad'; did you mean Adder.add?",
        "`sums.Addr`: module minisgl.sums has no name 'Addr'; did you mean Adder?",
    ]
    assert findings(checker, "`ADDER.missing`") == [
        "`ADDER.missing`: Adder has no attribute 'missing'"
    ]


def test_docs_check_finds_missing_files_and_skips_generated_ones(checker):
    ok = "`minisgl/sums.py`, `sums.py`, `demo.py`, `examples/`, `models/tiny-qwen3/`, `tok/s`"
    assert findings(checker, ok) == []
    assert findings(checker, "`minisgl/summs.py` and `gone.py`") == [
        "`minisgl/summs.py`: no such file in the repository (nor under minisgl/)",
        "`gone.py`: no Python file of the repository has that name",
    ]
    upstream = "`python/minisgl/scheduler/scheduler.py`, `python/minisgl/scheduler/x.py`"
    assert findings(checker, upstream) == [
        "`python/minisgl/scheduler/x.py`: upstream has no python/minisgl/scheduler/x.py at the"
        " pinned commit"
    ]


def test_docs_check_ties_a_chapters_topic_to_its_number(checker):
    ok = "The server of chapter 15, chapter 15's server, chapters 7 and 15, the adder (chapter 7)."
    assert findings(checker, ok) == []
    assert findings(checker, "the server of chapter 7, then chapters 7–9") == [
        "'server ... chapter 7': the server is chapter 15's (An OpenAI-compatible API server),"
        " not chapter 7's (A demo chapter)",
        "'chapters 7–9': there is no chapter 8",
    ]
    assert findings(checker, "in the server (chapter 7)")[0].startswith("'server ... chapter 7'")


def test_docs_check_skips_code_blocks_macros_and_upstreams_names(checker):
    text = """\
        ```python
        Adder.nope  # chapter 99
        ```

        @@code minisgl/sums.py:Adder.nope@@

        ## How upstream does it

        Upstream calls `Adder.pad_batch` from `python/minisgl/scheduler/scheduler.py`.

        ## Tests

        `Adder.nope`
        """
    assert findings(checker, text) == ["`Adder.nope`: Adder has no attribute 'nope'"]


def test_docs_check_allowances_need_a_reason(tmp_path):
    from tools.docs.prose_check import ALLOW_FILE, load_allowances

    bad = write(tmp_path / "allow.toml", '[[allow]]\npage = "a.md"\ntext = "x"\n')
    with pytest.raises(ValueError, match="needs a reason"):
        load_allowances(bad)
    assert all(a.reason for a in load_allowances(ALLOW_FILE))


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


def test_notebook_runs_each_part_after_its_section_and_embeds_images(project):
    from tools.notebooks import build_notebook

    write(
        project / "chapters" / "ch07_demo" / "chapter.md",
        """\
        # A demo chapter

        The lead.

        ## The parts

        ### Adding

        ![the adder](../assets/adder.svg)

        @@code minisgl/demo.py:Adder@@

        ### Helping

        Text.
        """,
    )
    write(project / "docs" / "assets" / "adder.svg", "<svg/>")
    write(
        project / "chapters" / "ch07_demo" / "notebook.py",
        """\
        # the cells that run chapter 7's parts

        # %%
        from minisgl.demo import Adder, helper

        # %% part="Helping"
        print(helper(1))

        # %% part="Adding"
        print(Adder(3).left)
        """,
    )
    errors: list = []
    nb = build_notebook(project, load_chapters(project)[0], REPO, errors)
    assert errors == []
    heads = [c.source.split("\n")[0] for c in nb.cells]
    assert heads[1:] == [
        "# A demo chapter",
        "## The parts",
        "from minisgl.demo import Adder, helper",  # the set-up, before the first part
        "### Adding",
        "print(Adder(3).left)",
        "### Helping",
        "print(helper(1))",
        "## Run the chapter's main: `examples/ch07_demo.py`",
        "Chapter 7: a demo main.",
        "import sys",
        "# the answer, computed",
        "for i in range(2):",
    ]
    adding = nb.cells[4]
    assert "![the adder](attachment:adder.svg)" in adding.source
    assert adding.attachments["adder.svg"] == {"image/svg+xml": "PHN2Zy8+"}  # base64 of <svg/>

    (project / "chapters" / "ch07_demo" / "notebook.py").write_text(
        '# %% part="Subtracting"\nprint(1)\n', encoding="utf-8"
    )
    build_notebook(project, load_chapters(project)[0], REPO, errors)
    assert "part 'Subtracting' is no heading of the chapter" in errors[0]


def test_a_main_that_starts_processes_runs_as_a_script_cell(project):
    from tools.notebooks import build_notebook

    main = project / "examples" / "ch07_demo.py"
    main.write_text(MAIN + '\n\nif __name__ == "__main__":\n    print("spawned")\n', "utf-8")
    nb = build_notebook(project, load_chapters(project)[0], REPO)
    code = [c.source for c in nb.cells if c.cell_type == "code"][1:]
    assert len(code) == 1 and '[sys.executable, "examples/ch07_demo.py"]' in code[0]


def test_notebook_outputs_are_kept_and_given_back_while_the_code_above_is_unchanged(project):
    import nbformat

    from tools import notebook_outputs

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("print(x)")]
    nb.cells[1].outputs = [
        nbformat.v4.new_output("stream", name="stderr", text="[12:00:01 INFO] /home/me/x\n"),
        nbformat.v4.new_output("stream", name="stdout", text="1\n"),
    ]
    nb.cells[1].execution_count = 2
    notebook_outputs.save(project, "ch07_demo", nb)
    fresh = nbformat.v4.new_notebook()
    fresh.cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("print(x)")]
    assert notebook_outputs.attach(project, "ch07_demo", fresh) == 1
    assert [o.text for o in fresh.cells[1].outputs] == ["1\n"]  # the log line is not kept
    assert fresh.cells[1].execution_count == 2
    fresh.cells[0].source = "x = 2"  # a cell above changed: the stored output no longer holds
    fresh.cells[1].outputs = []
    assert notebook_outputs.attach(project, "ch07_demo", fresh) == 0


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


def test_every_float_mask_covers_an_exponent_of_either_sign():
    """A difference that comes out exactly 0 prints as ``0.0e+00``: a mask written for ``e-07``
    alone left ``--check`` failing on a machine whose sums came out exact (ch21_moe,
    stage4_milestone)."""
    from tools.outputs import discover

    pairs = (("2.6e-07", "0.0e+00"), ("9.98e-07", "0.00e+00"), ("3.0e-05", "0.0e+00"))
    for example in discover(ROOT):
        for pattern in example.masks:
            for small, zero in pairs:
                if re.search(pattern, f"= {small};"):
                    assert re.search(pattern, f"= {zero};"), (example.name, pattern, zero)


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
