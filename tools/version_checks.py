"""Is every chapter's version honest? The static checks of ``python -m tools.steps check``.

For each chapter N and each file of its tree (``tools/manifest.py``), chapter N's version
(``tools/versions.py``) must

* have well-formed markers, each naming a chapter that exists and comes after the chapter
  that brings the file in (a marker of that chapter itself marks nothing);
* name no later chapter: no "chapter 22", "chapters 17 and 19", "ch. 18" or ``ch18_...``
  with a number above N, in code, comments or docstrings;
* name nothing a later chapter introduces: no identifier (in code, or in a comment or
  docstring as a ``name``, ``snake_case`` or ``CamelCase`` word) that only a later
  chapter's version defines, as a module, class, function, method, attribute or constant;
* parse, if it is Python.

And the last chapter's version of every file is the file, byte for byte. ``problems``
returns one sentence per failure; an empty list means every version is honest.
"""

from __future__ import annotations

import ast
import io
import json
import re
import subprocess
import tempfile
import tokenize
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

from tools import versions
from tools.manifest import ENGINE, Manifest

# "chapter 7", "Chapters 17, 19 and 20", "chapters 19-20", "ch. 18", "ch18_cuda_graph"
_NUMBER_LIST = r"\d+(?:(?:\s*(?:,|–|—|-|to|and|or|through)\s*|,\s*(?:and|or)\s+)\d+)*"
CHAPTER_WORDS = re.compile(rf"\b(?:[Cc]hapters?|[Cc]h\.)\s+({_NUMBER_LIST})")
CHAPTER_IDS = re.compile(r"(?<![A-Za-z0-9])ch(\d{2})(?!\d)")
# in comments and strings: `name`, ``name``, and bare words shaped like identifiers
_QUOTED = re.compile(r"`+([A-Za-z_][\w.]*)`+")
_SHAPED = re.compile(r"\b([a-z][a-z0-9]*(?:_[a-z0-9]+)+|[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+)\b")
VERSIONED_SUFFIXES = (".py",)


def later_chapters_named(text: str, n: int) -> List[tuple[int, int, str]]:
    """``(line, chapter, words)`` for each mention of a chapter after ``n`` in ``text``."""
    found = []
    for i, line in enumerate(text.split("\n"), start=1):
        for m in CHAPTER_WORDS.finditer(line):
            for number in re.findall(r"\d+", m.group(1)):
                if int(number) > n:
                    found.append((i, int(number), m.group(0)))
        for m in CHAPTER_IDS.finditer(line):
            if int(m.group(1)) > n:
                found.append((i, int(m.group(1)), m.group(0)))
    return found


@lru_cache(maxsize=None)  # a file's versions repeat across chapters: each text is read once
def defined_names(text: str) -> FrozenSet[str]:
    """The distinctive names a Python file defines at its top level or in a class body:
    classes, functions, methods and UPPER_CASE constants (``distinctive`` ones only: a
    local variable of an earlier chapter may share a plain word with them)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return frozenset()
    names: Set[str] = set()
    bodies = [tree.body] + [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    for body in bodies:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper())
    return frozenset(n for n in names if distinctive(n))


@lru_cache(maxsize=None)
def bound_names(text: str) -> FrozenSet[str]:
    """Every name a Python file binds, except by importing it: definitions, parameters,
    assignment targets (``self.attr`` included), loop, ``with`` and ``except`` names."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return frozenset()
    names: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
    return frozenset(names)


def distinctive(name: str) -> bool:
    """A name no plain word shares: ``snake_case`` with an inner underscore, ``CamelCase``
    with two capitals, or an ``UPPER_CASE`` constant; at least five characters."""
    if len(name) < 5 or (name.startswith("__") and name.endswith("__")):
        return False
    inner = name.strip("_")
    return "_" in inner or sum(c.isupper() for c in inner) >= 2


# a module of the engine named in prose: minisgl.kernel.triton, minisgl/scheduler/retract.py,
# models/fused_decode.py
MODULE_PATHS = re.compile(r"\b(minisgl(?:[./][A-Za-z_]\w*)+|(?:[A-Za-z_]\w*/)+[A-Za-z_]\w*\.py)\b")


def module_files(mention: str) -> List[str]:
    """The files a module mention could mean: ``minisgl.a.b`` -> ``minisgl/a/b.py`` and
    ``minisgl/a/b/__init__.py`` (and the same one level up, for ``module.symbol``)."""
    mention = mention.removesuffix(".py")
    parts = re.split(r"[./]", mention)
    if parts[0] != "minisgl":
        parts = ["minisgl", *parts]
    out = []
    for k in (len(parts), len(parts) - 1):
        if k >= 2:
            base = "/".join(parts[:k])
            out += [f"{base}.py", f"{base}/__init__.py"]
    return out


@lru_cache(maxsize=None)
def used_names(text: str) -> Tuple[Tuple[int, str], ...]:
    """``(line, name)`` for every identifier a Python file uses in code (an attribute only
    on ``self`` or ``cls``), and every identifier-shaped word of its comments and strings."""
    found: List[tuple[int, str]] = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return ()
    for k, tok in enumerate(tokens):
        if tok.type == tokenize.NAME:
            # an attribute counts on self or cls only: x.parse_args() is argparse's own
            dotted = k >= 2 and tokens[k - 1].string == "."
            if not dotted or tokens[k - 2].string in ("self", "cls"):
                found.append((tok.start[0], tok.string))
        elif tok.type in (tokenize.COMMENT, tokenize.STRING) or _is_fstring_part(tok):
            for offset, line in enumerate(tok.string.split("\n")):
                words = {w for q in _QUOTED.findall(line) for w in q.split(".")}
                words |= set(_SHAPED.findall(line))
                found += [(tok.start[0] + offset, w) for w in sorted(words)]
    return tuple(found)


def _is_fstring_part(tok: tokenize.TokenInfo) -> bool:
    return tokenize.tok_name.get(tok.type, "") in ("FSTRING_MIDDLE", "TSTRING_MIDDLE")


@dataclass
class Book:
    """The manifests and the files, read once, with every chapter's version on demand."""

    manifests: List[Manifest]
    root: Path
    infrastructure: List[str] = field(default_factory=list)  # versioned, in every tree
    _texts: Dict[str, str] = field(default_factory=dict)
    _versions: Dict[tuple[str, int], str] = field(default_factory=dict)
    _marks: Dict[str, versions.Marked] = field(default_factory=dict)

    @cached_property
    def numbers(self) -> List[int]:
        return [m.number for m in self.manifests]

    @cached_property
    def last(self) -> int:
        return self.numbers[-1]

    @cached_property
    def introduced(self) -> Dict[str, int]:
        """Every file of any tree -> the chapter whose tree has it first."""
        first: Dict[str, int] = {p: self.numbers[0] for p in self.infrastructure}
        for m in self.manifests:
            for p in m.tree_files:
                first.setdefault(p, m.number)
        return first

    def tree(self, n: int) -> List[str]:
        """The files of chapter ``n``'s tree that exist."""
        return [p for p, c in self.introduced.items() if c <= n and (self.root / p).is_file()]

    def text(self, path: str) -> str:
        if path not in self._texts:
            self._texts[path] = (self.root / path).read_text(encoding="utf-8")
        return self._texts[path]

    def marks(self, path: str) -> versions.Marked:
        if path not in self._marks:
            self._marks[path] = versions.parse(self.text(path), path)
        return self._marks[path]

    def version(self, path: str, n: int) -> str:
        """Chapter ``n``'s version of ``path`` (the text itself for unversioned files).

        Raises:
            MarkerError: for a file whose markers are malformed.
        """
        if not path.endswith(VERSIONED_SUFFIXES):
            return self.text(path)
        key = (path, n)
        if key not in self._versions:
            self._versions[key] = versions.version(self.text(path), n, path, self.marks(path))
        return self._versions[key]

    def first_defined(self) -> Dict[str, int]:
        """Every distinctive name the engine defines -> the first chapter whose version does
        (the mains and tests define helpers of their own, which no other chapter names)."""
        first: Dict[str, int] = {}
        for n in self.numbers:
            for path in self.tree(n):
                if path.startswith(ENGINE + "/") and path.endswith(".py"):
                    for name in defined_names(self.version(path, n)):
                        first.setdefault(name, n)
        return first


def problems(
    manifests: List[Manifest], root: Path, infrastructure: Iterable[str] = ()
) -> List[str]:
    """Every way a chapter's version is not honest, one sentence each (module docstring)."""
    book = Book(manifests, root, list(infrastructure))
    found: List[str] = []
    chapters = set(book.numbers)
    broken: Set[str] = set()
    for path, intro in book.introduced.items():
        if not path.endswith(VERSIONED_SUFFIXES) or not (root / path).is_file():
            continue
        try:
            marked = book.marks(path)
        except versions.MarkerError as e:
            found.append(str(e))
            broken.add(path)
            continue
        for b in marked.blocks:
            for c in [b.start] + ([b.until] if b.until is not None else []):
                if c not in chapters:
                    found.append(f"{path}:{b.first}: a marker names ch{c:02d}, which is no chapter")
            if b.until is None and b.start <= intro:
                found.append(
                    f"{path}:{b.first}: a ch{b.start:02d} block in a file chapter {intro} brings "
                    "in: the file has those lines from the start, drop the markers"
                )
            if b.until is not None and (b.start < intro or b.until >= book.last):
                found.append(
                    f"{path}:{b.first}: a replaced block lives in chapters {b.start}-{b.until}, "
                    f"outside chapters {intro}-{book.last - 1} of this file"
                )
        for line, c in marked.trailing.items():
            if c not in chapters:
                found.append(f"{path}:{line}: a marker names ch{c:02d}, which is no chapter")
            elif c <= intro:
                found.append(
                    f"{path}:{line}: a ch{c:02d} line in a file chapter {intro} brings in: "
                    "drop the marker"
                )

    first = book.first_defined()
    # a main that previews the finished engine runs against the full tree (``final_mains``)
    previews = {p for m in manifests for p in m.final_mains}
    for n in book.numbers:
        bound: Set[str] = set()
        for path in book.tree(n):
            if path.endswith(".py") and path not in broken:
                bound |= bound_names(book.version(path, n))
        for path in book.tree(n):
            if path in broken or path in previews:
                continue
            text = book.version(path, n)
            if path.endswith(".py"):
                try:
                    ast.parse(text)
                except SyntaxError as e:
                    found.append(f"chapter {n}'s {path} does not parse: line {e.lineno}: {e.msg}")
                    continue
            for line, c, words in later_chapters_named(text, n):
                found.append(f"chapter {n}'s {path}:{line} names chapter {c} ('{words}')")
            if path.endswith(".py"):
                seen: Set[str] = set()
                for line, name in used_names(text):
                    c = first.get(name)
                    if c is not None and c > n and name not in bound and name not in seen:
                        seen.add(name)
                        found.append(
                            f"chapter {n}'s {path}:{line} names {name!r}, which chapter {c} "
                            "introduces"
                        )
            for i, line in enumerate(text.split("\n"), start=1):
                for mention in MODULE_PATHS.findall(line):
                    files = [f for f in module_files(mention) if f in book.introduced]
                    if files and min(book.introduced[f] for f in files) > n:
                        c = min(book.introduced[f] for f in files)
                        found.append(
                            f"chapter {n}'s {path}:{i} names {mention}, which chapter {c} brings in"
                        )
    for path in book.introduced:
        if path.endswith(VERSIONED_SUFFIXES) and path not in broken and (root / path).is_file():
            if book.version(path, book.last) != book.text(path):
                found.append(f"{path}: the last chapter's version is not the file")
    return found


def lint_problems(book: Book) -> List[str]:
    """Every chapter's version of every Python file, linted (pyflakes: unused imports,
    undefined names) and format-checked with the project's ruff settings, each distinct text
    once. One sentence per finding, naming the first chapter whose version has it."""
    first: Dict[str, tuple[int, str]] = {}  # text -> (chapter, path)
    for n in book.numbers:
        for path in book.tree(n):
            if path.endswith(".py"):
                try:
                    text = book.version(path, n)
                except versions.MarkerError:
                    continue
                first.setdefault(text, (n, path))
    if not first:
        return []
    found: List[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        where: Dict[str, tuple[int, str]] = {}
        for k, (text, (n, path)) in enumerate(first.items()):
            f = Path(tmp, f"v{k}", path)
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text, encoding="utf-8")
            where[str(f)] = (n, path)
        config = ["--config", str(book.root / "pyproject.toml"), "--no-cache"]
        check = subprocess.run(
            ["ruff", "check", *config, "--select", "F", "--output-format", "json", tmp],
            capture_output=True,
            text=True,
        )
        for item in json.loads(check.stdout or "[]"):
            n, path = where[item["filename"]]
            line = item["location"]["row"]
            found.append(f"chapter {n}'s {path}:{line}: {item['code']} {item['message']}")
        fmt = subprocess.run(
            ["ruff", "format", *config, "--diff", tmp], capture_output=True, text=True
        )
        for line in fmt.stdout.splitlines():
            if line.startswith("--- ") and line[4:] in where:
                n, path = where[line[4:]]
                found.append(f"chapter {n}'s {path} is not formatted (ruff format)")
    return sorted(found)


def changed_files(book: Book, n: int) -> Dict[str, Optional[str]]:
    """The files chapter ``n`` changes -> their previous version (None for a new file)."""
    before = set(book.tree(n - 1)) if n > book.numbers[0] else set()
    out: Dict[str, Optional[str]] = {}
    for path in book.tree(n):
        if path not in before:
            out[path] = None
        elif book.version(path, n) != book.version(path, n - 1):
            out[path] = book.version(path, n - 1)
    return out
