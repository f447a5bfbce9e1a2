"""The book's macros: code, trees, outputs and links that are pulled from the repository, never pasted.

Prose writes `@@name args@@`; `expand()` replaces each one and collects an error for every
macro it cannot resolve (the mkdocs hook turns those into a failed `mkdocs build --strict`).

Block macros stand alone on their line (indentation is kept, so they work inside list items
and admonitions):

    @@code path:Symbol@@     a class, function, method (`Class.method`) or module-level name,
                             found with `ast`, decorators included, in the version of the
                             file the page's chapter leaves (tools/docs/versioned.py; the
                             lines the chapter adds highlighted), titled `path · Symbol` and
                             linked to its lines in that version's page of the site's
                             source browser (tools/docs/source_pages.py)
    @@code path@@            the whole file (a chapter's main, say), in the same version
    @@tree@@ / @@tree N@@    the chapter's file tree, drawn by tools/manifest.py `render_tree`
                             from the manifests under the root (`python -m tools.steps tree N`)
    @@output name@@          the captured stdout of examples/name.py (outputs/name.txt,
                             written by `python -m tools.outputs`)
    @@trace name@@           the trace viewer (tools/trace_view) on the scheduler trace that
                             examples/name.py recorded (outputs/traces/name.json)
    @@exercises@@            the chapter's practice problems and their judge commands
    @@chapters@@             the table of all chapters (docs pages)
    @@practice@@             the table of all practice problems (docs pages)

Inline macros may sit anywhere in a line:

    @@upstream path:Symbol@@ a permalink to upstream mini-sglang at the pinned commit,
                             `path` relative to python/minisgl (docs/upstream_index.json)
    @@notebook@@             a link to the chapter's notebook
    @@clone@@                how to get the book's repository: `git clone <repo_url>` when one
                             is configured (BOOK_REPO_URL), else plain words

Macros inside fenced code blocks and inline code spans are left alone, so a page can show
the syntax itself.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from tools import manifest
from tools.docs import source_pages
from tools.docs.chapters import Chapter, Exercise, all_exercises, find_exercise, load_chapters
from tools.docs.symbols import SymbolError, find_symbol
from tools.docs.versioned import SourceVersions, is_source_file

MACRO = re.compile(r"@@([a-z][a-z_-]*)(?:[ \t]+([^@\n]*?))?[ \t]*@@")
BLOCK_MACROS = {"code", "tree", "output", "trace", "exercises", "chapters", "practice"}
INLINE_MACROS = {"upstream", "notebook", "clone"}
MAIN_CELLS = "<!--@@main-cells@@-->"  # notebook mode: where the chapter's main becomes code cells
UPSTREAM_REPO = "https://github.com/sgl-project/mini-sglang"
UPSTREAM_ROOT = "python/minisgl"
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class MacroError(Exception):
    """A macro that cannot be resolved; the message says why."""


@dataclass
class Context:
    """What a page's macros are resolved against.

    `root` is the repository root; `page` the page's path in the docs tree (for relative
    links and messages); `chapter` the chapter the page belongs to, if any; `mode` is
    "site" (mkdocs-material markdown) or "notebook" (plain markdown for Jupyter).
    `repo_url` is the book's repository when one is configured (BOOK_REPO_URL), else "".
    """

    root: Path
    repo_url: str = ""
    branch: str = "main"
    page: str = ""
    chapter: Optional[Chapter] = None
    mode: str = "site"
    upstream_index: Optional[Dict[str, Any]] = None
    versions: Optional[SourceVersions] = None  # the chapter versions (None: the files as they are)

    @property
    def number(self) -> Optional[int]:
        """The page's chapter, whose version of a file its listings show."""
        return self.chapter.number if self.chapter is not None else None

    def where(self) -> str:
        where = self.page or "<page>"
        if self.chapter is not None:
            where += f" (chapter {self.chapter.number})"
        return where

    def blob_url(self, path: str, lines: Optional[Tuple[int, int]] = None) -> str:
        url = f"{self.repo_url.rstrip('/')}/blob/{self.branch}/{path}"
        return url + (f"#L{lines[0]}-L{lines[1]}" if lines else "")

    def file_url(self, path: str, lines: Optional[Tuple[int, int]] = None) -> Optional[str]:
        """Where a link to a repository file goes, or None when nowhere real.

        On the site: its page in the source browser (`source/<path>/#L10-L20`), else the
        repository when one is configured. In a notebook: the repository when configured,
        else the file itself, relative to `notebooks/` (Jupyter opens it from a clone).
        """
        if self.mode == "site":
            if is_source_file(path) and (self.root / path).is_file():
                uri = source_pages.page_uri(path)
                if self.versions is not None:
                    uri = self.versions.uri(path, self.number)
                return self.link_to(uri) + source_pages.line_fragment(lines)
            return self.blob_url(path, lines) if self.repo_url else None
        if self.repo_url:
            return self.blob_url(path, lines)
        return posixpath.join("..", path)

    def problem_url(self, ex: Exercise) -> str:
        """A practice problem's statement: its page on the site (tools/docs/hooks.py)."""
        if self.mode == "site":
            return self.link_to(practice_page_uri(ex))
        if self.repo_url:
            return self.blob_url(f"practice/exercises/{ex.folder.name}/problem.md")
        return posixpath.join("..", "practice", "exercises", ex.folder.name, "problem.md")

    def link_to(self, site_path: str) -> str:
        """A relative link from this page to another file of the docs tree."""
        base = posixpath.dirname(self.page) or "."
        return posixpath.relpath(site_path, base)


@dataclass
class Expansion:
    text: str
    errors: List[str] = field(default_factory=list)


# --------------------------------------------------------------------------- helpers


def practice_page_uri(ex: Exercise) -> str:
    """The site page of a practice problem's statement: `practice/191_prefill_adder.md`."""
    return f"practice/{ex.folder.name}.md"


def _fenced(body: str, lang: str, title: str, mode: str, marked: List[int] = ()) -> str:
    """A fenced listing; on the site, ``marked`` lines (1-based, of ``body``) highlighted."""
    longest = max((len(m) for m in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    if mode == "site":
        hl = f' hl_lines="{" ".join(map(str, marked))}"' if marked else ""
        return f'{fence}{lang} title="{title}"{hl}\n{body}\n{fence}'
    return f"**{title}**\n\n{fence}{lang}\n{body}\n{fence}"


def _continue(text: str, indent: str) -> str:
    """Indent every line but the first (which takes the macro's place in its line)."""
    first, *rest = text.split("\n")
    return "\n".join([first] + [indent + line if line else line for line in rest])


def _split_target(arg: str) -> Tuple[str, Optional[str]]:
    path, sep, symbol = arg.strip().partition(":")
    return path.strip(), (symbol.strip() or None) if sep else None


def _chapter_arg(arg: str, ctx: Context, macro: str) -> Chapter:
    if arg.strip():
        digits = re.match(r"^(?:ch)?(\d+)", arg.strip())
        if not digits:
            raise MacroError(f"'{arg.strip()}' does not name a chapter (use 7 or ch07)")
        n = int(digits.group(1))
        for ch in load_chapters(ctx.root):
            if ch.number == n:
                return ch
        raise MacroError(f"there is no chapter {n}")
    if ctx.chapter is None:
        raise MacroError(
            f"@@{macro}@@ outside a chapter page needs a chapter number (@@{macro} 7@@)"
        )
    return ctx.chapter


def load_upstream_index(root: Path) -> Dict[str, Any]:
    path = root / "docs" / "upstream_index.json"
    if not path.is_file():
        raise MacroError(
            "docs/upstream_index.json does not exist (run python -m tools.upstream_index)"
        )
    return json.loads(path.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- macros


def macro_code(arg: str, ctx: Context) -> str:
    path, symbol = _split_target(arg)
    if not path:
        raise MacroError("needs a path: @@code path:Symbol@@ or @@code path@@")
    file = ctx.root / path
    if not file.is_file():
        raise MacroError(f"file {path} does not exist")
    source, added = file.read_text(encoding="utf-8"), []
    if ctx.versions is not None and ctx.number is not None and ctx.versions.has(path, ctx.number):
        source = ctx.versions.text(path, ctx.number)
        added = ctx.versions.added_lines(path, ctx.number)
    elif (
        ctx.versions is not None
        and ctx.chapter is not None
        and path.startswith("minisgl/")
        and not ctx.chapter.manifest.get("final_mains")  # a tour of the finished engine
    ):
        raise MacroError(f"{path} is not in chapter {ctx.number}'s tree")
    if symbol is None:
        if ctx.mode == "notebook" and ctx.chapter is not None and ctx.chapter.main == path:
            return MAIN_CELLS
        lines = source.rstrip("\n").split("\n")
        body, span, title = "\n".join(lines), None, path
    else:
        try:
            found = find_symbol(source, symbol, filename=path)
        except SyntaxError as e:
            raise MacroError(f"{path} does not parse: {e}") from e
        except SymbolError as e:
            raise MacroError(str(e)) from e
        body, span, title = found.text, (found.start, found.end), f"{path} · {symbol}"
    lang = "python" if path.endswith(".py") else ""
    first = span[0] if span else 1
    last = span[1] if span else source.count("\n") + 1
    marked = [k - first + 1 for k in added if first <= k <= last]
    where = f"{path}, lines {span[0]}–{span[1]}" if span else path
    url = ctx.file_url(path, span)
    if url is None:
        link = f"{where}{{ .code-link }}" if ctx.mode == "site" else where
    elif ctx.mode == "site":
        link = f"[:octicons-file-code-16: {where}]({url}){{ .code-link }}"
    else:
        link = f"[{where}]({url})"
    return _fenced(body, lang, title, ctx.mode, marked) + "\n\n" + link


def macro_output(arg: str, ctx: Context) -> str:
    name = arg.strip().removesuffix(".py").removeprefix("examples/")
    if not name:
        raise MacroError("needs the example's name: @@output ch07_scheduler@@")
    path = ctx.root / "outputs" / f"{name}.txt"
    if not path.is_file():
        raise MacroError(f"outputs/{name}.txt does not exist (run python -m tools.outputs {name})")
    body = _ANSI.sub("", path.read_text(encoding="utf-8")).rstrip("\n") or "(it prints nothing)"
    return _fenced(body, "text", f"python examples/{name}.py", ctx.mode)


TRACE_URI = "traces/{name}.html"  # the viewer page the docs hook renders from the stored trace


def macro_trace(arg: str, ctx: Context) -> str:
    name = arg.strip().removesuffix(".py").removeprefix("examples/")
    if not name:
        raise MacroError("needs the example's name: @@trace ch07_scheduler@@")
    path = ctx.root / "outputs" / "traces" / f"{name}.json"
    if not path.is_file():
        raise MacroError(
            f"outputs/traces/{name}.json does not exist (mark examples/{name}.py "
            f"`# output: trace` and run python -m tools.outputs {name})"
        )
    command = f"python examples/{name}.py --trace my.json && python -m tools.trace_view my.json"
    if ctx.mode != "site":
        return f"The book's page shows this run's trace in a viewer; record and view your own:\n\n    {command}"
    target = TRACE_URI.format(name=name)
    url = ctx.link_to(target)  # a markdown link: mkdocs rewrites it for the page's URL
    # raw HTML is not rewritten: relative to the page's URL, chapters/chNN_slug/ (directory URLs)
    page_dir = ctx.page[: -len("index.md")] if ctx.page.endswith("index.md") else ctx.page[:-3]
    src = posixpath.relpath(target, page_dir.rstrip("/") or ".")
    return (
        f'<iframe class="trace-viewer" src="{src}" title="the scheduler trace of '
        f'examples/{name}.py" loading="lazy"></iframe>\n\n'
        f"The scheduler's own record of the run above ([full page]({url})), step by step: "
        "&larr; and &rarr; step, space plays. Record and view your own with "
        f"`{command}`.\n{{ .trace-caption }}"
    )


def macro_tree(arg: str, ctx: Context) -> str:
    chapter = _chapter_arg(arg, ctx, "tree")
    try:  # the manifests are read again on every page: the tree follows edits under serve
        manifests = manifest.load_manifests(ctx.root)
        tree = manifest.render_tree(chapter.number, "markdown", manifests)
    except (OSError, ValueError) as e:  # parse_manifest names the file at fault
        raise MacroError(f"the tree of chapter {chapter.number}: {e}") from e
    return tree.rstrip("\n")


def macro_upstream(arg: str, ctx: Context) -> str:
    path, symbol = _split_target(arg)
    path = path.removeprefix(UPSTREAM_ROOT + "/").removeprefix("minisgl/")
    index = ctx.upstream_index if ctx.upstream_index is not None else load_upstream_index(ctx.root)
    files = index.get("files", {})
    if path not in files:
        raise MacroError(
            f"upstream has no file {UPSTREAM_ROOT}/{path} at {index.get('commit', '?')[:12]}"
        )
    base = f"{index.get('repository', UPSTREAM_REPO)}/blob/{index['commit']}/{index.get('root', UPSTREAM_ROOT)}/{path}"
    if symbol is None:
        return f"[{path}]({base})"
    if symbol not in files[path]:
        raise MacroError(f"upstream {path} has no symbol '{symbol}' at {index['commit'][:12]}")
    start, end = files[path][symbol]
    return f"[{path} · {symbol}]({base}#L{start}-L{end}) (lines {start}–{end})"


def macro_exercises(arg: str, ctx: Context) -> str:
    chapter = _chapter_arg(arg, ctx, "exercises")
    if not chapter.exercises:
        return "This chapter has no practice problems yet."
    items = []
    for exercise_id in chapter.exercises:
        try:
            ex = find_exercise(ctx.root, exercise_id)
        except LookupError as e:
            raise MacroError(
                f"exercise {exercise_id} (listed in {chapter.key}/chapter.toml): {e}"
            ) from e
        difficulty = f" ({ex.difficulty})" if ex.difficulty else ""
        problem = ctx.problem_url(ex)
        items.append(
            f"- **{ex.id}. {ex.title}**{difficulty}: [the problem]({problem}), "
            f"then judge your answer with `{ex.judge_command}`"
        )
    return "\n".join(items)


def macro_notebook(arg: str, ctx: Context) -> str:
    chapter = _chapter_arg(arg, ctx, "notebook")
    if ctx.mode == "notebook":
        return f"(this notebook is chapter {chapter.number} of the book)"
    return f"[:material-notebook-outline: this chapter as a notebook]({ctx.link_to(chapter.notebook_uri)})"


def macro_clone(arg: str, ctx: Context) -> str:
    if ctx.repo_url:
        return f"`git clone {ctx.repo_url.rstrip('/')} mini-sglang-from-scratch`"
    return "clone it from wherever you found this book, or unpack its archive"


def macro_chapters(arg: str, ctx: Context) -> str:
    rows = ["| # | Chapter | Stage | Main | Practice |", "|---|---|---|---|---|"]
    for ch in load_chapters(ctx.root):
        title = f"[{ch.title}]({ctx.link_to(ch.page_uri)})" if ctx.mode == "site" else ch.title
        main = f"`{ch.main}`" if ch.main else ""
        practice = ", ".join(str(i) for i in ch.exercises)
        stage = "" if ch.stage is None else str(ch.stage)
        rows.append(f"| {ch.number} | {title} | {stage} | {main} | {practice} |")
    return "\n".join(rows) if len(rows) > 2 else "No chapters yet."


def macro_practice(arg: str, ctx: Context) -> str:
    owner = {i: ch for ch in load_chapters(ctx.root) for i in ch.exercises}
    # the judge command is the same for every row (`python practice/judge.py ID`): it is said
    # once under the table, so the table keeps its width for the titles
    rows = ["| Id | Problem | Difficulty | Chapter |", "|---|---|---|---|"]

    def reading_order(ex: Exercise) -> tuple:  # as `judge.py list`: by chapter, then id
        return (owner[ex.id].number if ex.id in owner else float("inf"), ex.id)

    for ex in sorted(all_exercises(ctx.root), key=reading_order):
        ch = owner.get(ex.id)
        chapter = f"[{ch.number}]({ctx.link_to(ch.page_uri)})" if ch else ""
        rows.append(
            f"| {ex.id} | [{ex.title}]({ctx.problem_url(ex)}) | {ex.difficulty} | {chapter} |"
        )
    if len(rows) == 2:
        return "No practice problems yet."
    return (
        "\n".join(rows)
        + "\n\nJudge a problem with `python practice/judge.py ID`, e.g. `python practice/judge.py 191`."
    )


MACROS: Dict[str, Callable[[str, Context], str]] = {
    "code": macro_code,
    "output": macro_output,
    "trace": macro_trace,
    "tree": macro_tree,
    "upstream": macro_upstream,
    "exercises": macro_exercises,
    "notebook": macro_notebook,
    "clone": macro_clone,
    "chapters": macro_chapters,
    "practice": macro_practice,
}


# --------------------------------------------------------------------------- expansion


def _failure(message: str, mode: str, block: bool) -> str:
    if mode == "site" and block:
        return f'!!! failure "Broken macro"\n    {message}'
    return f"**Broken macro:** {message}"


def _expand_line(line: str, ctx: Context, errors: List[str]) -> str:
    # inline code spans are shown literally: cut them out, expand the rest, put them back
    spans: List[str] = []

    def hide(m: re.Match) -> str:
        spans.append(m.group(0))
        return f"\x00{len(spans) - 1}\x00"

    hidden = _CODE_SPAN.sub(hide, line)
    if "@@" not in hidden:
        return line

    def replace(m: re.Match) -> str:
        name, arg = m.group(1), m.group(2) or ""
        source = m.group(0)
        alone = hidden.strip() == source
        try:
            if name not in MACROS:
                raise MacroError(f"unknown macro '{name}' (known: {', '.join(sorted(MACROS))})")
            if name in BLOCK_MACROS and not alone:
                raise MacroError("a block macro must stand alone on its line")
            out = MACROS[name](arg, ctx)
            if name in BLOCK_MACROS:
                indent = hidden[: len(hidden) - len(hidden.lstrip())]
                return _continue(out, indent)
            return out
        except MacroError as e:
            message = f"{ctx.where()}: {source}: {e}"
            errors.append(message)
            indent = hidden[: len(hidden) - len(hidden.lstrip())]
            return _continue(_failure(message, ctx.mode, name in BLOCK_MACROS and alone), indent)

    expanded = MACRO.sub(replace, hidden)
    return re.sub(r"\x00(\d+)\x00", lambda m: spans[int(m.group(1))], expanded)


def expand(text: str, ctx: Context) -> Expansion:
    """Resolve every macro of `text` outside code blocks; collect one message per broken macro.

    Each message names the page, the chapter and the macro as written, e.g.
    `chapters/ch07_scheduler.md (chapter 7): @@code minisgl/x.py:Foo@@: symbol 'Foo' ...`.
    """
    errors: List[str] = []
    out: List[str] = []
    fence: Optional[str] = None
    for line in text.split("\n"):
        m = _FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            out.append(line)
        elif fence is not None:
            if (
                m
                and m.group(1)[0] == fence[0]
                and len(m.group(1)) >= len(fence)
                and not line.strip()[len(m.group(1)) :].strip()
            ):
                fence = None
            out.append(line)
        else:
            out.append(_expand_line(line, ctx, errors))
    return Expansion("\n".join(out), errors)
