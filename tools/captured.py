"""What an example printed under ``tools.steps check``, kept for ``tools.outputs --check``.

``python -m tools.steps check`` runs every chapter main in its chapter's step tree
(``build/steps/NN``; a ``final_mains`` entry in the repository) exactly as
``python -m tools.outputs`` runs it to capture its output: the same tree, interpreter and
environment (``ENV``). Each successful run's stdout is saved in
``build/steps/stdout/<name>.json`` with a *fingerprint*: the SHA-256 of every file the run
could import or read (everything in the step tree but the generated ``sitecustomize.py`` and
``check.log``; for a run in the repository, the same top-level folders), the size and
modification time of every file under ``models/``, the interpreter, the environment
variables that change what an engine computes (``RESULT_ENV``, ``MINISGL_*``), and the
chapter.

``tools.outputs --check --from-steps`` takes a saved stdout instead of rerunning the example
only when that fingerprint, recomputed now from the repository's files as that chapter cuts
them (tools/versions.py), is identical: the same code, data and settings ran. A run is saved
only if it succeeded and the step tree's import guard hid nothing from it (no
``try: import minisgl.x`` fallback taken). What it printed can still differ where the output
shows the working directory (an absolute path): such a capture would be reported stale,
never pass wrongly.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Dict, Iterable, Optional

__all__ = ["ENV", "STORE", "GUARD_MISSES", "fingerprint", "save", "forget", "load"]

# how an example runs when its output is captured or checked (outputs.py and steps.py)
ENV = {"PYTHONHASHSEED": "0", "PYTHONIOENCODING": "utf-8"}
# where steps.py keeps the stdout of its runs, relative to the repository root
STORE = Path("build") / "steps" / "stdout"
# variables (besides MINISGL_*) a run's numbers may depend on: thread counts, devices
RESULT_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTHONHASHSEED")
# where a step tree's import guard notes the modules it hid from a main (steps.py)
GUARD_MISSES = "guard_misses.txt"
# generated into a step tree by steps.py, not copied from the repository
GENERATED = {"sitecustomize.py", "check.log", "models", GUARD_MISSES}
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".hypothesis"}


def _file_hashes(base: Path, tops: Iterable[str]) -> Dict[str, str]:
    """``{relative path: sha256}`` of the files under ``base/top`` for each top (a file or a
    folder; symbolic links are not followed, caches are skipped)."""
    out: Dict[str, str] = {}
    for top in sorted(set(tops) - GENERATED):
        path = base / top
        if path.is_file() and not path.is_symlink():
            out[top] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.is_dir() and not path.is_symlink():
            for dirpath, dirnames, filenames in os.walk(path):
                dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
                for name in sorted(filenames):
                    if name.endswith(".pyc"):
                        continue
                    f = Path(dirpath) / name
                    out[f.relative_to(base).as_posix()] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def _models(root: Path) -> Dict[str, list]:
    models = (root / "models").resolve()
    if not models.is_dir():
        return {}
    return {
        f.relative_to(models).as_posix(): [f.stat().st_size, f.stat().st_mtime_ns]
        for f in sorted(models.rglob("*"))
        if f.is_file()
    }


def _settings() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in RESULT_ENV or k.startswith("MINISGL_")}
    env.update(ENV)
    return {"python": sys.executable, **dict(sorted(env.items()))}


def fingerprint(base: Path, tops: Iterable[str], root: Path, chapter: Optional[int] = None) -> dict:
    """What a run of an example in ``base`` depends on (see the module docstring): the files
    under ``tops`` of ``base``, the models of ``root``, the interpreter and settings, and the
    ``chapter`` whose tree ``base`` is (None: the repository itself)."""
    return {
        "files": _file_hashes(base, tops),
        "models": _models(root),
        "settings": _settings(),
        "chapter": chapter,
    }


def _versions_now(root: Path, files: Iterable[str], chapter: Optional[int]) -> Dict[str, str]:
    """``{relative path: sha256}`` of chapter ``chapter``'s version of each file of the
    repository (the file itself for None, and for the book's own ``tools/``)."""
    from tools import versions

    out: Dict[str, str] = {}
    for rel in files:
        path = root / rel
        if not path.is_file():
            continue
        data = path.read_bytes()
        if chapter is not None and rel.endswith(".py") and not rel.startswith("tools/"):
            data = versions.version(data.decode("utf-8"), chapter, rel).encode("utf-8")
        out[rel] = hashlib.sha256(data).hexdigest()
    return out


def _path(root: Path, name: str) -> Path:
    return root / STORE / f"{name}.json"


def save(root: Path, name: str, stdout: str, print_: dict) -> None:
    """Keep the stdout of a successful run of ``examples/<name>.py`` with its fingerprint."""
    path = _path(root, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"stdout": stdout, "fingerprint": print_}), encoding="utf-8")
    os.replace(tmp, path)


def forget(root: Path, name: str) -> None:
    """Drop a saved stdout (its example failed this time)."""
    _path(root, name).unlink(missing_ok=True)


def load(root: Path, name: str) -> Optional[str]:
    """The saved stdout of ``examples/<name>.py`` if its fingerprint still holds for the
    repository at ``root`` (same files, as the run's chapter cuts them, models, interpreter
    and settings); else None."""
    try:
        saved = json.loads(_path(root, name).read_text(encoding="utf-8"))
        stdout, then = saved["stdout"], saved["fingerprint"]
        if f"examples/{name}.py" not in then["files"]:
            return None
        now_files = _versions_now(root, then["files"], then.get("chapter"))
        if any(now_files.get(rel) != digest for rel, digest in then["files"].items()):
            return None
        if then["models"] != _models(root) or then["settings"] != _settings():
            return None
        return stdout
    except (OSError, ValueError, KeyError, TypeError):
        return None
