"""The site's source browser: every file of the engine, the mains, the tests and the benchmarks as
a page with line anchors, in each chapter's version.

The mkdocs hook generates, at build time and from the current source,

* `source/<path>.md` for every `.py` file under `minisgl/`, `examples/`, `tests/` and
  `benchmarks/` (the folders whose code the chapters show): the whole file
  as one listing whose lines carry the anchors `#L1`, `#L2`, ..., headed by the chapters
  that introduce, modify and show it. Its URL is `source/<path>/`, e.g.
  `source/minisgl/scheduler/scheduler.py/#L120-L140`; assets/listings.js marks such a range.
* `source/chNN/<path>.md` for each earlier version of a file (tools/docs/versioned.py), NN
  the first chapter that leaves it so; every version's page links the others.
* `source/index.md`: every file, folder by folder, with its size and its chapter; and
  `source/chNN/index.md` per chapter: its tree, each file linked to the version it shows.

Every `@@code path:Symbol@@` excerpt links to its lines here (tools/docs/macros.py), so the
links work offline, in `site/` and under `mkdocs serve`.
"""

from __future__ import annotations

import posixpath
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from tools.docs.chapters import Chapter
from tools.docs.versioned import SOURCE_DIRS, SourceVersions, Version

INDEX_URI = "source/index.md"
_IGNORED = {"__pycache__"}
_CODE_MACRO = re.compile(r"@@code[ \t]+([^:@\s]+)")
# the anchor pymdownx.highlight writes into each line of a listing (anchor_linenums: true)
_LINE_ANCHOR = re.compile(
    r'<a id="__codelineno-\d+-(\d+)" name="__codelineno-\d+-\1" href="#__codelineno-\d+-\1"></a>'
)


def source_files(root: Path) -> List[str]:
    """Every `.py` file under the `SOURCE_DIRS`, as sorted repository paths."""
    found: List[str] = []
    for folder in SOURCE_DIRS:
        base = root / folder
        if base.is_dir():
            found += [
                p.relative_to(root).as_posix()
                for p in base.rglob("*.py")
                if p.is_file() and not _IGNORED & set(p.parts)
            ]
    return sorted(found)


def page_uri(path: str) -> str:
    """The docs-tree page of a repository file: `minisgl/core.py` -> `source/minisgl/core.py.md`."""
    return f"source/{path}.md"


def chapter_index_uri(n: int) -> str:
    """The page listing chapter ``n``'s tree: `source/ch07/index.md`."""
    return f"source/ch{n:02d}/index.md"


def is_source_page(uri: str) -> bool:
    return uri.startswith("source/") and uri.endswith(".py.md")


def version_nav(versions: List[Version], current: Version, base: str) -> str:
    """`Chapters 7-8 · 9 · 10 · **11-17** · 18-22 · 23`: the file's versions, each linked."""
    parts = []
    for v in versions:
        label = f"{v.first}" if v.first == v.last else f"{v.first}-{v.last}"
        if v == current:
            parts.append(f"**{label}**")
        else:
            parts.append(f"[{label}]({posixpath.relpath(v.uri, base)})")
    return "As the chapters leave it: " + " · ".join(parts)


def line_fragment(lines: Optional[tuple]) -> str:
    """`#L120-L140` for lines 120..140, `#L7` for one line, "" for the whole file."""
    if not lines:
        return ""
    start, end = lines
    return f"#L{start}" if start == end else f"#L{start}-L{end}"


def anchor_lines(html: str) -> str:
    """Give a source page's lines the anchors `L<n>`, their numbers shown by extra.css."""
    return _LINE_ANCHOR.sub(r'<a id="L\1" class="lineno" href="#L\1" data-line="\1"></a>', html)


@dataclass
class FileChapters:
    """Which chapters a file belongs to: introduced, explained (when brought in early),
    modified, and shown (a `@@code@@` excerpt of it in the prose)."""

    introduced: Optional[int] = None
    explained: Optional[int] = None
    modified: List[int] = field(default_factory=list)
    shown: List[int] = field(default_factory=list)


def file_chapters(
    chapters: List[Chapter], versions: Optional[SourceVersions] = None
) -> Dict[str, FileChapters]:
    """Map each repository path the manifests or the prose name to its `FileChapters`;
    ``versions`` gives the chapters that change a file (a version of its own)."""
    table: Dict[str, FileChapters] = defaultdict(FileChapters)
    for ch in chapters:
        m = ch.manifest
        for path in [*m.get("new", []), *([ch.main] if ch.main else []), *m.get("extra_mains", [])]:
            if table[path].introduced is None:
                table[path].introduced = ch.number
        for path, early in (m.get("early") or {}).items():
            if table[path].introduced is None:
                later = early["chapter"] if isinstance(early, dict) else early
                table[path].introduced, table[path].explained = ch.number, int(later)
        if ch.prose_path.is_file():
            for path in sorted(set(_CODE_MACRO.findall(ch.prose_path.read_text(encoding="utf-8")))):
                table[path].shown.append(ch.number)
    if versions is not None:
        for path in list(table):
            if path.endswith(".py") and (versions.root / path).is_file():
                table[path].modified = [v.first for v in versions.versions(path)[1:]]
    return dict(table)


def _chapter_link(ch: Chapter, base: str) -> str:
    return f"[chapter {ch.number}]({posixpath.relpath(ch.page_uri, base)})"


def _about(info: Optional[FileChapters], by_number: Dict[int, Chapter], base: str) -> str:
    if info is None:
        return "No chapter introduces this file."

    def link(n: int) -> str:
        return _chapter_link(by_number[n], base) if n in by_number else f"chapter {n}"

    parts: List[str] = []
    if info.introduced is not None:
        ch = by_number.get(info.introduced)
        title = f" ({ch.title})" if ch else ""
        parts.append(f"Introduced in {link(info.introduced)}{title}")
        if info.explained is not None:
            parts[-1] += f", brought in early and explained in {link(info.explained)}"
    if info.modified:
        parts.append("modified in " + ", ".join(link(n) for n in info.modified))
    if info.shown:
        parts.append("shown in " + ", ".join(link(n) for n in info.shown))
    return ("; ".join(parts) + ".") if parts else "No chapter introduces this file."


def _fence(source: str) -> str:
    longest = max((len(m) for m in re.findall(r"^[ \t]*(`{3,})", source, re.M)), default=0)
    return "`" * max(3, longest + 1)


def render_page(
    root: Path,
    path: str,
    info: Optional[FileChapters],
    by_number: Dict[int, Chapter],
    text: Optional[str] = None,
    uri: Optional[str] = None,
    versions: Optional[List[Version]] = None,
) -> str:
    """The markdown of a source page (`uri`, default `source/<path>.md`): a header naming its
    chapters and its versions, then the whole of `text` (default: the file)."""
    source = (text if text is not None else (root / path).read_text(encoding="utf-8")).rstrip("\n")
    uri = uri or page_uri(path)
    base = posixpath.dirname(uri)
    count = source.count("\n") + 1 if source else 0
    fence = _fence(source)
    index = posixpath.relpath(INDEX_URI, base)
    current = next((v for v in versions or [] if v.uri == uri), None)
    title = (
        f"{path} · chapter {current.first}" if current and current.uri != page_uri(path) else path
    )
    nav = (
        [version_nav(versions, current, base), "{ .source-versions }", ""]
        if versions and len(versions) > 1 and current
        else []
    )
    return "\n".join(
        [
            "---",
            "search:",
            "  exclude: true",
            "hide:",
            "  - toc",
            "---",
            "",
            f"# {title}",
            "",
            f"{_about(info, by_number, base)} {count} lines · [all source files]({index})",
            "{ .source-meta }",
            "",
            *nav,
            '<div class="source-listing" markdown>',
            "",
            f"{fence}python",
            source,
            fence,
            "",
            "</div>",
            "",
        ]
    )


def render_index(
    root: Path, files: List[str], table: Dict[str, FileChapters], by_number: Dict[int, Chapter]
) -> str:
    """`source/index.md`: each chapter's tree, then one table per folder, each file linked to
    its page."""
    trees = " · ".join(
        f"[{n}]({posixpath.relpath(chapter_index_uri(n), 'source')})" for n in sorted(by_number)
    )
    lines = [
        "# Source code",
        "",
        "Every file of the engine (`minisgl/`), the chapters' mains (`examples/`), the tests"
        " (`tests/`) and the benchmarks (`benchmarks/`), as it is in this build of the book:"
        " the engine as the last chapter leaves it. The link under every code excerpt in the"
        " chapters opens its lines in the version that chapter shows.",
        "",
        f"The tree as a chapter leaves it: {trees}",
        "{ .source-versions }",
        "",
    ]
    by_folder: Dict[str, List[str]] = defaultdict(list)
    for path in files:
        by_folder[posixpath.dirname(path)].append(path)
    for folder in sorted(by_folder):
        lines += [f"## {folder}/", "", "| File | Lines | Chapter |", "|---|---|---|"]
        for path in by_folder[folder]:
            text = (root / path).read_text(encoding="utf-8")
            info = table.get(path)
            chapter = ""
            if info is not None and info.introduced in by_number:
                chapter = _chapter_link(by_number[info.introduced], "source")
            name = posixpath.basename(path)
            lines.append(
                f"| [`{name}`]({posixpath.relpath(page_uri(path), 'source')}) "
                f"| {text.count(chr(10))} | {chapter} |"
            )
        lines.append("")
    return "\n".join(lines)


def render_chapter_index(
    sv: SourceVersions, n: int, files: List[str], by_number: Dict[int, Chapter]
) -> str:
    """`source/chNN/index.md`: chapter ``n``'s tree, folder by folder, each file linked to the
    version it shows, with its line count there."""
    base = posixpath.dirname(chapter_index_uri(n))
    ch = by_number.get(n)
    title = f"[chapter {n}]({posixpath.relpath(ch.page_uri, base)})" if ch else f"chapter {n}"
    lines = [
        f"# Source as chapter {n} leaves it",
        "",
        f"Every file of {title}'s tree, in the version that chapter leaves it; the other "
        f"chapters' trees are on the [index]({posixpath.relpath(INDEX_URI, base)}).",
        "",
    ]
    by_folder: Dict[str, List[str]] = defaultdict(list)
    for path in files:
        if sv.has(path, n):
            by_folder[posixpath.dirname(path)].append(path)
    for folder in sorted(by_folder):
        lines += [f"## {folder}/", "", "| File | Lines |", "|---|---|"]
        for path in by_folder[folder]:
            text = sv.text(path, n)
            link = posixpath.relpath(sv.uri(path, n), base)
            lines.append(f"| [`{posixpath.basename(path)}`]({link}) | {text.count(chr(10))} |")
        lines.append("")
    return "\n".join(lines)
