"""mkdocs hooks that turn the repository into the book's site (mkdocs.yml `hooks:` names
mkdocs_hooks.py at the root, which imports these).

* on_config: the nav entry `chapters.md` becomes a "Chapters" section: that page, then one
  group per stage (titles from `extra.stages`) holding each chapter, titled from its
  `chapters/chNN_<slug>/chapter.toml`.
* on_files: each `chapters/chNN_<slug>/chapter.md` becomes the page `chapters/chNN_<slug>.md`
  (a stub when the prose is not written yet) and each chapter's notebook is generated into
  the site as `notebooks/chNN_<slug>.ipynb` (tools/notebooks.py; not executed).
* on_page_markdown: resolves the `@@macros@@` (tools/docs/macros.py) on every page, and gives
  chapter pages their stage line, main and notebook links, and an edit/report footer. Every
  broken macro is logged as an error naming the page, the chapter and the macro, so
  `mkdocs build --strict` fails; a plain build shows a "Broken macro" box in its place.
* on_serve: `mkdocs serve` also reloads on changes to the chapters, engine, examples,
  outputs and practice problems.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, List, Optional
from urllib.parse import quote

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

from tools.docs.chapters import Chapter, load_chapters
from tools.docs.macros import Context, MacroError, expand, load_upstream_index
from tools.notebooks import build_notebook, notebook_json

log = logging.getLogger("mkdocs.plugins.minisgl_book")

_state: Dict[str, Any] = {}


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
    _state.clear()
    _state["root"] = root
    _state["chapters"] = {ch.page_uri: ch for ch in chapters}
    try:
        _state["upstream"] = load_upstream_index(root)
    except MacroError:
        _state["upstream"] = None  # reported by the first @@upstream@@ that needs it
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


def on_files(files: Files, config: MkDocsConfig) -> Files:
    root: Path = _state["root"]
    for uri, ch in _state["chapters"].items():
        if files.get_file_from_path(uri) is not None:
            raise PluginError(f"docs/{uri} would hide chapters/{ch.key}/chapter.md; remove it")
        if ch.prose_path.is_file():
            files.append(File.generated(config, uri, abs_src_path=str(ch.prose_path)))
        else:
            files.append(File.generated(config, uri, content=_stub(ch)))
        try:
            nb = build_notebook(root, ch, repo_url=config.repo_url or "")
        except Exception as e:  # the page itself reports broken macros; this is anything else
            log.error(f"notebook for {ch.key} could not be built: {type(e).__name__}: {e}")
            continue
        files.append(File.generated(config, ch.notebook_uri, content=notebook_json(nb)))
    return files


def _context(page: Page, config: MkDocsConfig) -> Context:
    return Context(
        root=_state["root"],
        repo_url=config.repo_url or "",
        page=page.file.src_uri,
        chapter=_state["chapters"].get(page.file.src_uri),
        upstream_index=_state.get("upstream"),
    )


def _decorate_chapter(markdown: str, ch: Chapter, ctx: Context, config: MkDocsConfig) -> str:
    lines = markdown.split("\n")
    h1 = next((i for i, line in enumerate(lines) if line.startswith("# ")), None)
    if h1 is None:
        lines[:0], h1 = [f"# {ch.title}", ""], 0
    meta = []
    if ch.main:
        meta.append(f"main: [`{ch.main}`]({ctx.blob_url(ch.main)})")
    meta.append(f"[:material-notebook-outline: notebook]({ctx.link_to(ch.notebook_uri)})")
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


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
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


def on_serve(server: Any, config: MkDocsConfig, builder: Any) -> Any:
    root: Path = _state.get("root") or _root(config)
    for folder in ("chapters", "minisgl", "examples", "outputs", "practice/exercises", "tools"):
        if (root / folder).exists():
            server.watch(str(root / folder))
    return server
