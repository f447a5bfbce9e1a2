"""Chapter manifests: which files each chapter brings in, and the "files so far" tree.

Every engine file exists once, in its final form, under ``minisgl/``; where a later chapter
adds lines to it, markers say which (``tools/versions.py``), and chapter N's version of the
file is cut from it. A chapter's ``chapters/chNN_<slug>/chapter.toml`` says which files it
brings into the tree:

    title = "The scheduler skeleton and the offline interface"
    stage = 2
    main = "examples/ch07_scheduler.py"
    tests = ["tests/test_ch07_scheduler.py"]
    new = ["minisgl/scheduler/decode.py", ...]        # explained in this chapter
    exercises = [191]
    [early."minisgl/scheduler/io.py"]                  # needed now, explained later
    chapter = 14
    why = "the I/O methods the scheduler's loop calls"
    # optional:
    final_mains = ["examples/ch00_quickstart.py"]      # run against the full tree by `check`
    extra_mains = ["examples/ch00_tiny_engine.py"]     # more mains run in the chapter's tree
    extra = ["examples/helpers.py"]                    # other files the chapter's tree needs

Which earlier files a chapter *modifies* is not written down: it is every file whose markers
name the chapter. This module reads the manifests, checks them (``static_problems``), works
out the status of every file at a chapter (``files_so_far``) and draws the tree
(``render_tree``). It has no state of its own: each call reads the manifests again, so the
docs hook always sees the current files. ``python -m tools.steps`` is the command line on
top of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

from tools import versions

ROOT = Path(__file__).resolve().parents[1]
ENGINE = "minisgl"  # the package the tree shows; `new` and `early` files live under it
EXAMPLES = "examples"  # every script here must be some chapter's main (or extra/final main)
CHAPTER_DIR = re.compile(r"^ch(\d{2})_([a-z0-9_]+)$")
STATUSES = ("new", "modified", "early", "unchanged")
IGNORED_PARTS = {"__pycache__"}
IGNORED_SUFFIXES = {".pyc", ".pyo"}


@dataclass
class Manifest:
    """One chapter's ``chapter.toml``. Paths are POSIX paths relative to the repository root."""

    number: int
    slug: str
    title: str
    stage: int
    main: str
    tests: list[str]
    new: list[str] = field(default_factory=list)
    early: dict[str, int] = field(default_factory=dict)  # path -> chapter that explains it
    early_why: dict[str, str] = field(default_factory=dict)  # path -> why it comes early
    exercises: list[int] = field(default_factory=list)
    final_mains: list[str] = field(default_factory=list)
    extra_mains: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    stage_title: str = ""
    path: Path = Path()  # the chapter directory

    @property
    def name(self) -> str:
        """``chNN_<slug>``, the name shared by the chapter dir, its main and its tests."""
        return f"ch{self.number:02d}_{self.slug}"

    @property
    def introduced(self) -> list[str]:
        """Files this chapter brings into the tree: new ones, then the early ones."""
        return [*self.new, *self.early]

    @property
    def listed(self) -> list[str]:
        """Every path the manifest names (all must exist)."""
        return [
            *self.introduced,
            self.main,
            *self.tests,
            *self.final_mains,
            *self.extra_mains,
            *self.extra,
        ]

    @property
    def tree_files(self) -> list[str]:
        """Files this chapter adds to its step tree (``build/steps/NN``)."""
        return [*self.introduced, self.main, *self.extra_mains, *self.tests, *self.extra]


def _str_list(data: dict, key: str, where: Path) -> list[str]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: '{key}' must be a list of paths")
    return list(value)


def parse_manifest(toml_path: Path) -> Manifest:
    """Read one ``chapter.toml``; the number and slug come from its directory name.

    Raises ValueError naming the file when the directory name or a key is malformed.
    """
    match = CHAPTER_DIR.match(toml_path.parent.name)
    if not match:
        raise ValueError(f"{toml_path}: chapter directories are named chNN_<slug>")
    with toml_path.open("rb") as f:
        data = tomllib.load(f)
    for key in ("title", "stage", "main"):
        if key not in data:
            raise ValueError(f"{toml_path}: missing key '{key}'")
    early: dict[str, int] = {}
    early_why: dict[str, str] = {}
    for path, spec in (data.get("early") or {}).items():
        if not isinstance(spec, dict) or not isinstance(spec.get("chapter"), int):
            raise ValueError(
                f'{toml_path}: early file {path!r} needs a table: chapter = N, why = "..."'
            )
        early[path], early_why[path] = spec["chapter"], str(spec.get("why", ""))
    if "modified" in data:
        raise ValueError(
            f"{toml_path}: 'modified' is worked out from the markers in the files; remove it"
        )
    exercises = data.get("exercises", [])
    if not isinstance(exercises, list) or not all(isinstance(v, int) for v in exercises):
        raise ValueError(f"{toml_path}: 'exercises' must be a list of exercise ids")
    return Manifest(
        number=int(match.group(1)),
        slug=match.group(2),
        title=str(data["title"]),
        stage=int(data["stage"]),
        stage_title=str(data.get("stage_title", "")),
        main=str(data["main"]),
        tests=_str_list(data, "tests", toml_path),
        new=_str_list(data, "new", toml_path),
        early=early,
        early_why=early_why,
        exercises=list(exercises),
        final_mains=_str_list(data, "final_mains", toml_path),
        extra_mains=_str_list(data, "extra_mains", toml_path),
        extra=_str_list(data, "extra", toml_path),
        path=toml_path.parent,
    )


def load_manifests(root: Path | None = None) -> list[Manifest]:
    """All chapter manifests under ``root/chapters``, sorted by chapter number."""
    chapters = (root or ROOT) / "chapters"
    found = [parse_manifest(p) for p in sorted(chapters.glob("ch*/chapter.toml"))]
    return sorted(found, key=lambda m: m.number)


def get_manifest(n: int, manifests: list[Manifest] | None = None) -> Manifest:
    """The manifest of chapter ``n``; KeyError if there is none."""
    for m in manifests if manifests is not None else load_manifests():
        if m.number == n:
            return m
    raise KeyError(f"no chapter {n} (no chapters/ch{n:02d}_*/chapter.toml)")


def introduced_in(manifests: list[Manifest]) -> dict[str, int]:
    """Path -> the chapter that brings it into the tree (the first one, if listed twice)."""
    first: dict[str, int] = {}
    for m in manifests:
        for path in m.introduced:
            first.setdefault(path, m.number)
    return first


def files_so_far(n: int, manifests: list[Manifest] | None = None) -> dict[str, str]:
    """Every file introduced in chapters 0..n, in order of introduction, with its status at n.

    The status is "new" (explained in chapter n), "modified" (introduced earlier, and a
    marker in it names chapter n), "early" (brought in by n, explained later) or "unchanged".
    """
    manifests = manifests if manifests is not None else load_manifests()
    status: dict[str, str] = {}
    for m in manifests:
        if m.number > n:
            break
        for path in m.introduced:
            status.setdefault(path, "unchanged")
        if m.number == n:
            root = m.path.parent.parent
            for path in status:
                if path.endswith(".py") and (root / path).is_file():
                    if versions.changes_in((root / path).read_text(encoding="utf-8"), n, path):
                        status[path] = "modified"
            for path in m.new:
                status[path] = "new"
            for path in m.early:
                status[path] = "early"
    return status


# ----------------------------------------------------------------------------- the tree


@dataclass
class _Folder:
    files: list[tuple[str, str]] = field(default_factory=list)  # (name, marker)
    folders: dict[str, "_Folder"] = field(default_factory=dict)
    changed: bool = False

    def count(self) -> int:
        return len(self.files) + sum(f.count() for f in self.folders.values())


def _marker(path: str, status: str, manifest: Manifest | None) -> str:
    if status == "new":
        return "  ← new in this chapter"
    if status == "modified":
        return "  ← modified in this chapter"
    if status == "early":
        later = manifest.early[path] if manifest else "?"
        return f"  ← brought in early (explained in chapter {later}; see below)"
    return ""


def _draw(folder: _Folder, prefix: str, lines: list[str]) -> None:
    # files first, in the order the book introduces them; then the subfolders by name
    for name, marker in folder.files:
        lines.append(f"{prefix}├── {name}{marker}")
    for name in sorted(folder.folders):
        sub = folder.folders[name]
        if sub.changed:
            lines.append(f"{prefix}├── {name}/")
            _draw(sub, prefix + "│   ", lines)
        else:
            k = sub.count()
            lines.append(f"{prefix}├── {name}/  ({k} file{'s' if k != 1 else ''}, unchanged)")


def render_tree(n: int, fmt: str = "text", manifests: list[Manifest] | None = None) -> str:
    """The engine tree at chapter ``n``, as printed by ``python -m tools.steps tree N``.

    The header counts this chapter's changes ("Files so far: 61 (9 new, 2 modified, 1
    brought in early)"), then ``minisgl/`` is drawn with each changed file marked and each
    folder without changes collapsed to ``name/  (K files, unchanged)``; last, why each file
    brought in early is needed. ``fmt="markdown"``
    wraps the same text in a fenced ``text`` block. Raises ValueError for another fmt.
    """
    if fmt not in ("text", "markdown"):
        raise ValueError(f"fmt must be 'text' or 'markdown', got {fmt!r}")
    manifests = manifests if manifests is not None else load_manifests()
    try:
        manifest: Manifest | None = get_manifest(n, manifests)
    except KeyError:
        manifest = None
    files = {p: s for p, s in files_so_far(n, manifests).items() if p.startswith(ENGINE + "/")}
    counts = {s: sum(1 for v in files.values() if v == s) for s in STATUSES}
    header = (
        f"Files so far: {len(files)} ({counts['new']} new, {counts['modified']} modified,"
        f" {counts['early']} brought in early)"
    )

    root = _Folder(changed=True)
    for path, status in files.items():
        *dirs, name = path.split("/")[1:]
        folder = root
        for d in dirs:
            folder = folder.folders.setdefault(d, _Folder())
            folder.changed |= status != "unchanged"
        folder.files.append((name, _marker(path, status, manifest)))

    lines = [header, "", f"{ENGINE}/" + ("" if files else "  (no files yet)")]
    _draw(root, "", lines)
    early = [p for p, s in files.items() if s == "early"]
    if early and manifest is not None:
        lines += ["", "Brought in early:"]
        for path in early:
            lines.append(
                f"  {path.removeprefix(ENGINE + '/')} (chapter {manifest.early[path]}): "
                f"{manifest.early_why.get(path, '')}"
            )
    text = "\n".join(lines)
    return f"```text\n{text}\n```" if fmt == "markdown" else text


# ----------------------------------------------------------------------- static checks


def engine_files_on_disk(root: Path) -> list[str]:
    """Every file under ``root/minisgl`` (no caches), as sorted repo-relative paths."""
    base = root / ENGINE
    if not base.is_dir():
        return []
    out = []
    for p in base.rglob("*"):
        rel = p.relative_to(root)
        if p.is_file() and not IGNORED_PARTS & set(rel.parts) and p.suffix not in IGNORED_SUFFIXES:
            out.append(rel.as_posix())
    return sorted(out)


def static_problems(
    manifests: list[Manifest], root: Path | None = None, allow_unlisted: bool = False
) -> list[str]:
    """What is wrong with the manifests as a whole; an empty list means nothing.

    Checks: chapter numbers are unique; every file is introduced (new or early) exactly
    once; new/early files live under minisgl/; an early file is explained in a later
    chapter; a modified file was introduced in an earlier chapter; every listed file
    exists; every file under minisgl/ is introduced by some chapter, and every script in
    examples/ is some chapter's main (both skipped with allow_unlisted).
    """
    root = root or ROOT
    problems: list[str] = []
    seen_numbers: dict[int, Manifest] = {}
    for m in manifests:
        if m.number in seen_numbers:
            problems.append(
                f"chapter {m.number} has two manifests: "
                f"{seen_numbers[m.number].path.name} and {m.path.name}"
            )
        seen_numbers[m.number] = m

    first: dict[str, tuple[int, str]] = {}
    for m in manifests:
        kinds = [(p, "new") for p in m.new] + [(p, "early") for p in m.early]
        for path, kind in kinds:
            if path in first:
                c, k = first[path]
                problems.append(
                    f"{path} is introduced twice: chapter {c} ({k}) and chapter {m.number} ({kind})"
                )
            else:
                first[path] = (m.number, kind)
            if not path.startswith(ENGINE + "/"):
                problems.append(
                    f"chapter {m.number}: {path} is listed as {kind} but is not "
                    f"under {ENGINE}/ (list it as main, tests or extra)"
                )
        for path, later in m.early.items():
            if later <= m.number:
                problems.append(
                    f"chapter {m.number}: {path} is brought in early but "
                    f"explained in chapter {later}, which is not later"
                )
    for m in manifests:
        for path, why in m.early_why.items():
            if not why.strip():
                problems.append(
                    f"chapter {m.number}: {path} is brought in early without a reason (why = ...)"
                )

    for m in manifests:
        for path in dict.fromkeys(m.listed):
            if not (root / path).is_file():
                problems.append(
                    f"chapter {m.number}: {path} is listed in "
                    f"{m.path.name}/chapter.toml but does not exist"
                )
    if not allow_unlisted:
        for path in engine_files_on_disk(root):
            if path not in first:
                problems.append(f"{path} is in the engine but no chapter introduces it")
        mains = {p for m in manifests for p in [m.main, *m.extra_mains, *m.final_mains, *m.extra]}
        for example in sorted((root / EXAMPLES).glob("*.py")):
            rel = example.relative_to(root).as_posix()
            if rel not in mains:
                problems.append(f"{rel} is in no chapter manifest, so check never runs it")
    return problems
