"""The docs check: prose that names code, files or chapters must name ones that exist.

Run on every page by the mkdocs hook (tools/docs/hooks.py), so `mkdocs build --strict` fails
on a finding; `python -m tools.docs.prose_check` prints the findings of every page. Three
rules, each written to be precise rather than clever (a rule that cannot decide stays quiet):

* **Symbols.** An inline code span that is a dotted name whose head is an engine class
  (`Scheduler._process_last_data`), an engine module (`kernel.library_for`,
  `minisgl.scheduler.prefill.PrefillAdder`) or a module-level instance of an engine class
  (`ENV.DISABLE_OVERLAP_SCHEDULING`) must resolve: a class's attributes are its methods, its
  class-level names, the `self.x` it assigns and those of its engine base classes. A head
  that is a module name and also a common variable name (`engine.forward_batch`) is taken as
  a variable when the attribute exists on some engine class.
* **Files.** A span that is a repository path (`scheduler/cache.py`, `tests/test_ch07_scheduler.py`,
  `python/minisgl/...` upstream) must exist: at the root, under `minisgl/`, or in the pinned
  upstream index. Generated folders (`models/`, `build/`, `site/`, ...) are not checked.
* **Chapters.** Every "chapter N" / "chapters N and M" / "chapters N–M" must exist, and a
  reference that ties a chapter's topic to a chapter number ("the server of chapter 14",
  "chapter 14's server", "the server (chapter 14)") must name the chapter whose title has
  that word, when only one title has it (the manifests' titles say which chapter is which).

Code blocks and macros are skipped, and so is the "How upstream does it" section but for its
`python/minisgl/...` paths (upstream's names and its other files are not ours to check). Deliberate exceptions live in tools/docs/prose_allow.toml, each with its
reason.
"""

from __future__ import annotations

import ast
import difflib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import tomllib

from tools.docs.chapters import Chapter, load_chapters

ALLOW_FILE = Path(__file__).with_name("prose_allow.toml")
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
_MACRO = re.compile(r"@@[a-z][a-z_-]*(?:[ \t]+[^@\n]*?)?[ \t]*@@")
_DOTTED = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(\(.*\))?$")
_PATH = re.compile(r"^[\w.\-]+(?:/[\w.\-]+)*/?$")
_EXTENSIONS = (".py", ".md", ".toml", ".txt", ".json", ".sh", ".yml", ".yaml", ".ipynb", ".svg")
_GENERATED = ("models/", "build/", "site/", "notebooks/", "practice/workspace/", ".venv/")
_CHAPTER_REF = re.compile(
    r"\b[Cc]hapters?\s+(\d+(?:\s*(?:,\s*|\s+and\s+|\s+or\s+|\s*[–-]\s*|\s+to\s+)\d+)*)"
)
_NUMBER = re.compile(r"\d+")
_WORD = re.compile(r"[a-z][a-z0-9'-]*")
# words of chapter titles that name no topic of their own: every chapter's prose uses them
_STOPWORDS = set(
    "a an and the of by for from in into on one to with its their then every at as "
    "data step time hand start core custom interface control pool store table page worker "
    "gpu api tensor prefill scheduling decode between model layer backend metadata "
    "structure message processes cuda".split()
)
_UPSTREAM_SECTION = re.compile(r"^##\s+How upstream does it", re.I)


@dataclass
class ClassInfo:
    names: Set[str] = field(default_factory=set)
    bases: List[str] = field(default_factory=list)


@dataclass
class CodeIndex:
    """What the engine defines: modules with their names, classes with their attributes."""

    modules: Dict[str, Set[str]] = field(default_factory=dict)  # "minisgl.core" -> names
    classes: Dict[str, List[ClassInfo]] = field(default_factory=dict)  # "Req" -> definitions
    instances: Dict[str, str] = field(default_factory=dict)  # "ENV" -> "EnvClassSingleton"

    def class_names(self, cls: str, seen: Optional[Set[str]] = None) -> Set[str]:
        """Every attribute of the engine class `cls`, its engine base classes' included."""
        seen = seen if seen is not None else set()
        if cls in seen:
            return set()
        seen.add(cls)
        names: Set[str] = set()
        for info in self.classes.get(cls, []):
            names |= info.names
            for base in info.bases:
                names |= self.class_names(base, seen)
        return names

    def any_class_has(self, name: str) -> bool:
        return any(name in info.names for infos in self.classes.values() for info in infos)


def _class_info(node: ast.ClassDef) -> ClassInfo:
    info = ClassInfo()
    for base in node.bases:
        target = base.value if isinstance(base, ast.Subscript) else base
        if isinstance(target, ast.Name):
            info.bases.append(target.id)
        elif isinstance(target, ast.Attribute):
            info.bases.append(target.attr)
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            info.names.add(item.name)
        elif isinstance(item, ast.Assign):
            info.names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            info.names.add(item.target.id)
    for sub in ast.walk(node):  # self.x = ... anywhere in its methods
        targets: List[ast.expr] = []
        if isinstance(sub, ast.Assign):
            targets = list(sub.targets)
        elif isinstance(sub, (ast.AnnAssign, ast.AugAssign)):
            targets = [sub.target]
        for t in targets:
            for leaf in ast.walk(t):
                if (
                    isinstance(leaf, ast.Attribute)
                    and isinstance(leaf.value, ast.Name)
                    and leaf.value.id == "self"
                ):
                    info.names.add(leaf.attr)
    return info


def build_index(root: Path) -> CodeIndex:
    """Parse every module of `root/minisgl` (a file that does not parse is skipped)."""
    index = CodeIndex()
    base = root / "minisgl"
    for path in sorted(base.rglob("*.py")) if base.is_dir() else []:
        rel = path.relative_to(root).with_suffix("")
        parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except SyntaxError:
            continue
        names = index.modules.setdefault(".".join(parts), set())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                index.classes.setdefault(node.name, []).append(_class_info(node))
        for node in tree.body:
            for name, value in _module_bindings(node):
                names.add(name)
                if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
                    index.instances.setdefault(name, value.func.id)
    for module in list(index.modules):  # a package also has its submodules as names
        head, _, last = module.rpartition(".")
        if head in index.modules:
            index.modules[head].add(last)
    return index


def _module_bindings(node: ast.stmt) -> Iterator[Tuple[str, Optional[ast.expr]]]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield node.name, None
    elif isinstance(node, ast.Assign):
        for t in node.targets:
            for leaf in ast.walk(t):
                if isinstance(leaf, ast.Name):
                    yield leaf.id, node.value
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        yield node.target.id, node.value
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        for alias in node.names:
            yield (alias.asname or alias.name).split(".")[0], None
    elif isinstance(node, (ast.If, ast.Try)):
        for sub in [*node.body, *node.orelse, *getattr(node, "finalbody", [])]:
            yield from _module_bindings(sub)


# ----------------------------------------------------------------------------- the rules


def check_symbol(text: str, index: CodeIndex) -> Optional[str]:
    """Why the dotted name `text` names no engine symbol, or None (also when it is not ours)."""
    m = _DOTTED.match(text.strip())
    if not m or text.strip().endswith(_EXTENSIONS):  # `core.py` is a file, not core's `py`
        return None
    parts = m.group(1).split(".")
    head, rest = parts[0], parts[1:]
    if head in index.classes or head in index.instances:
        cls = head if head in index.classes else index.instances[head]
        if cls not in index.classes:
            return None
        names = index.class_names(cls)
        if rest[0] in names:
            return None
        close = difflib.get_close_matches(rest[0], sorted(names), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(f'{head}.{c}' for c in close)}?" if close else ""
        return f"`{text}`: {cls} has no attribute '{rest[0]}'{hint}"
    modules = ["minisgl." + ".".join(parts[:i]) for i in range(len(parts), 0, -1)]
    if head == "minisgl":
        modules = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
    for module in modules:
        if module not in index.modules:
            continue
        depth = module.count(".") + (1 if head == "minisgl" else 0)
        tail = parts[depth:]
        if not tail:
            return None
        names = index.modules[module]
        if tail[0] in names:
            if len(tail) > 1 and tail[0] in index.classes:
                attrs = index.class_names(tail[0])
                if tail[1] not in attrs:
                    return f"`{text}`: {tail[0]} has no attribute '{tail[1]}'"
            return None
        if head != "minisgl" and index.any_class_has(tail[0]):
            return None  # `engine.forward_batch`: a variable holding an engine object
        close = difflib.get_close_matches(tail[0], sorted(names), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        return f"`{text}`: module {module} has no name '{tail[0]}'{hint}"
    return None


def check_path(
    text: str,
    root: Path,
    upstream_files: Set[str],
    basenames: Set[str] = frozenset(),
    here: Optional[Path] = None,
) -> Optional[str]:
    """Why the repository path `text` does not exist, or None (also when it is not a path).

    A path may be relative to the root, to `minisgl/` or to `here` (the folder of the text's
    own file). A bare `name.py` must be the name of some Python file of the repository."""
    path = text.strip().split("::")[0]
    if not _PATH.match(path) or path.startswith(_GENERATED):
        return None
    if "/" not in path:
        if path.endswith(".py") and basenames and path not in basenames:
            return f"`{text}`: no Python file of the repository has that name"
        return None
    first = path.split("/")[0]
    top = {p.name for p in root.iterdir()} | {p.name for p in (root / "minisgl").iterdir()}
    if not (path.rstrip("/").endswith(_EXTENSIONS) or first in top or first == "python"):
        return None  # `tok/s`, `I/O`: not a path
    if path.startswith("python/minisgl/"):
        rel = path.removeprefix("python/minisgl/").rstrip("/")
        ok = rel in upstream_files or any(f.startswith(rel + "/") for f in upstream_files)
        return None if ok else f"`{text}`: upstream has no {path} at the pinned commit"
    if any((base / path).exists() for base in (root, root / "minisgl", here) if base):
        return None
    return f"`{text}`: no such file in the repository (nor under minisgl/)"


def _singular(word: str) -> str:
    return word[:-1] if word.endswith("s") and not word.endswith("ss") else word


def chapter_keywords(chapters: List[Chapter]) -> Dict[str, int]:
    """A chapter's topic words: those of its title's head (before any colon) that no other
    title has, in either part ("server" -> 15, "radix" -> 9; not "kernel", in two titles)."""
    owners: Dict[str, Set[int]] = {}
    for ch in chapters:
        for word in set(_WORD.findall(ch.title.lower())):
            owners.setdefault(_singular(word.removesuffix("'s")), set()).add(ch.number)
    stop = {_singular(w) for w in _STOPWORDS}
    keywords: Dict[str, int] = {}
    for ch in chapters:
        head = ch.title.split(":")[0].lower()
        for word in _WORD.findall(head):
            word = _singular(word.removesuffix("'s"))
            if word not in stop and len(word) > 2 and owners[word] == {ch.number}:
                keywords[word] = ch.number
    return keywords


def _cited(numbers: str) -> List[int]:
    """ "7, 8 and 9" -> [7, 8, 9]; "2–5" and "2 to 5" -> [2, 3, 4, 5]."""
    cited: List[int] = []
    for part in re.split(r"\s*,\s*|\s+and\s+|\s+or\s+", numbers):
        ends = [int(n) for n in _NUMBER.findall(part)]
        cited += list(range(ends[0], ends[-1] + 1)) if len(ends) == 2 else ends
    return cited


def check_chapter_refs(line: str, chapters: List[Chapter], keywords: Dict[str, int]) -> List[str]:
    """Chapter numbers in `line` (code spans already cut out) that are wrong."""
    numbers = {ch.number for ch in chapters}
    titles = {ch.number: ch.title for ch in chapters}
    problems: List[str] = []
    for m in _CHAPTER_REF.finditer(line):
        cited = _cited(m.group(1))
        missing = [n for n in cited if n not in numbers]
        if missing:
            problems.append(f"'{m.group(0)}': there is no chapter {missing[0]}")
            continue
        if len(cited) != 1:
            continue
        n = cited[0]
        before = line[: m.start()].lower()
        after = line[m.end() :].lower()
        topic = None
        tied = re.search(r"([a-z][a-z0-9-]*)\s+(?:of|from|in)\s+(?:the\s+)?$", before)
        if tied:
            topic = tied.group(1)
        elif re.match(r"^'s\s+([a-z][a-z0-9-]*)", after):
            topic = re.match(r"^'s\s+([a-z][a-z0-9-]*)", after).group(1)  # type: ignore[union-attr]
        elif re.search(r"([a-z][a-z0-9-]*)\s*\($", before):
            topic = re.search(r"([a-z][a-z0-9-]*)\s*\($", before).group(1)  # type: ignore[union-attr]
        if topic is None:
            continue
        owner = keywords.get(_singular(topic))
        if owner is not None and owner != n:
            problems.append(
                f"'{topic} ... {m.group(0)}': the {topic} is chapter {owner}'s "
                f"({titles[owner]}), not chapter {n}'s ({titles[n]})"
            )
    return problems


# ----------------------------------------------------------------------------- pages


@dataclass
class Allowance:
    page: str
    text: str
    reason: str


def load_allowances(path: Path = ALLOW_FILE) -> List[Allowance]:
    if not path.is_file():
        return []
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    allowed = []
    for item in data.get("allow", []):
        if not item.get("reason"):
            raise ValueError(f"{path.name}: every allowance needs a reason ({item})")
        allowed.append(Allowance(item["page"], item["text"], item["reason"]))
    return allowed


@dataclass
class Checker:
    """Everything a page is checked against, built once per site build."""

    root: Path
    index: CodeIndex
    chapters: List[Chapter]
    keywords: Dict[str, int]
    upstream_files: Set[str]
    allowed: List[Allowance]
    basenames: Set[str]

    @classmethod
    def for_root(cls, root: Path, upstream: Optional[dict] = None) -> "Checker":
        chapters = load_chapters(root)
        files = set((upstream or {}).get("files", {}))
        names = {
            p.name
            for p in root.rglob("*.py")
            if not {"site", "build", ".venv", "node_modules"} & set(p.relative_to(root).parts)
        }
        keywords = chapter_keywords(chapters)
        return cls(root, build_index(root), chapters, keywords, files, load_allowances(), names)

    def check(self, markdown: str, page: str, here: Optional[Path] = None) -> List[str]:
        """One message per finding: `page line N: what is wrong`. `here` is the folder of the
        page's own source file, for paths relative to it."""
        found: List[str] = []
        fence: Optional[str] = None
        upstream = False
        for number, line in enumerate(markdown.split("\n"), 1):
            m = _FENCE.match(line)
            if fence is None and m:
                fence = m.group(1)
                continue
            if fence is not None:
                if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                    fence = None
                continue
            if line.startswith("## "):
                upstream = bool(_UPSTREAM_SECTION.match(line))
            line = _MACRO.sub("", line)
            problems: List[str] = []
            for span in _CODE_SPAN.finditer(line):
                text = span.group(2).strip()
                if not upstream or text.startswith("python/minisgl/"):
                    problems.append(check_symbol(text, self.index) or "")
                    problems.append(
                        check_path(text, self.root, self.upstream_files, self.basenames, here) or ""
                    )
            prose = _CODE_SPAN.sub("", line)
            problems += check_chapter_refs(prose, self.chapters, self.keywords)
            for problem in filter(None, problems):
                if not any(a.page == page and a.text in problem for a in self.allowed):
                    found.append(f"{page} line {number}: {problem}")
        return found


def main(argv: Optional[List[str]] = None) -> int:
    from tools.docs.macros import load_upstream_index

    root = Path(__file__).resolve().parents[2]
    checker = Checker.for_root(root, load_upstream_index(root))
    found: List[str] = []
    for ch in checker.chapters:
        if ch.prose_path.is_file():
            found += checker.check(ch.prose_path.read_text(encoding="utf-8"), ch.page_uri)
    for page in sorted((root / "docs").rglob("*.md")):
        uri = page.relative_to(root / "docs").as_posix()
        found += checker.check(page.read_text(encoding="utf-8"), uri)
    for problem in sorted((root / "practice" / "exercises").glob("*/problem.md")):
        uri = problem.relative_to(root).as_posix()
        found += checker.check(problem.read_text(encoding="utf-8"), uri, problem.parent)
    print(
        "\n".join(found) if found else "the prose names only symbols, files and chapters that exist"
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
