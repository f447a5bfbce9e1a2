"""mkdocs hooks that turn the repository into the book's site (mkdocs.yml `hooks:` names
mkdocs_hooks.py at the root, which imports these).

* on_config: the nav entry `chapters.md` becomes a "Chapters" section: that page, then one
  group per stage (titles from `extra.stages`) holding each chapter, titled from its
  `chapters/chNN_<slug>/chapter.toml`.
* on_config: without a repository configured (`BOOK_REPO_URL`, read by mkdocs.yml's
  `repo_url`), no page links one: no edit buttons, no repository icon.
* on_files: each `chapters/chNN_<slug>/chapter.md` becomes the page `chapters/chNN_<slug>.md`
  (a stub when the prose is not written yet) and each chapter's notebook is generated into
  the site as `notebooks/chNN_<slug>.ipynb` (tools/notebooks.py, with the outputs stored
  by `python -m tools.notebooks --execute`). The source browser's pages
  (`source/<path>.md`, tools/docs/source_pages.py) and one page per practice problem
  (`practice/<id>_<slug>.md`, from its problem.md) are generated too, and the trace viewer's
  page `traces/<name>.html` for each stored trace outputs/traces/<name>.json
  (tools/trace_view: the `@@trace name@@` macro embeds it).
* on_page_content: a source page's lines get their anchors `#L<n>`.
* on_page_markdown: checks the prose against the code (tools/docs/prose_check.py: every
  engine symbol, repository file and chapter number it names must exist, and a chapter's
  topic must be cited with its own number), logging each finding as an error so that
  `mkdocs build --strict` fails; then resolves the `@@macros@@` (tools/docs/macros.py) on
  every page, and gives chapter pages their stage line, main and notebook links, and (with a
  repository configured) an edit/report footer. Every
  broken macro is logged as an error naming the page, the chapter and the macro, so
  `mkdocs build --strict` fails; a plain build shows a "Broken macro" box in its place.
* on_serve: `mkdocs serve` also reloads on changes to the chapters, engine, examples,
  outputs and practice problems.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, Dict, List, Optional
from urllib.parse import quote

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

from tools import notebook_outputs, trace_view
from tools.docs import source_pages
from tools.docs.chapters import Chapter, Exercise, all_exercises, load_chapters
from tools.docs.macros import (
    TRACE_URI,
    Context,
    MacroError,
    expand,
    load_upstream_index,
    practice_page_uri,
)
from tools.docs.prose_check import Checker
from tools.docs.versioned import CHANGES_URI, SourceVersions, changes_page
from tools.notebooks import build_notebook, notebook_json

log = logging.getLogger("mkdocs.plugins.minisgl_book")

_state: Dict[str, Any] = {}


class _LineRangeAnchors(logging.Filter):
    """mkdocs checks a link's #fragment against the ids of the page it names; a source page's
    `#L10-L20` is a range that assets/listings.js marks, not an id, so that note is dropped."""

    _RANGE = re.compile(r"contains a link '[^']*\.py\.md#L\d+-L\d+', but the doc")

    def filter(self, record: logging.LogRecord) -> bool:
        return not self._RANGE.search(record.getMessage())


logging.getLogger("mkdocs.structure.pages").addFilter(_LineRangeAnchors())


def _root(config: MkDocsConfig) -> Path:
    """The book's repository: the folder holding mkdocs.yml."""
    return Path(config.config_file_path).resolve().parent


def _stage_title(config: MkDocsConfig, stage: Optional[int]) -> str:
    """`Stage 2 · Scheduling it well: ...`: the name from the chapters' `stage_title`, else
    from mkdocs.yml `extra.stages`."""
    if stage is None:
        return "More chapters"
    from_chapters = [
        ch.stage_title
        for ch in _state.get("chapters", {}).values()
        if ch.stage == stage and ch.stage_title
    ]
    stages = (config.extra or {}).get("stages", {}) or {}
    name = (
        (from_chapters[0] if from_chapters else None) or stages.get(stage) or stages.get(str(stage))
    )
    return f"Stage {stage} · {name}" if name else f"Stage {stage}"


def _chapter_nav(config: MkDocsConfig, chapters: List[Chapter]) -> List[Any]:
    groups: Dict[Optional[int], List[Any]] = {}
    for ch in chapters:
        groups.setdefault(ch.stage, []).append({f"{ch.number}. {ch.title}": ch.page_uri})
    ordered = sorted(groups, key=lambda s: (s is None, s if s is not None else 0))
    return [{_stage_title(config, s): groups[s]} for s in ordered]


def _splice_nav(nav: List[Any], chapter_sections: List[Any]) -> bool:
    """Replace the nav entry pointing at `chapters.md` with a section of all chapters."""
    for i, item in enumerate(nav):
        if isinstance(item, str) and item == "chapters.md":
            nav[i] = {"Chapters": [{"All chapters": "chapters.md"}, *chapter_sections]}
            return True
        if isinstance(item, dict):
            for title, value in item.items():
                if value == "chapters.md":
                    item[title] = [{"All chapters": "chapters.md"}, *chapter_sections]
                    return True
                if isinstance(value, list) and _splice_nav(value, chapter_sections):
                    return True
    return False


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    root = _root(config)
    try:
        chapters = load_chapters(root)
    except ValueError as e:
        raise PluginError(str(e)) from e
    if not config.repo_url:
        config.repo_url = None
        config.edit_uri = None  # an edit link needs a repository to point into
    _state.clear()
    _state["root"] = root
    _state["chapters"] = {ch.page_uri: ch for ch in chapters}
    try:
        _state["versions"] = SourceVersions(root)
    except ValueError as e:  # a malformed manifest or marker names its file and line
        raise PluginError(str(e)) from e
    try:
        _state["upstream"] = load_upstream_index(root)
    except MacroError:
        _state["upstream"] = None  # reported by the first @@upstream@@ that needs it
    try:
        _state["checker"] = Checker.for_root(root, _state["upstream"])
    except ValueError as e:  # prose_allow.toml is malformed
        raise PluginError(str(e)) from e
    if (
        config.nav is not None
        and chapters
        and not _splice_nav(config.nav, _chapter_nav(config, chapters))
    ):
        config.nav.append({"Chapters": _chapter_nav(config, chapters)})
    return config


def _stub(ch: Chapter) -> str:
    return (
        f'# {ch.title}\n\n!!! note "This chapter is being written"\n'
        f"    Its prose will live in `chapters/{ch.key}/chapter.md`.\n"
    )


def _problem_page(ex: Exercise, chapters: List[Chapter]) -> str:
    """A practice problem's statement as a page: its problem.md, headed by what it is."""
    text = (ex.folder / "problem.md").read_text(encoding="utf-8")
    # front matter between --- lines (YAML, `module: path`) or +++ lines (TOML, `module = "path"`)
    front = re.match(r"\A(---|\+\+\+)\s*\n(.*?)\n\1\s*\n", text, re.S)
    body = text[front.end() :] if front else text
    body = re.sub(r"\A\s*# [^\n]*\n", "", body)  # the title is ours
    module = (
        re.search(r"^module\s*[:=]\s*[\"']?([^\s\"']+)", front.group(2), re.M) if front else None
    )
    owner = next((ch for ch in chapters if ex.id in ch.exercises), None)
    meta = []
    if owner is not None:
        meta.append(f"[chapter {owner.number}](../{owner.page_uri})")
    if ex.difficulty:
        meta.append(ex.difficulty)
    if module:
        path = module.group(1)
        meta.append(f"replaces [`{path}`](../{source_pages.page_uri(path)})")
    meta.append(f"judge it with `{ex.judge_command}`")
    head = [f"# {ex.id}. {ex.title}", "", " · ".join(meta), "{ .chapter-meta }", ""]
    return "\n".join(head) + "\n" + body


def on_files(files: Files, config: MkDocsConfig) -> Files:
    root: Path = _state["root"]
    chapters = list(_state["chapters"].values())
    by_number = {ch.number: ch for ch in chapters}
    sv: SourceVersions = _state["versions"]
    table = source_pages.file_chapters(chapters, sv)
    paths = source_pages.source_files(root)
    for path in paths:
        versions = sv.versions(path)
        for v in versions:  # the last is the file itself, at source/<path>.md
            text = sv.text(path, v.first if v.uri != source_pages.page_uri(path) else None)
            page = source_pages.render_page(
                root, path, table.get(path), by_number, text, v.uri, versions
            )
            files.append(File.generated(config, v.uri, content=page))
    index = source_pages.render_index(root, paths, table, by_number)
    files.append(File.generated(config, source_pages.INDEX_URI, content=index))
    for ch in chapters:
        tree = source_pages.render_chapter_index(sv, ch.number, paths, by_number)
        files.append(
            File.generated(config, source_pages.chapter_index_uri(ch.number), content=tree)
        )
        uri = CHANGES_URI.format(key=ch.key)
        page = changes_page(sv, ch.number, f"{ch.number}. {ch.title}", ch.page_uri, uri)
        files.append(File.generated(config, uri, content=page))
    for trace in sorted((root / "outputs" / "traces").glob("*.json")):
        try:
            page = trace_view.render(json.loads(trace.read_text(encoding="utf-8")))
        except ValueError as e:
            log.error(f"outputs/traces/{trace.name}: {e}")
            continue
        files.append(File.generated(config, TRACE_URI.format(name=trace.stem), content=page))
    for ex in all_exercises(root):
        files.append(
            File.generated(config, practice_page_uri(ex), content=_problem_page(ex, chapters))
        )
    for uri, ch in _state["chapters"].items():
        if files.get_file_from_path(uri) is not None:
            raise PluginError(f"docs/{uri} would hide chapters/{ch.key}/chapter.md; remove it")
        if ch.prose_path.is_file():
            files.append(File.generated(config, uri, abs_src_path=str(ch.prose_path)))
        else:
            files.append(File.generated(config, uri, content=_stub(ch)))
        errors: List[str] = []
        try:
            nb = build_notebook(root, ch, config.repo_url or "", errors, _state["versions"])
        except Exception as e:  # the page itself reports broken macros; this is anything else
            log.error(f"notebook for {ch.key} could not be built: {type(e).__name__}: {e}")
            continue
        for message in errors:  # broken macros are the page's to report
            if "@@" not in message:
                log.error(f"notebook for {ch.key}: {message}")
        notebook_outputs.attach(root, ch.key, nb)
        files.append(File.generated(config, ch.notebook_uri, content=notebook_json(nb)))
    return files


def _context(page: Page, config: MkDocsConfig) -> Context:
    return Context(
        root=_state["root"],
        repo_url=config.repo_url or "",
        page=page.file.src_uri,
        chapter=_state["chapters"].get(page.file.src_uri),
        upstream_index=_state.get("upstream"),
        versions=_state.get("versions"),
    )


def _decorate_chapter(markdown: str, ch: Chapter, ctx: Context, config: MkDocsConfig) -> str:
    lines = markdown.split("\n")
    h1 = next((i for i, line in enumerate(lines) if line.startswith("# ")), None)
    if h1 is None:
        lines[:0], h1 = [f"# {ch.title}", ""], 0
    meta = []
    if ch.main:
        url = ctx.file_url(ch.main)
        meta.append(f"main: [`{ch.main}`]({url})" if url else f"main: `{ch.main}`")
    meta.append(f"[:material-notebook-outline: notebook]({ctx.link_to(ch.notebook_uri)})")
    meta.append(f"[what this chapter changed]({ctx.link_to(CHANGES_URI.format(key=ch.key))})")
    meta.append(f"[its tree]({ctx.link_to(source_pages.chapter_index_uri(ch.number))})")
    if ch.exercises:
        meta.append("practice: " + ", ".join(str(i) for i in ch.exercises))
    stage = f"{_stage_title(config, ch.stage)}  ·  chapter {ch.number}"
    lines[h1:h1] = [stage, "{ .chapter-stage }", ""]
    lines[h1 + 4 : h1 + 4] = ["", " · ".join(meta), "{ .chapter-meta }", ""]
    repo = (config.repo_url or "").rstrip("/")
    if repo:
        edit = f"{repo}/edit/main/chapters/{ch.key}/chapter.md"
        issue = f"{repo}/issues/new?title={quote(f'Chapter {ch.number}: ')}"
        lines += [
            "",
            "---",
            "",
            f"Found a mistake or a better way to say it? [Edit this page on GitHub]({edit})"
            f" · [Report an issue]({issue})",
            "{ .chapter-footer }",
        ]
    return "\n".join(lines)


def _prose_findings(markdown: str, page: Page) -> List[str]:
    uri = page.file.src_uri
    if source_pages.is_source_page(uri) or uri == source_pages.INDEX_URI:
        return []
    here = None
    if uri.startswith("practice/"):  # a problem statement: paths may be relative to its folder
        here = _state["root"] / "practice" / "exercises" / uri.removeprefix("practice/")[:-3]
    return _state["checker"].check(markdown, uri, here)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    for message in _prose_findings(markdown, page):
        log.error(f"prose check: {message}")
    ctx = _context(page, config)
    result = expand(markdown, ctx)
    for message in result.errors:
        log.error(message)
    if ctx.chapter is None:
        return result.text
    if config.repo_url:
        page.edit_url = (
            f"{config.repo_url.rstrip('/')}/edit/main/chapters/{ctx.chapter.key}/chapter.md"
        )
    return _decorate_chapter(result.text, ctx.chapter, ctx, config)


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if source_pages.is_source_page(page.file.src_uri):
        return source_pages.anchor_lines(html)
    return html


def on_serve(server: Any, config: MkDocsConfig, builder: Any) -> Any:
    root: Path = _state.get("root") or _root(config)
    folders = ("chapters", "outputs", "practice/exercises", "tools", *source_pages.SOURCE_DIRS)
    for folder in folders:
        if (root / folder).exists():
            server.watch(str(root / folder))
    return server
