"""Turn each chapter into a Jupyter notebook: `notebooks/chNN_<slug>.ipynb`.

    python -m tools.notebooks                 # every chapter into notebooks/
    python -m tools.notebooks ch07 ch08       # only these
    python -m tools.notebooks --execute ch07  # build it, then run it on this machine (CPU is fine)
    python -m tools.notebooks --execute       # run every notebook that runs on a CPU, timed

A notebook is the chapter's prose as markdown cells, one per part (cut at its `##` and `###`
headings; macros expanded to plain markdown: code excerpts become code blocks, admonitions
become blockquotes or `<details>` for `???` answers, images become attachments), with each
part followed by the cells that run it on the real engine, from the chapter's
`chapters/chNN_<slug>/notebook.py` (tools/notebook_parts.py). The chapter's main runs as code
cells where the prose shows it (`@@code examples/chNN_<slug>.py@@`), else after "Running it".
The main is cut into cells at its `# %%` markers when it has them, else at each
blank-line-separated run of top-level statements (imports stay together); its module
docstring becomes a markdown cell. A main guarded by `if __name__ == "__main__"` starts
processes that import it, so it runs as a script in one cell instead. A first code cell moves the kernel to the repository root,
so `minisgl` and `models/` are found wherever the notebook is opened from inside the
repository.

Decision: notebooks/ is generated and git-ignored. `mkdocs build` generates the same
notebooks into the site (site/notebooks/, linked from every chapter page), so the site never
links a stale notebook, and gives them the outputs `--execute` kept in outputs/notebooks/
(tools/notebook_outputs.py). Broken macros and parts that name no heading fail this tool
(exit 1) as they fail the strict build; `--execute` fails when a cell raises.
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import re
import sys
import time
from pathlib import Path
from typing import List, Optional, Tuple

import jupytext
import nbformat
from nbformat.notebooknode import NotebookNode

from tools import notebook_outputs, notebook_parts
from tools.docs.chapters import Chapter, chapter_by_key, load_chapters
from tools.docs.macros import MAIN_CELLS, Context, expand
from tools.docs.versioned import SourceVersions

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


_SCRIPT_CELL = """\
# This main starts processes of its own (it is guarded by `if __name__ == "__main__"`, so that
# they can import it), so it runs as a script, not cell by cell.
import subprocess

run = subprocess.run([sys.executable, "{main}"], capture_output=True, text=True)
print(run.stdout + (run.stderr if run.returncode else ""))
run.check_returncode()"""


def _main_cells(root: Path, chapter: Chapter) -> List[NotebookNode]:
    if not (chapter.main and (root / chapter.main).is_file()):
        return []
    source = (root / chapter.main).read_text(encoding="utf-8")
    if re.search(r"^if __name__ == .__main__.:", source, re.M):
        return [nbformat.v4.new_code_cell(_SCRIPT_CELL.format(main=chapter.main))]
    return [
        nbformat.v4.new_code_cell(text) if kind == "code" else nbformat.v4.new_markdown_cell(text)
        for kind, text in split_main(source, chapter.main)
    ]


@functools.lru_cache(maxsize=4)
def _source_versions(root: Path) -> SourceVersions:
    return SourceVersions(root)


def build_notebook(
    root: Path,
    chapter: Chapter,
    repo_url: str = "",
    errors: Optional[List[str]] = None,
    versions: Optional[SourceVersions] = None,
) -> NotebookNode:
    """The notebook of `chapter` (validated with nbformat), its listings in the chapter's
    version of each file. Broken macros, parts of notebook.py that name no heading and
    missing images go to `errors`."""
    errors = errors if errors is not None else []
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
        versions=versions if versions is not None else _source_versions(root),
    )
    result = expand(prose, ctx)
    errors.extend(result.errors)
    parts = notebook_parts.part_cells(chapter)
    found = notebook_parts.sections(plain_markdown(result.text))
    headings = {heading for heading, _ in found}
    for part, _ in parts:
        if part is not None and part not in headings:
            errors.append(
                f"chapters/{chapter.key}/{notebook_parts.COMPANION}: part {part!r} is no"
                f" heading of the chapter (its ## and ### headings: {sorted(h for h in headings if h)})"
            )
    main = _main_cells(root, chapter)
    shown = any(MAIN_CELLS in text for _, text in found)
    cells = [nbformat.v4.new_code_cell(_setup_cell(chapter.main))]
    setup = [cell for part, cell in parts if part is None]
    named = {part for part, _ in parts if part is not None}
    first_part = next((h for h, _ in found if h is not None and h in named), None)
    for heading, text in found:
        if heading == first_part:
            cells += setup
            setup = []
        before, marker, after = text.partition(MAIN_CELLS)
        cells += [nbformat.v4.new_markdown_cell(t.strip("\n")) for t in (before,) if t.strip()]
        if marker:
            cells += main
            if after.strip():
                cells.append(nbformat.v4.new_markdown_cell(after.strip("\n")))
        cells += [cell for part, cell in parts if part == heading and heading is not None]
        if not shown and main and heading == "Running it":
            cells.append(
                nbformat.v4.new_markdown_cell(f"Run the chapter's main, `{chapter.main}`:")
            )
            cells += main
            shown = True
    if not shown and main:
        cells.append(nbformat.v4.new_markdown_cell(f"## Run the chapter's main: `{chapter.main}`"))
        cells += main
    cells += setup  # no part named a heading: the set-up still runs, last
    for cell in cells:
        if cell.cell_type == "markdown":
            for name in notebook_parts.attach_images(cell, root):
                errors.append(f"chapters/{chapter.key}: image docs/assets/{name} does not exist")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["jupytext"] = {"notebook_metadata_filter": "-all"}
    nb.cells = cells
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
        "--execute",
        action="store_true",
        help="run the notebooks (with no chapters named: every one that runs on a CPU), keep "
        "their outputs in outputs/notebooks/, and fail on an error",
    )
    parser.add_argument(
        "--no-save", action="store_true", help="with --execute: leave outputs/notebooks/ alone"
    )
    parser.add_argument(
        "--with-parts",
        action="store_true",
        help="with no chapters named: only those whose chapters/chNN_<slug>/notebook.py exists",
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
    if args.with_parts and not args.chapters:
        chapters = [ch for ch in chapters if (ch.folder / notebook_parts.COMPANION).is_file()]
    if args.execute and not args.chapters:
        skipped = [ch for ch in chapters if notebook_parts.device(ch) != "cpu"]
        chapters = [ch for ch in chapters if ch not in skipped]
        for ch in skipped:
            print(f"skipped {ch.key}: its notebook needs {notebook_parts.device(ch)}")
    repo_url = _repo_url()
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    times: List[Tuple[str, int, float]] = []
    for ch in chapters:
        errors: List[str] = []
        nb = build_notebook(root, ch, repo_url, errors)
        if not args.execute:
            notebook_outputs.attach(root, ch.key, nb)
        path = args.out / f"{ch.key}.ipynb"
        path.write_text(notebook_json(nb), encoding="utf-8")
        for e in errors:
            print(f"error: {e}", file=sys.stderr)
        failed += bool(errors)
        shown = path.relative_to(root) if path.is_relative_to(root) else path
        print(f"wrote {shown} ({len(nb.cells)} cells)")
        if args.execute:
            from nbclient.exceptions import CellExecutionError

            start = time.perf_counter()
            try:
                executed = execute(path, root, args.timeout)
            except CellExecutionError as e:
                print(f"error: {ch.key} failed while executing:\n{e}", file=sys.stderr)
                failed += 1
                continue
            seconds = time.perf_counter() - start
            code = sum(c.cell_type == "code" for c in executed.cells)
            times.append((ch.key, code, seconds))
            path.write_text(notebook_json(executed), encoding="utf-8")
            if not args.no_save:
                notebook_outputs.save(root, ch.key, executed)
            print(f"executed {ch.key}: {code} code cells ran in {seconds:.1f} s")
    if len(times) > 1:
        print("\n".join(f"  {key:<24} {n:>3} code cells {s:>7.1f} s" for key, n, s in times))
        print(f"  {'all':<24} {sum(n for _, n, _ in times):>3} code cells", end="")
        print(f" {sum(s for _, _, s in times):>7.1f} s")
    return 1 if failed else 0


def _repo_url() -> str:
    """The book's repository when one is configured (mkdocs.yml reads the same variable)."""
    return os.environ.get("BOOK_REPO_URL", "")


if __name__ == "__main__":
    sys.exit(main())
