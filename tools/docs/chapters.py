"""The book's chapters and practice problems as the site, the notebooks and the outputs see them.

A chapter is a folder `chapters/chNN_<slug>/` holding `chapter.toml` (its manifest: title,
stage, main, tests, new/modified/early files, exercises) and `chapter.md` (its prose). A
practice problem is a folder `practice/exercises/<id>_<slug>/` whose `problem.md` gives its
title (TOML front matter between `+++` lines, `title = "..."`, or the first `# ` heading)
and difficulty (front matter `difficulty = "..."` or a line `Difficulty: medium`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import tomllib

_CHAPTER_DIR = re.compile(r"^ch(\d{2})_([a-z0-9_]+)$")
_EXERCISE_DIR = re.compile(r"^(\d+)_([A-Za-z0-9_\-]+)$")


@dataclass
class Chapter:
    """One chapter: `number` 7, `slug` "scheduler", and its manifest's fields."""

    number: int
    slug: str
    folder: Path
    manifest: Dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """`ch07_scheduler`: the folder name, the page name and the notebook name."""
        return f"ch{self.number:02d}_{self.slug}"

    @property
    def title(self) -> str:
        return str(self.manifest.get("title") or self.slug.replace("_", " ").capitalize())

    @property
    def stage(self) -> Optional[int]:
        stage = self.manifest.get("stage")
        return int(stage) if stage is not None else None

    @property
    def stage_title(self) -> Optional[str]:
        """The stage's name as the manifest gives it ("Scheduling it well: many requests at once")."""
        return self.manifest.get("stage_title")

    @property
    def main(self) -> Optional[str]:
        """The chapter's main, relative to the repository root (`examples/ch07_scheduler.py`)."""
        return self.manifest.get("main")

    @property
    def mains(self) -> List[str]:
        """The main and the manifest's `extra_mains`: every example this chapter runs."""
        extra = [str(p) for p in self.manifest.get("extra_mains", [])]
        return ([self.main] if self.main else []) + [p for p in extra if p != self.main]

    @property
    def exercises(self) -> List[int]:
        return [int(i) for i in self.manifest.get("exercises", [])]

    @property
    def prose_path(self) -> Path:
        return self.folder / "chapter.md"

    @property
    def page_uri(self) -> str:
        """Where the chapter lives in the site's docs tree: `chapters/ch07_scheduler.md`."""
        return f"chapters/{self.key}.md"

    @property
    def notebook_uri(self) -> str:
        return f"notebooks/{self.key}.ipynb"


def load_chapters(root: Path) -> List[Chapter]:
    """Every `chapters/chNN_<slug>/` under `root`, sorted by number.

    Raises ValueError naming the file when a `chapter.toml` does not parse.
    """
    chapters: List[Chapter] = []
    base = root / "chapters"
    if not base.is_dir():
        return chapters
    for folder in sorted(base.iterdir()):
        m = _CHAPTER_DIR.match(folder.name)
        if not (folder.is_dir() and m):
            continue
        manifest: Dict[str, Any] = {}
        toml_path = folder / "chapter.toml"
        if toml_path.is_file():
            try:
                manifest = tomllib.loads(toml_path.read_text(encoding="utf-8"))
            except tomllib.TOMLDecodeError as e:
                raise ValueError(f"{toml_path.relative_to(root)} does not parse: {e}") from e
        chapters.append(Chapter(int(m.group(1)), m.group(2), folder, manifest))
    return sorted(chapters, key=lambda c: c.number)


def chapter_by_number(root: Path, number: int) -> Chapter:
    for ch in load_chapters(root):
        if ch.number == number:
            return ch
    raise LookupError(f"no chapter {number} under {root / 'chapters'}")


def chapter_by_key(root: Path, key: str) -> Chapter:
    """Look a chapter up by `ch07`, `ch07_scheduler`, `7` or `07`."""
    m = re.match(r"^(?:ch)?(\d+)", key)
    if not m:
        raise LookupError(f"'{key}' does not name a chapter (use ch07 or 7)")
    return chapter_by_number(root, int(m.group(1)))


@dataclass
class Exercise:
    """A practice problem: `id` 191, its folder, title and difficulty from `problem.md`."""

    id: int
    slug: str
    folder: Path
    title: str
    difficulty: str

    @property
    def judge_command(self) -> str:
        return f"python practice/judge.py {self.id}"


_FRONT_MATTER = re.compile(r"\A\+\+\+\s*\n(.*?)\n\+\+\+\s*\n", re.S)


def _parse_problem(text: str) -> Dict[str, str]:
    info: Dict[str, str] = {}
    m = _FRONT_MATTER.match(text)
    if m:  # the judge checks the front matter's fields; the site shows two of them
        meta = tomllib.loads(m.group(1))
        info.update({k: str(meta[k]) for k in ("title", "difficulty") if k in meta})
        text = text[m.end() :]
    for line in text.splitlines():
        if "title" not in info and line.startswith("# "):
            info["title"] = line[2:].strip()
        d = re.match(r"^\W*difficulty\W*[:：]\W*([^\s*_|]+)", line.strip(), re.I)
        if d and "difficulty" not in info:
            info["difficulty"] = d.group(1).strip().lower()
    return info


def find_exercise(root: Path, exercise_id: int) -> Exercise:
    """The problem `exercise_id` under `root/practice/exercises/`.

    Raises LookupError when no `<id>_<slug>/problem.md` exists for it.
    """
    base = root / "practice" / "exercises"
    for folder in sorted(base.glob(f"{exercise_id}_*")) if base.is_dir() else []:
        m = _EXERCISE_DIR.match(folder.name)
        problem = folder / "problem.md"
        if m and int(m.group(1)) == exercise_id and problem.is_file():
            info = _parse_problem(problem.read_text(encoding="utf-8"))
            title = info.get("title") or m.group(2).replace("_", " ")
            # "Exercise 191: PrefillAdder" and "191. PrefillAdder" both become "PrefillAdder"
            title = re.sub(rf"^(exercise\s*)?{exercise_id}\s*[.:：\-]\s*", "", title, flags=re.I)
            return Exercise(exercise_id, m.group(2), folder, title, info.get("difficulty", ""))
    raise LookupError(f"practice/exercises/{exercise_id}_<slug>/problem.md does not exist")


def all_exercises(root: Path) -> List[Exercise]:
    base = root / "practice" / "exercises"
    found: List[Exercise] = []
    for folder in sorted(base.iterdir()) if base.is_dir() else []:
        m = _EXERCISE_DIR.match(folder.name)
        if m and (folder / "problem.md").is_file():
            found.append(find_exercise(root, int(m.group(1))))
    return sorted(found, key=lambda e: e.id)
