"""Every chapter's version of the book's source, as the site shows it.

A chapter's listings (``@@code path:Symbol@@``) are cut from that chapter's version of the
file (``tools/versions.py``), the lines that chapter adds highlighted; each listing links to
the source browser's page of that version. A file gets one page per distinct version: the
last chapter's (the file itself) at ``source/<path>.md`` as before, every earlier one at
``source/chNN/<path>.md``, NN the first chapter that leaves the file that way; each page
names the chapters it serves and links the file's other versions. ``changes_page`` renders
what a chapter changed: the files it brings in, and the diff of every file it edits.
"""

from __future__ import annotations

import difflib
import posixpath
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from tools import versions
from tools.manifest import Manifest, load_manifests
from tools.version_checks import Book

# the infrastructure whose markers the step trees cut (tools/steps.py lists the same)
INFRASTRUCTURE = (
    "tests/__init__.py",
    "tests/conftest.py",
    "tests/helpers/__init__.py",
    "tests/helpers/models.py",
    "tests/helpers/reference.py",
)
CHANGES_URI = "changes/{key}.md"
SOURCE_DIRS = ("minisgl", "examples", "tests", "benchmarks")  # the source browser's folders


def is_source_file(path: str) -> bool:
    """Whether the source browser has a page for ``path``: its Python files."""
    return path.endswith(".py") and path.split("/", 1)[0] in SOURCE_DIRS


@dataclass(frozen=True)
class Version:
    """One distinct text of a file: it stands in chapters ``first..last``; ``uri`` is its
    source page (the final version's is the file's plain page)."""

    first: int
    last: int
    uri: str


def plain_uri(path: str) -> str:
    """The source page of a file as it is in the repository: ``source/<path>.md``."""
    return f"source/{path}.md"


class SourceVersions:
    """The chapter versions of the files the source browser shows (``minisgl/``, the mains,
    the tests): their texts, their pages and what each chapter changes."""

    def __init__(self, root: Path, manifests: Optional[List[Manifest]] = None) -> None:
        self.root = root
        self.manifests = manifests if manifests is not None else load_manifests(root)
        self.book = Book(self.manifests, root, list(INFRASTRUCTURE))

    @cached_property
    def numbers(self) -> List[int]:
        return [m.number for m in self.manifests]

    @cached_property
    def last(self) -> int:
        return self.numbers[-1]

    def has(self, path: str, n: int) -> bool:
        """Whether chapter ``n``'s tree holds ``path``."""
        first = self.book.introduced.get(path)
        return first is not None and first <= n and (self.root / path).is_file()

    def text(self, path: str, n: Optional[int]) -> str:
        """Chapter ``n``'s version of ``path`` (the file itself for None or a file no chapter
        versions)."""
        if n is None or not self.has(path, n):
            return (self.root / path).read_text(encoding="utf-8")
        return self.book.version(path, n)

    def versions(self, path: str) -> List[Version]:
        """The distinct versions of ``path``, in chapter order (one, the file, for a file no
        chapter brings in)."""
        return self._versions().get(path, [Version(self.last, self.last, plain_uri(path))])

    def uri(self, path: str, n: Optional[int]) -> str:
        """The source page of chapter ``n``'s version of ``path``."""
        if n is not None:
            for v in self.versions(path):
                if v.first <= n <= v.last:
                    return v.uri
        return plain_uri(path)

    def added_lines(self, path: str, n: int) -> List[int]:
        """Lines (1-based) of chapter ``n``'s version of ``path`` that chapter ``n`` adds to a
        file an earlier chapter brought in: its blocks and its marked lines."""
        if not path.endswith(".py") or self.book.introduced.get(path, n) >= n:
            return []
        text = self.book.text(path)
        chapters = versions.chapter_of_lines(text, path)
        return [
            k
            for k, line in enumerate(versions.source_lines(text, n, path), start=1)
            if chapters.get(line) == n
        ]

    def _versions(self) -> Dict[str, List[Version]]:
        if not hasattr(self, "_cache"):
            table: Dict[str, List[Version]] = {}
            for path, first in self.book.introduced.items():
                if not path.endswith(".py") or not (self.root / path).is_file():
                    continue
                groups: List[Tuple[int, int, str]] = []
                for n in [k for k in self.numbers if k >= first]:
                    text = self.book.version(path, n)
                    if groups and groups[-1][2] == text:
                        groups[-1] = (groups[-1][0], n, text)
                    else:
                        groups.append((n, n, text))
                final = self.book.text(path)
                table[path] = [
                    Version(
                        a, b, plain_uri(path) if text == final else f"source/ch{a:02d}/{path}.md"
                    )
                    for a, b, text in groups
                ]
            self._cache = table
        return self._cache

    # ---- what a chapter changes -------------------------------------------------------------
    def changes(self, n: int) -> Tuple[List[str], Dict[str, Tuple[str, str]]]:
        """The files chapter ``n`` brings in, and the earlier files it edits: path ->
        (the version before, chapter ``n``'s)."""
        i = self.numbers.index(n)
        prev = self.numbers[i - 1] if i else None
        new: List[str] = []
        edited: Dict[str, Tuple[str, str]] = {}
        for path in self.book.tree(n):
            if prev is None or path not in self.book.tree(prev):
                new.append(path)
            elif self.text(path, n) != self.text(path, prev):
                edited[path] = (self.text(path, prev), self.text(path, n))
        return new, edited


def changes_page(sv: SourceVersions, n: int, title: str, chapter_uri: str, page: str) -> str:
    """The markdown of chapter ``n``'s "What this chapter changed" page."""
    new, edited = sv.changes(n)
    here = posixpath.dirname(page)

    def link(path: str) -> str:
        if not is_source_file(path):  # the source browser shows Python files only
            return f"`{path}`"
        return f"[`{path}`]({posixpath.relpath(sv.uri(path, n), here)})"

    out = [
        f"# What chapter {n} changed",
        "",
        f"[{title}]({posixpath.relpath(chapter_uri, here)}): its tree against the one before, "
        "file by file: the files it brings in, then each earlier file it edits, as a diff "
        "(`+` lines are the chapter's, `-` lines it replaces).",
        "",
    ]
    engine_new = [p for p in new if p.startswith("minisgl/")]
    others = [p for p in new if not p.startswith("minisgl/")]
    out += [f"## New files ({len(engine_new)} in the engine)", ""]
    out += [f"- {link(p)}" for p in engine_new] or ["None."]
    if others:
        out += ["", "Its main, tests and helpers: " + ", ".join(link(p) for p in others) + "."]
    out += ["", f"## Edited files ({len(edited)})", ""]
    if not edited:
        out.append("None: this chapter only adds files.")
    engine_first = sorted(edited.items(), key=lambda kv: (not kv[0].startswith("minisgl/"), kv[0]))
    for path, (before, after) in engine_first:
        diff = list(
            difflib.unified_diff(
                before.split("\n"), after.split("\n"), lineterm="", n=3, fromfile=path, tofile=path
            )
        )[2:]
        added = sum(1 for d in diff if d.startswith("+"))
        removed = sum(1 for d in diff if d.startswith("-"))
        body = "\n".join(diff)
        fence = "`" * max(
            3, max((len(r) for r in body.split("\n") if set(r) == {"`"}), default=0) + 1
        )
        out += [
            f"### {link(path)}",
            "",
            f"{added} line{'s' if added != 1 else ''} added, {removed} removed.",
            "",
            f'{fence}diff title="{path}"',
            body,
            fence,
            "",
        ]
    return "\n".join(out).rstrip("\n") + "\n"
