"""Exercises on disk: `practice/exercises/<id>_<slug>/problem.md` and its files.

problem.md starts with TOML front matter between two ``+++`` lines (the fields of
``Problem``; see practice/README.md), then markdown. A ``## Hints`` section holds bullets; a
bullet that starts with a backticked test name (``- `test_name`: ...``) is shown when that
test fails, the others are general hints. Beside it: the exercise's ``test_*.py`` and, in
``broken/``, its known wrong answers (``broken.py``), and in ``slow/``, answers that are right
but too slow for an exercise graded on speed (a ``[speed]`` table, ``speed.py``).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, from PyPI (a dependency on 3.10)
    import tomli as tomllib

DEFAULT_TIME_LIMIT = 20.0  # seconds per case
DEFAULT_TOTAL_LIMIT = 300.0  # seconds for the whole run


@dataclass
class Speed:
    """The speed part of an exercise (``[speed]`` in the front matter): after every case
    passes, the learner's module and the engine's own are timed in one run on a CUDA GPU."""

    bench: str  # the benchmark module beside problem.md (its workloads; speed.py)
    threshold: float  # the reference's median time over the learner's must reach this
    warmup: int = 10  # untimed calls of each side first (compilation, caches, clocks)
    repeat: int = 50  # timed calls of each side, interleaved; the median counts
    time_limit: float = 300.0  # seconds for the whole speed run


SPEED_FIELDS = {
    "bench": "a string",
    "threshold": "a number",
    "warmup": "an integer",
    "repeat": "an integer",
    "time_limit": "a number",
}


def _speed(value: Any, name: str) -> Optional[Speed]:
    """The ``[speed]`` table as a Speed; ValueError naming ``name`` and the key when wrong."""
    if value is None:
        return None
    for key, v in value.items():
        if key not in SPEED_FIELDS:
            raise ValueError(f"{name}: unknown key speed.{key} (known: {', '.join(SPEED_FIELDS)})")
        if not _KINDS[SPEED_FIELDS[key]](v):
            raise ValueError(f"{name}: speed.{key} = {v!r} is not {SPEED_FIELDS[key]}")
    if "bench" not in value or "threshold" not in value:
        raise ValueError(f"{name}: the [speed] table needs bench and threshold")
    speed = Speed(
        bench=value["bench"],
        threshold=float(value["threshold"]),
        warmup=value.get("warmup", 10),
        repeat=value.get("repeat", 50),
        time_limit=float(value.get("time_limit", 300.0)),
    )
    if not 0 < speed.threshold or speed.warmup < 0 or speed.repeat < 1:
        raise ValueError(f"{name}: [speed] needs threshold > 0, warmup >= 0 and repeat >= 1")
    return speed


@dataclass
class Problem:
    id: int
    slug: str
    dir: Path
    title: str
    chapter: int
    difficulty: str
    module: str  # engine path the learner's file replaces, e.g. minisgl/scheduler/prefill.py
    symbols: List[str]  # the functions and methods (``Class.method``) the learner writes
    omit: List[str]  # statements of the module the starter leaves out (starter.py)
    tests: List[str]  # chapter tests (paths or node ids, relative to the repo root)
    gpu: bool
    triton: bool  # its kernels run in Triton's interpreter where there is no GPU
    requires: List[str]  # repo paths that must exist (e.g. a model directory)
    time_limit: float
    total_time_limit: float
    body: str
    hints: List[Tuple[Optional[str], str]] = field(default_factory=list)
    speed: Optional[Speed] = None  # graded on speed too (on a CUDA GPU)
    # cases (fnmatch patterns of node ids) whose record is not compared, because what the
    # code returns there carries a clock or a random id (a server's answers)
    unrecorded: List[str] = field(default_factory=list)
    # the functions whose calls the judge records (default: ``symbols``); a Triton kernel is
    # recorded through the Python function that launches it
    record: List[str] = field(default_factory=list)

    @property
    def own_tests(self) -> List[Path]:
        return sorted(self.dir.glob("test_*.py"))

    @property
    def wrong_answers(self) -> List[Path]:
        """``broken/*.toml``: the known wrong answers `check` proves the tests catch."""
        return sorted(self.dir.glob("broken/*.toml"))

    @property
    def slow_answers(self) -> List[Path]:
        """``slow/*.toml``: right but slow answers `check` proves the speed part catches."""
        return sorted(self.dir.glob("slow/*.toml"))

    @property
    def workspace_name(self) -> str:
        return f"{self.id}_{self.slug}.py"

    @property
    def module_name(self) -> str:
        return self.module[: -len(".py")].replace("/", ".").removesuffix(".__init__")

    def recorded(self, case: str) -> bool:
        """Whether ``case``'s record is compared with the engine's (``unrecorded``)."""
        import fnmatch

        return not any(fnmatch.fnmatchcase(case, pattern) for pattern in self.unrecorded)

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


FENCE = "+++"
_KINDS = {  # bool is an int in Python, and never a valid id, chapter or limit
    "an integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "a number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "a string": lambda v: isinstance(v, str),
    "true or false": lambda v: isinstance(v, bool),
    "a list of strings": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "a table": lambda v: isinstance(v, dict),
}
FIELDS = {  # the keys of the front matter, and what each holds
    "id": "an integer",
    "title": "a string",
    "chapter": "an integer",
    "difficulty": "a string",
    "module": "a string",
    "symbols": "a list of strings",
    "omit": "a list of strings",
    "tests": "a list of strings",
    "gpu": "true or false",
    "triton": "true or false",
    "requires": "a list of strings",
    "time_limit": "a number",
    "total_time_limit": "a number",
    "speed": "a table",
    "unrecorded": "a list of strings",
    "record": "a list of strings",
}
REQUIRED = ("id", "title", "chapter", "module", "symbols")


def parse_front_matter(text: str, name: str = "problem.md") -> Tuple[Dict[str, Any], str]:
    """Split the TOML front matter between ``+++`` lines from the markdown body; raise
    ValueError naming ``name`` when it is missing, unclosed, not TOML, or has a key or a
    type this judge does not know."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != FENCE:
        raise ValueError(f"{name} must start with a '{FENCE}' line (TOML front matter)")
    close = next((i for i, ln in enumerate(lines[1:], 1) if ln.strip() == FENCE), None)
    if close is None:
        raise ValueError(f"{name}: the front matter is not closed by a '{FENCE}' line")
    try:
        meta = tomllib.loads("".join(lines[1:close]))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{name}: front matter: {e}") from None
    for key, value in meta.items():
        if key not in FIELDS:
            raise ValueError(
                f"{name}: unknown front matter key {key!r} (known: {', '.join(FIELDS)})"
            )
        if not _KINDS[FIELDS[key]](value):
            raise ValueError(f"{name}: {key} = {value!r} is not {FIELDS[key]}")
    missing = [k for k in REQUIRED if k not in meta]
    if missing:
        raise ValueError(f"{name}: front matter lacks {', '.join(missing)}")
    return meta, "".join(lines[close + 1 :])


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


def load_problem(directory: Path) -> Problem:
    path = directory / "problem.md"
    meta, body = parse_front_matter(path.read_text(encoding="utf-8"), str(path))
    pid = meta["id"]
    prefix = f"{pid}_"
    if not directory.name.startswith(prefix):
        raise ValueError(f"{directory.name}: directory must be named {prefix}<slug>")
    return Problem(
        id=pid,
        slug=directory.name[len(prefix) :],
        dir=directory,
        title=meta["title"],
        chapter=meta["chapter"],
        difficulty=meta.get("difficulty", "medium"),
        module=meta["module"],
        symbols=meta["symbols"],
        omit=meta.get("omit", []),
        tests=meta.get("tests", []),
        gpu=meta.get("gpu", False),
        triton=meta.get("triton", False),
        requires=meta.get("requires", []),
        time_limit=float(meta.get("time_limit", DEFAULT_TIME_LIMIT)),
        total_time_limit=float(meta.get("total_time_limit", DEFAULT_TOTAL_LIMIT)),
        body=body,
        hints=_parse_hints(_split_sections(body)[1]),
        speed=_speed(meta.get("speed"), str(path)),
        unrecorded=meta.get("unrecorded", []),
        record=meta.get("record", []),
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
