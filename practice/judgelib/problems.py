"""Exercises on disk: `practice/exercises/<id>_<slug>/problem.md` and its files.

problem.md starts with a small YAML-like front matter (``key: value`` lines, lists written
``[a, b]`` or as ``- item`` lines), then markdown. A ``## Hints`` section holds bullets; a
bullet that starts with a backticked test name (``- `test_name`: ...``) is shown when that
test fails, the others are general hints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

DEFAULT_TIME_LIMIT = 20.0  # seconds per case
DEFAULT_TOTAL_LIMIT = 300.0  # seconds for the whole run


@dataclass
class Problem:
    id: int
    slug: str
    dir: Path
    title: str
    chapter: int
    difficulty: str
    module: str  # engine path the learner's file replaces, e.g. minisgl/scheduler/prefill.py
    symbols: List[str]
    tests: List[str]  # chapter tests (paths or node ids, relative to the repo root)
    gpu: bool
    requires: List[str]  # repo paths that must exist (e.g. a model directory)
    time_limit: float
    total_time_limit: float
    body: str
    hints: List[Tuple[Optional[str], str]] = field(default_factory=list)

    @property
    def starter(self) -> Path:
        return self.dir / "starter.py"

    @property
    def own_tests(self) -> List[Path]:
        return sorted(self.dir.glob("test_*.py"))

    @property
    def workspace_name(self) -> str:
        return f"{self.id}_{self.slug}.py"

    @property
    def module_name(self) -> str:
        return self.module[: -len(".py")].replace("/", ".").removesuffix(".__init__")

    def statement(self) -> str:
        """The body without the hints, for `start`."""
        return _split_sections(self.body)[0].strip()

    def hint_for(self, test_name: str, general: bool = True) -> Optional[str]:
        """The hint keyed by this test, else (if ``general``) the first general hint."""
        for key, text in self.hints:
            if key and key in test_name:
                return text
        if not general:
            return None
        general_hints = [text for key, text in self.hints if key is None]
        return general_hints[0] if general_hints else None


def _parse_value(raw: str):
    raw = raw.strip()
    if raw.startswith("[") and raw.endswith("]"):
        inner = raw[1:-1].strip()
        return [_parse_value(x) for x in inner.split(",")] if inner else []
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        return raw[1:-1]
    if raw.lower() in ("true", "yes"):
        return True
    if raw.lower() in ("false", "no"):
        return False
    if re.fullmatch(r"-?\d+", raw):
        return int(raw)
    if re.fullmatch(r"-?\d+\.\d*", raw):
        return float(raw)
    return raw


def parse_front_matter(text: str) -> Tuple[Dict[str, object], str]:
    """Split ``---`` front matter from the markdown body; raise ValueError if malformed."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        raise ValueError("problem.md must start with a '---' front matter block")
    meta: Dict[str, object] = {}
    last_key = None
    for i, line in enumerate(lines[1:], start=1):
        if line.strip() == "---":
            return meta, "\n".join(lines[i + 1 :])
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.lstrip().startswith("- ") and last_key is not None:
            if not isinstance(meta[last_key], list):
                meta[last_key] = []
            meta[last_key].append(_parse_value(line.lstrip()[2:]))  # type: ignore[union-attr]
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"front matter line {i + 1}: expected 'key: value', got {line!r}")
        last_key = key.strip()
        meta[last_key] = _parse_value(value) if value.strip() else []
    raise ValueError("front matter is not closed by '---'")


def _split_sections(body: str) -> Tuple[str, str]:
    """(body without the Hints section, the Hints section's text)."""
    m = re.search(r"^##\s+Hints\s*$", body, flags=re.M)
    if not m:
        return body, ""
    rest = body[m.end() :]
    n = re.search(r"^##\s", rest, flags=re.M)
    hints = rest[: n.start()] if n else rest
    after = rest[n.start() :] if n else ""
    return body[: m.start()] + after, hints


def _parse_hints(section: str) -> List[Tuple[Optional[str], str]]:
    items: List[List[str]] = []
    for line in section.splitlines():
        if line.startswith("- ") or line.startswith("* "):
            items.append([line[2:].strip()])
        elif line.strip() and items:
            items[-1].append(line.strip())
    hints: List[Tuple[Optional[str], str]] = []
    for item in items:
        text = " ".join(item)
        m = re.match(r"`([\w\[\]\-.:]+)`\s*:\s*(.*)", text)
        hints.append((m.group(1), m.group(2)) if m else (None, text))
    return hints


def _as_list(value) -> List[str]:
    if value in (None, ""):
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def load_problem(directory: Path) -> Problem:
    path = directory / "problem.md"
    meta, body = parse_front_matter(path.read_text(encoding="utf-8"))
    missing = [k for k in ("id", "title", "chapter", "module") if k not in meta]
    if missing:
        raise ValueError(f"{path}: front matter lacks {', '.join(missing)}")
    pid = int(meta["id"])  # type: ignore[arg-type]
    prefix = f"{pid}_"
    if not directory.name.startswith(prefix):
        raise ValueError(f"{directory.name}: directory must be named {prefix}<slug>")
    return Problem(
        id=pid,
        slug=directory.name[len(prefix) :],
        dir=directory,
        title=str(meta["title"]),
        chapter=int(meta["chapter"]),  # type: ignore[arg-type]
        difficulty=str(meta.get("difficulty", "medium")),
        module=str(meta["module"]),
        symbols=_as_list(meta.get("symbols")),
        tests=_as_list(meta.get("tests")),
        gpu=bool(meta.get("gpu", False)),
        requires=_as_list(meta.get("requires")),
        time_limit=float(meta.get("time_limit", DEFAULT_TIME_LIMIT)),  # type: ignore[arg-type]
        total_time_limit=float(meta.get("total_time_limit", DEFAULT_TOTAL_LIMIT)),  # type: ignore[arg-type]
        body=body,
        hints=_parse_hints(_split_sections(body)[1]),
    )


def load_all(exercises_dir: Path) -> List[Problem]:
    if not exercises_dir.is_dir():
        return []
    dirs = [d for d in exercises_dir.iterdir() if (d / "problem.md").is_file()]
    return sorted((load_problem(d) for d in dirs), key=lambda p: p.id)


def find(exercises_dir: Path, pid: int) -> Problem:
    for d in exercises_dir.glob(f"{pid}_*"):
        if (d / "problem.md").is_file():
            return load_problem(d)
    raise KeyError(pid)
