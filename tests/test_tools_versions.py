"""tools.versions and tools.version_checks: the markers, each chapter's version, the checks.

The marker lines in these tests are built from pieces (``OPEN``, ``CLOSE``, ``PLUS``) so
that this file holds no marker of its own.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tools import version_checks, versions
from tools.docs.versioned import Version
from tools.manifest import load_manifests

OPEN, CLOSE, PLUS = "# >" + ">> ", "# <" + "<< ", "  # " + "+"


def src(text: str) -> str:
    return (
        textwrap.dedent(text).replace("OPEN ", OPEN).replace("CLOSE ", CLOSE).replace(" PLUS", PLUS)
    )


SCHEDULER = src("""\
    class Scheduler:
        def __init__(self):
            self.engine = 1
            OPEN ch11: overlap prepares metadata on a stream of its own
            self.stream = 2
            OPEN ch22: retraction
            self.retract = 3
            CLOSE ch22
            CLOSE ch11

        def prepare(self, batch):
            self.engine.pad(batch) PLUSch18
            return batch
    """)


def test_a_version_drops_the_blocks_and_lines_of_later_chapters():
    v7 = versions.version(SCHEDULER, 7)
    assert "stream" not in v7 and "retract" not in v7 and "pad" not in v7
    assert ">>>" not in v7 and "<<<" not in v7
    assert "self.engine = 1" in v7 and "return batch" in v7
    v11 = versions.version(SCHEDULER, 11)
    assert "self.stream = 2" in v11 and OPEN + "ch11" in v11
    assert "retract" not in v11 and "pad" not in v11
    v18 = versions.version(SCHEDULER, 18)
    assert "self.engine.pad(batch)" in v18 and "retract" not in v18


def test_the_last_chapters_version_is_the_file_byte_for_byte():
    assert versions.version(SCHEDULER, 22) == SCHEDULER
    assert versions.version(SCHEDULER, 30) == SCHEDULER


def test_a_replaced_block_is_code_in_its_chapters_and_a_comment_after():
    text = src("""\
        class Config:
            OPEN ch07-ch08: before the radix cache every prompt is computed whole
            # cache_type: str = "naive"
            #
            # page_size: int = 1
            CLOSE ch07-ch08
            OPEN ch09
            cache_type: str = "radix"
            CLOSE ch09
        """)
    v6 = versions.version(text, 6)
    assert "cache_type" not in v6 and "page_size" not in v6
    assert (
        versions.version(text, 7)
        == 'class Config:\n    cache_type: str = "naive"\n\n    page_size: int = 1\n'
    )
    assert versions.version(text, 8) == versions.version(text, 7)
    v9 = versions.version(text, 9)
    assert '# cache_type: str = "naive"' in v9 and 'cache_type: str = "radix"' in v9
    assert versions.version(text, 9) == text


@pytest.mark.parametrize(
    "bad, why",
    [
        ("OPEN ch18\nx = 1\n", "never closed"),
        ("x = 1\nCLOSE ch18\n", "never opened"),
        ("OPEN ch18\nx = 1\nCLOSE ch19\n", "closes ch19"),
        ("OPEN ch18\nx = 1\n    CLOSE ch18\n", "another indent"),
        ("OPEN ch18\nOPEN ch11\nx = 1\nCLOSE ch11\nCLOSE ch18\n", "already hides"),
        ("OPEN ch09-ch07\n# x = 1\nCLOSE ch09-ch07\n", "before it starts"),
        ("OPEN ch07-ch08\nx = 1\nCLOSE ch07-ch08\n", "are comments"),
        ("x = 1  # +ch 18\n", "looks like a marker"),
        ("# >>>ch18\n", "looks like a marker"),
        ("OPEN ch18\nx = 1 PLUSch11\nCLOSE ch18\n", "inside the ch18 block"),
    ],
)
def test_a_malformed_marker_is_refused_with_its_line(bad, why):
    with pytest.raises(versions.MarkerError, match=why) as e:
        versions.parse(src(bad), "f.py")
    assert str(e.value).startswith("f.py:")


def test_changes_in_names_the_chapters_a_file_changes_at():
    assert [n for n in range(25) if versions.changes_in(SCHEDULER, n)] == [11, 18, 22]


def test_later_chapters_are_found_in_words_lists_and_ids():
    text = "see chapter 7; chapters 17, 19 and 20 add kernels\n# ch. 18 pads; tests/test_ch22_x.py"
    found = {(line, c) for line, c, _ in version_checks.later_chapters_named(text, 17)}
    assert found == {(1, 19), (1, 20), (2, 18), (2, 22)}
    assert version_checks.later_chapters_named(text, 22) == []


def test_names_and_bindings():
    code = "class RetractManager:\n    def retract_decode(self): self.ratio_x = 1\nLIMIT_M = 4\nx = 2\n"
    assert version_checks.defined_names(code) == {"RetractManager", "retract_decode", "LIMIT_M"}
    assert {"RetractManager", "ratio_x", "x", "self"} <= version_checks.bound_names(code)
    assert not version_checks.distinctive("graph") and version_checks.distinctive("pad_batch")


# ---- the checks on a small fake book ------------------------------------------------------


def write(root: Path, rel: str, text: str) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)


def fake_book(root: Path, engine_text: str, extra_ch2: str = "") -> list:
    for n, slug, new in [
        (1, "core", ["minisgl/__init__.py", "minisgl/core.py"]),
        (2, "retraction", ["minisgl/retract.py"]),
    ]:
        write(
            root,
            f"chapters/ch{n:02d}_{slug}/chapter.toml",
            f'title = "t"\nstage = 1\nmain = "examples/ch{n:02d}_{slug}.py"\n'
            f"tests = []\nnew = {new!r}\n".replace("'", '"'),
        )
        write(root, f"examples/ch{n:02d}_{slug}.py", 'print("hi")\n')
    write(root, "minisgl/__init__.py", "")
    write(root, "minisgl/core.py", engine_text)
    write(root, "minisgl/retract.py", "class RetractManager:\n    pass\n" + extra_ch2)
    return load_manifests(root)


def test_an_honest_book_has_no_problems(tmp_path):
    text = src("""\
        def schedule():
            OPEN ch02: retraction frees pages first
            from minisgl.retract import RetractManager

            RetractManager()
            CLOSE ch02
            return 1
        """)
    assert version_checks.problems(fake_book(tmp_path, text), tmp_path) == []


def test_a_planted_later_chapter_line_fails_the_check(tmp_path):
    text = "def schedule():\n    # chapter 2 retracts here\n    return 1\n"
    found = version_checks.problems(fake_book(tmp_path, text), tmp_path)
    assert found == ["chapter 1's minisgl/core.py:2 names chapter 2 ('chapter 2')"]


def test_a_name_or_module_of_a_later_chapter_fails_the_check(tmp_path):
    text = 'def schedule():\n    """Calls ``RetractManager`` of minisgl.retract."""\n'
    found = version_checks.problems(fake_book(tmp_path, text), tmp_path)
    assert any("names 'RetractManager', which chapter 2 introduces" in p for p in found)
    assert any("names minisgl.retract, which chapter 2 brings in" in p for p in found)


def test_a_marker_of_the_files_own_chapter_or_of_no_chapter_fails(tmp_path):
    text = src("x = 1 PLUSch01\ny = 2 PLUSch05\n")
    found = version_checks.problems(fake_book(tmp_path, text), tmp_path)
    assert any("ch01 line in a file chapter 1 brings in" in p for p in found)
    assert any("names ch05, which is no chapter" in p for p in found)


def test_a_version_that_does_not_parse_fails(tmp_path):
    text = src("""\
        def schedule():
            OPEN ch02
            return 1
            CLOSE ch02
        """)
    found = version_checks.problems(fake_book(tmp_path, text), tmp_path)
    assert any("chapter 1's minisgl/core.py does not parse" in p for p in found)


def test_lint_finds_an_import_only_a_later_chapter_uses(tmp_path):
    text = src("""\
        from minisgl.retract import RetractManager PLUSch02


        def schedule():
            return RetractManager
        """)
    write(tmp_path, "pyproject.toml", "[tool.ruff]\nline-length = 100\n")
    book = version_checks.Book(fake_book(tmp_path, text), tmp_path)
    found = version_checks.lint_problems(book)
    assert found == ["chapter 1's minisgl/core.py:2: F821 Undefined name `RetractManager`"]
    tidy = src("""\
        def schedule():
            OPEN ch02
            from minisgl.retract import RetractManager

            RetractManager()
            CLOSE ch02
            return 1
        """)
    write(tmp_path, "minisgl/core.py", tidy)
    book = version_checks.Book(load_manifests(tmp_path), tmp_path)
    assert version_checks.lint_problems(book) == []


def test_the_site_shows_each_distinct_version_and_what_a_chapter_changed(tmp_path):
    from tools.docs.versioned import SourceVersions, changes_page

    text = src("""\
        def schedule():
            OPEN ch02: retraction frees pages first
            from minisgl.retract import RetractManager

            RetractManager()
            CLOSE ch02
            return 1
        """)
    sv = SourceVersions(tmp_path, fake_book(tmp_path, text))
    assert sv.versions("minisgl/core.py") == [
        Version(1, 1, "source/ch01/minisgl/core.py.md"),
        Version(2, 2, "source/minisgl/core.py.md"),
    ]
    assert sv.uri("minisgl/core.py", 1) == "source/ch01/minisgl/core.py.md"
    assert "RetractManager" not in sv.text("minisgl/core.py", 1)
    assert sv.added_lines("minisgl/core.py", 2) == [2, 3, 4, 5, 6]  # the block, markers too
    assert sv.added_lines("minisgl/core.py", 1) == []  # the chapter that brings the file in
    new, edited = sv.changes(2)
    assert new == ["minisgl/retract.py", "examples/ch02_retraction.py"]
    assert list(edited) == ["minisgl/core.py"]
    page = changes_page(sv, 2, "Retraction", "chapters/ch02_retraction.md", "changes/ch02.md")
    assert "+    from minisgl.retract import RetractManager" in page
    assert "[`minisgl/retract.py`](../source/minisgl/retract.py.md)" in page
