"""What an executed notebook printed, kept so that the site's notebooks carry their outputs.

`python -m tools.notebooks --execute ch07` runs the notebook and saves the outputs of every
code cell in `outputs/notebooks/ch07_scheduler.json`, each under a key: the SHA-256 of that
cell's source and of every code cell above it. `mkdocs build` generates the notebooks again
and gives a code cell the stored outputs only when its key matches, so a cell that changed,
or one below a cell that changed, shows no output until the notebook is executed again.
What a cell wrote to stderr (the engine's log lines, library warnings naming this machine's
paths) is not kept: the site shows what the cells print and draw.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Dict, List, Optional

from nbformat.notebooknode import NotebookNode, from_dict

STORE = Path("outputs") / "notebooks"


def cell_keys(nb: NotebookNode) -> List[Optional[str]]:
    """One key per cell (None for markdown): a hash of the code up to and including it."""
    digest = hashlib.sha256()
    keys: List[Optional[str]] = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            keys.append(None)
            continue
        digest.update(cell.source.encode("utf-8") + b"\0")
        keys.append(digest.copy().hexdigest()[:20])
    return keys


def _path(root: Path, name: str) -> Path:
    return root / STORE / f"{name}.json"


def save(root: Path, name: str, nb: NotebookNode) -> Path:
    """Keep the outputs of the executed notebook `nb` (chapter `name`, e.g. ch07_scheduler)."""
    cells: Dict[str, dict] = {}
    for key, cell in zip(cell_keys(nb), nb.cells):
        outputs = [o for o in cell.get("outputs", []) if o.get("name") != "stderr"]
        if key is not None and outputs:
            cells[key] = {"execution_count": cell.get("execution_count"), "outputs": outputs}
    path = _path(root, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cells": cells}, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def attach(root: Path, name: str, nb: NotebookNode) -> int:
    """Give the cells of `nb` the stored outputs whose keys match; return how many got some."""
    path = _path(root, name)
    if not path.is_file():
        return 0
    stored = json.loads(path.read_text(encoding="utf-8")).get("cells", {})
    given = 0
    for key, cell in zip(cell_keys(nb), nb.cells):
        if key is not None and key in stored:
            cell.outputs = [from_dict(o) for o in stored[key]["outputs"]]
            cell.execution_count = stored[key]["execution_count"]
            given += 1
    return given
