"""The pieces a chapter's notebook is assembled from (tools/notebooks.py puts them together).

* **Sections.** The chapter's prose, cut at its `##` and `###` headings: one markdown cell per
  part, so each part's explanation stands beside the code that runs it.
* **Part cells.** `chapters/chNN_<slug>/notebook.py`, a jupytext percent script: each cell
  runs one part of the chapter on the real engine (import the module, call the piece, print
  or plot what it returns). A cell headed `# %% part="The decode set"` goes right after the
  section with that heading; the cells without `part` (set-up shared by the parts) go just
  before the first part's section. A `part` that names no heading of the chapter is an error. The script runs
  as is, too: `python chapters/ch07_scheduler/notebook.py` from the repository root.
* **Images.** A markdown image of `docs/assets/` becomes a cell attachment, so the notebook
  shows it wherever it is opened (the prose's `../assets/x.svg` exists only beside the site's
  pages).
"""

from __future__ import annotations

import base64
import mimetypes
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import jupytext
import nbformat
from nbformat.notebooknode import NotebookNode

from tools.docs.chapters import Chapter

COMPANION = "notebook.py"
_HEADING = re.compile(r"^(#{2,3}) (.+?)\s*$")
_IMAGE = re.compile(r"!\[([^\]]*)\]\((?:\.\./)*(?:docs/)?assets/([\w.\-]+)\)")


def sections(text: str) -> List[Tuple[Optional[str], str]]:
    """`(heading, markdown)` per part: cut before every `##`/`###` heading outside fences.
    The text before the first heading has heading None."""
    out: List[Tuple[Optional[str], str]] = []
    heading: Optional[str] = None
    chunk: List[str] = []
    fence = False
    for line in text.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        m = None if fence else _HEADING.match(line)
        if m:
            if "".join(chunk).strip():
                out.append((heading, "\n".join(chunk).strip("\n")))
            heading, chunk = m.group(2), []
        chunk.append(line)
    if "".join(chunk).strip():
        out.append((heading, "\n".join(chunk).strip("\n")))
    return out


def part_cells(chapter: Chapter) -> List[Tuple[Optional[str], NotebookNode]]:
    """The cells of the chapter's `notebook.py`, each with the heading it follows (or None)."""
    path = chapter.folder / COMPANION
    if not path.is_file():
        return []
    nb = jupytext.reads(path.read_text(encoding="utf-8"), fmt="py:percent")
    out: List[Tuple[Optional[str], NotebookNode]] = []
    for cell in nb.cells:
        lines = [line for line in cell.source.split("\n") if line.strip()]
        if not lines or all(line.lstrip().startswith("#") for line in lines):
            continue  # the file's own header comment, or an empty cell
        part = cell.metadata.pop("part", None)
        new = (
            nbformat.v4.new_code_cell(cell.source)
            if cell.cell_type == "code"
            else nbformat.v4.new_markdown_cell(cell.source)
        )
        out.append((part, new))
    return out


def device(chapter: Chapter) -> str:
    """ "cuda" when the chapter's notebook.py says `# notebook-device: cuda`, else "cpu"."""
    path = chapter.folder / COMPANION
    if path.is_file():
        m = re.search(r"^# notebook-device:\s*(\w+)", path.read_text(encoding="utf-8"), re.M)
        if m:
            return m.group(1)
    return "cpu"


def attach_images(cell: NotebookNode, root: Path) -> List[str]:
    """Embed the cell's `docs/assets/` images as attachments; return the names not found."""
    missing: List[str] = []
    attachments: Dict[str, Dict[str, str]] = {}

    def embed(m: re.Match) -> str:
        name = m.group(2)
        path = root / "docs" / "assets" / name
        if not path.is_file():
            missing.append(name)
            return m.group(0)
        mime = mimetypes.guess_type(name)[0] or "application/octet-stream"
        # Jupyter turns an attachment into a base64 data URL, whatever its type
        attachments[name] = {mime: base64.b64encode(path.read_bytes()).decode("ascii")}
        return f"![{m.group(1)}](attachment:{name})"

    cell.source = _IMAGE.sub(embed, cell.source)
    if attachments:
        cell["attachments"] = attachments
    return missing
