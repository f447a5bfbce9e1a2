"""Turn each chapter into a Jupyter notebook: `notebooks/chNN_<slug>.ipynb`.

    python -m tools.notebooks                 # every chapter into notebooks/
    python -m tools.notebooks ch07 ch08       # only these
    python -m tools.notebooks --execute ch07  # build it, then run it on this machine (CPU is fine)

A notebook is the chapter's prose as markdown cells (split at `## ` headings; macros expanded
to plain markdown: code excerpts become code blocks, admonitions become blockquotes or
`<details>` for `???` answers), with the chapter's main as runnable code cells where the prose
shows it (`@@code examples/chNN_<slug>.py@@`), or at the end if it never does. The main is cut
into cells at its `# %%` markers when it has them, else at each blank-line-separated run of
top-level statements (imports stay together); its module docstring becomes a markdown cell.
A first code cell moves the kernel to the repository root, so `minisgl` and `models/` are
found wherever the notebook is opened from inside the repository.

Decision: notebooks/ is generated and git-ignored. `mkdocs build` generates the same
notebooks into the site (site/notebooks/, linked from every chapter page), so the site never
links a stale notebook. Broken macros fail this tool (exit 1) as they fail the strict build;
`--execute` fails when a cell raises.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path
from typing import List, Optional, Tuple

import jupytext
import nbformat
from nbformat.notebooknode import NotebookNode

from tools.docs.chapters import Chapter, chapter_by_key, load_chapters
from tools.docs.macros import MAIN_CELLS, Context, expand

ROOT = Path(__file__).resolve().parents[1]

_ADMONITION = re.compile(r'^(\s*)(!!!|\?\?\?\+?)\s+([\w-]+)(?:\s+"([^"]*)")?\s*$')
_TAB = re.compile(r'^(\s*)===\+?\s+"([^"]*)"\s*$')
_ATTR_LINE = re.compile(r"^\s*\{:?\s*[.#][^}]*\}\s*$")
_ICON = re.compile(r":(?:material|octicons|fontawesome|simple)-[a-z0-9-]+:\s?")


def _setup_cell(main: Optional[str]) -> str:
    argv = (
        f'sys.argv = ["{main}"]  # the main parses its own flags; the kernel\'s are not for it\n'
        if main
        else ""
    )
    return (
        "# Run from the repository root, so that `minisgl`, `models/` and `outputs/` are found.\n"
        "import os\nimport sys\nfrom pathlib import Path\n\n"
        "_here = Path.cwd().resolve()\n"
        "ROOT = next((p for p in [_here, *_here.parents]\n"
        '             if (p / "minisgl").is_dir() and (p / "chapters").is_dir()), _here)\n'
        "os.chdir(ROOT)\nsys.path.insert(0, str(ROOT))\n" + argv
    )


def plain_markdown(text: str) -> str:
    """Material-only markdown to what Jupyter renders: admonitions, tabs, attr lists, icons."""
    out: List[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        m, t = _ADMONITION.match(line), _TAB.match(line)
        if m or t:
            indent = (m or t).group(1)
            body: List[str] = []
            i += 1
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith(indent + "    ")):
                body.append(lines[i][len(indent) + 4 :] if lines[i].strip() else "")
                i += 1
            while body and not body[-1]:
                body.pop()
            inner = plain_markdown("\n".join(body))
            if t:
                out += (
                    [f"{indent}**{t.group(2)}**", ""]
                    + [indent + b if b else b for b in inner.split("\n")]
                    + [""]
                )
            elif m.group(2).startswith("???"):
                title = m.group(4) or m.group(3).capitalize()
                out += [f"{indent}<details><summary>{title}</summary>", ""]
                out += [indent + b if b else b for b in inner.split("\n")] + [
                    "",
                    f"{indent}</details>",
                    "",
                ]
            else:
                title = m.group(4) if m.group(4) is not None else m.group(3).capitalize()
                head = [f"{indent}> **{title}**", f"{indent}>"] if title else []
                out += head + [f"{indent}> {b}".rstrip() for b in inner.split("\n")] + [""]
            continue
        if not _ATTR_LINE.match(line):
            out.append(_ICON.sub("", line))
        i += 1
    return "\n".join(out)


def _markdown_cells(text: str) -> List[NotebookNode]:
    cells, chunk, fence = [], [], False
    for line in text.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        if line.startswith("## ") and not fence and "".join(chunk).strip():
            cells.append("\n".join(chunk).strip("\n"))
            chunk = []
        chunk.append(line)
    if "".join(chunk).strip():
        cells.append("\n".join(chunk).strip("\n"))
    return [nbformat.v4.new_markdown_cell(c) for c in cells]


def split_main(source: str, filename: str = "<main>") -> List[Tuple[str, str]]:
    """Cut a main into `(cell_type, source)` pairs: at `# %%` markers (read with jupytext) when
    present, else at blank-line-separated runs of top-level statements (comments travel with
    the statement below them); the module docstring becomes markdown."""
    if re.search(r"^# %%", source, re.M):
        nb = jupytext.reads(source, fmt="py:percent")
        return [(c.cell_type, c.source) for c in nb.cells if c.source.strip()]
    tree = ast.parse(source, filename=filename)
    lines = source.split("\n")
    cells: List[Tuple[str, str]] = []
    body = tree.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(getattr(body[0], "value", None), ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        cells.append(("markdown", ast.get_docstring(tree) or ""))
        lines_from = body[0].end_lineno or 0
        body = body[1:]
    else:
        lines_from = 0
    cuts: List[int] = []  # 0-based line indices where a new cell starts
    imports = (ast.Import, ast.ImportFrom)
    for prev, node in zip([None] + body[:-1], body):
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        while start > lines_from and lines[start - 1].lstrip().startswith("#"):
            start -= 1
        if isinstance(node, imports) and isinstance(prev, imports):
            continue  # the imports stay together in the first cell
        if start == lines_from or not lines[start - 1].strip():
            cuts.append(start)
    if not cuts or cuts[0] > lines_from:
        cuts.insert(0, lines_from)
    for a, b in zip(cuts, cuts[1:] + [len(lines)]):
        chunk = "\n".join(lines[a:b]).strip("\n")
        if chunk.strip():
            cells.append(("code", chunk))
    return cells


def build_notebook(
    root: Path, chapter: Chapter, repo_url: str = "", errors: Optional[List[str]] = None
) -> NotebookNode:
    """The notebook of `chapter` (validated with nbformat). Broken macros go to `errors`."""
    prose = (
        chapter.prose_path.read_text(encoding="utf-8")
        if chapter.prose_path.is_file()
        else f"# {chapter.title}\n\nThis chapter is being written.\n"
    )
    ctx = Context(
        root=root,
        repo_url=repo_url,
        page=f"chapters/{chapter.key}/chapter.md",
        chapter=chapter,
        mode="notebook",
    )
    result = expand(prose, ctx)
    if errors is not None:
        errors.extend(result.errors)
    before, marker, after = plain_markdown(result.text).partition(MAIN_CELLS)
    main_cells: List[NotebookNode] = []
    if chapter.main and (root / chapter.main).is_file():
        source = (root / chapter.main).read_text(encoding="utf-8")
        for kind, text in split_main(source, chapter.main):
            main_cells.append(
                nbformat.v4.new_code_cell(text)
                if kind == "code"
                else nbformat.v4.new_markdown_cell(text)
            )
        if not marker:
            main_cells.insert(
                0, nbformat.v4.new_markdown_cell(f"## Run the chapter's main: `{chapter.main}`")
            )
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["jupytext"] = {"notebook_metadata_filter": "-all"}
    nb.cells = [nbformat.v4.new_code_cell(_setup_cell(chapter.main))]
    nb.cells += _markdown_cells(before) + main_cells + _markdown_cells(after)
    for n, cell in enumerate(nb.cells):
        cell["id"] = f"{chapter.key.replace('_', '-')}-{n:03d}"  # stable ids: rebuilds diff cleanly
    nbformat.validate(nb)
    return nb


def notebook_json(nb: NotebookNode) -> str:
    return jupytext.writes(nb, fmt="ipynb")


def execute(path: Path, root: Path, timeout: int) -> NotebookNode:
    """Run a notebook top to bottom with nbclient; raises CellExecutionError on a failing cell."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(root)}}
    ).execute()
    return nb


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.notebooks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("chapters", nargs="*", help="ch07 or 7; all chapters when none")
    parser.add_argument(
        "--execute", action="store_true", help="run the built notebooks and fail on an error"
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "notebooks", help="output folder (notebooks/)"
    )
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell when executing")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    chapters = (
        [chapter_by_key(root, k) for k in args.chapters] if args.chapters else load_chapters(root)
    )
    if args.execute and not args.chapters:
        parser.error("--execute needs the chapters to run (e.g. --execute ch07)")
    repo_url = _repo_url(root)
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for ch in chapters:
        errors: List[str] = []
        nb = build_notebook(root, ch, repo_url, errors)
        path = args.out / f"{ch.key}.ipynb"
        path.write_text(notebook_json(nb), encoding="utf-8")
        for e in errors:
            print(f"error: {e}", file=sys.stderr)
        failed += bool(errors)
        print(
            f"wrote {path.relative_to(root) if path.is_relative_to(root) else path} ({len(nb.cells)} cells)"
        )
        if args.execute:
            from nbclient.exceptions import CellExecutionError

            try:
                executed = execute(path, root, args.timeout)
            except CellExecutionError as e:
                print(f"error: {ch.key} failed while executing:\n{e}", file=sys.stderr)
                failed += 1
                continue
            path.write_text(notebook_json(executed), encoding="utf-8")
            print(f"executed {ch.key}: every cell ran")
    return 1 if failed else 0


def _repo_url(root: Path) -> str:
    config = root / "mkdocs.yml"
    if config.is_file():
        m = re.search(r"^repo_url:\s*(\S+)", config.read_text(encoding="utf-8"), re.M)
        if m:
            return m.group(1).strip("'\"")
    return ""


if __name__ == "__main__":
    sys.exit(main())
