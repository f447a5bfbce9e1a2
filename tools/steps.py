"""Rebuild the book's source tree chapter by chapter, and prove each step runs on its own.

    python -m tools.steps list              # the chapters and what each introduces
    python -m tools.steps tree 7            # "Files so far: ..." and the minisgl/ tree
    python -m tools.steps tree 7 --format markdown
    python -m tools.steps show 7 minisgl/scheduler/scheduler.py   # chapter 7's version of a file
    python -m tools.steps changes 11        # what chapter 11 changed: new files, and diffs
    python -m tools.steps run 7 [--trace t.json]   # chapter 7's main in chapter 7's tree
    python -m tools.steps check             # every chapter (plus the static checks)
    python -m tools.steps check 5 6 --jobs 2
    python -m tools.steps check --static-only   # manifests and every version, nothing run

``check N`` copies the files of chapters 0..N, plus the infrastructure every chapter may use
(INFRASTRUCTURE below; ``models/`` is linked, not copied), into ``build/steps/NN/``, then
imports every engine module so far, and runs the chapter's main(s) and tests there with
``PYTHONPATH`` set to that folder (the log is kept in ``build/steps/NN/check.log``). A
``sitecustomize.py`` written into the folder makes ``import minisgl`` resolve only to the
copy: an installed (even editable) minisgl cannot fill in a module the chapter has not
introduced yet. When a step fails for that reason, the failure names the file and the
chapter that introduces it ("chapter 5 reaches forward: ..."). Mains listed in a manifest's
``final_mains`` preview the finished engine and run against the full repository instead.
Every main runs as ``python -m tools.outputs`` runs it; the stdout of each successful run is
kept in ``build/steps/stdout/`` with a fingerprint of what it ran (tools/captured.py), for
``python -m tools.outputs --check --from-steps``.

Importable API (the manifest's, from tools/manifest.py, plus the check run): load_manifests,
files_so_far, render_tree, static_problems, Manifest, tree_paths, write_tree, build_step,
check_chapter, diagnose.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as `python tools/steps.py` (DESIGN.md's form): the repo's root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from tools import captured, version_checks, versions
from tools.closure import ALWAYS, closure, fixtures_seen
from tools.jobs import in_order
from tools.manifest import (
    ENGINE,
    ROOT,
    Manifest,
    files_so_far,
    get_manifest,
    introduced_in,
    load_manifests,
    render_tree,
    static_problems,
)
from tools.version_checks import Book

__all__ = [
    "Manifest",
    "load_manifests",
    "files_so_far",
    "render_tree",
    "static_problems",
    "tree_paths",
    "write_tree",
    "build_step",
    "check_chapter",
    "diagnose",
    "main",
]

# Present in every step tree whatever the chapter: copied if they exist (folders whole),
# the Python files among them cut to the chapter's version (they may carry markers).
INFRASTRUCTURE = [
    "pyproject.toml",
    "tests/__init__.py",
    "tests/conftest.py",
    "tests/helpers/__init__.py",
    "tests/helpers/models.py",
    "tests/helpers/reference.py",
    "tools/",
]
# the infrastructure's Python files that markers may cut (tools/ is the book's, not the engine's)
VERSIONED_INFRASTRUCTURE = [p for p in INFRASTRUCTURE if p.endswith(".py")]
# Linked into every step tree: large generated data.
LINKED = ["models"]
TAIL_LINES = 25  # lines of a failing command's output shown in the report
EARLIER = "earlier tests"  # the label of the command that runs earlier chapters' tests again

GUARD = '''\
# Written by `python -m tools.steps`: this folder is one step of the book's tree. Make
# `import minisgl` (and every minisgl submodule) come from this folder only, so a
# module the chapter has not introduced yet fails to import even when another copy
# of minisgl is installed (an editable install would otherwise fill it in).
import importlib.machinery
import os
import sys

_STEP = {step!r}


def _note(fullname):
    """Record a hidden module where $STEP_GUARD_MISSES says (a main's stdout is reused by
    `python -m tools.outputs` only when its run hid nothing: tools/captured.py)."""
    path = os.environ.get("STEP_GUARD_MISSES")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(fullname + "\\n")


class _StepOnlyFinder:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname != "minisgl" and not fullname.startswith("minisgl."):
            return None
        where = [_STEP] if fullname == "minisgl" else path
        spec = importlib.machinery.PathFinder.find_spec(fullname, where)
        if spec is None:
            _note(fullname)
            raise ModuleNotFoundError(f"No module named {{fullname!r}}", name=fullname)
        return spec


sys.meta_path.insert(0, _StepOnlyFinder)
'''


# Imports every engine module of the step, so a forward reach shows even in a module that
# the chapter's main and tests do not exercise.
IMPORT_ALL = """
import importlib, sys
failed = 0
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as e:
        failed += 1
        print(f"{name}: {type(e).__name__}: {e}")
print(f"imported {len(sys.argv) - 1 - failed} of {len(sys.argv) - 1} engine modules")
sys.exit(1 if failed else 0)
"""


def _engine_modules(files: dict[str, str], missing: list[str]) -> list[str]:
    """Dotted names of the engine's Python files among ``files`` (minus the missing ones)."""
    names = []
    for path in files:
        if path.startswith(ENGINE + "/") and path.endswith(".py") and path not in missing:
            dotted = path[:-3].replace("/", ".")
            names.append(dotted.removesuffix(".__init__"))
    return names


@dataclass
class Outcome:
    """The result of one step (a chapter's tree, or a final main on the full tree)."""

    label: str
    ok: bool = True
    seconds: float = 0.0
    ran: list[str] = field(default_factory=list)  # labels of the commands run
    failed: list[str] = field(default_factory=list)  # labels of those that failed
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what it did, not what went wrong
    log: str = ""
    log_path: str = ""  # where the full output was saved, relative to the root


# ------------------------------------------------------------------------ building steps


def step_dir(n: int, root: Path) -> Path:
    return root / "build" / "steps" / f"{n:02d}"


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(
            src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True
        )
    else:
        shutil.copy2(src, dst)


def _write_version(root: Path, rel: str, n: int, dest: Path) -> None:
    """Write chapter ``n``'s version of ``rel`` (a Python file's markers cut; any other file
    copied) under ``dest``."""
    src, out = root / rel, dest / rel
    out.parent.mkdir(parents=True, exist_ok=True)
    if rel.endswith(".py"):
        out.write_text(versions.version(src.read_text(encoding="utf-8"), n, rel), encoding="utf-8")
        shutil.copymode(src, out)
    else:
        shutil.copy2(src, out)


def tree_paths(n: int, manifests: list[Manifest]) -> list[str]:
    """The files of chapter ``n``'s tree (its and the earlier chapters' files, mains and
    tests), in order of introduction; the infrastructure comes on top (INFRASTRUCTURE)."""
    wanted: dict[str, None] = {}
    for m in manifests:
        if m.number <= n:
            wanted.update(dict.fromkeys(m.tree_files))
    return list(wanted)


def write_tree(n: int, manifests: list[Manifest], root: Path, dest: Path) -> list[str]:
    """Write chapter ``n``'s tree into the empty folder ``dest``: every file of
    ``tree_paths`` and the infrastructure as chapter ``n`` leaves it, ``models/`` linked, and
    the guard that keeps ``import minisgl`` inside ``dest``. Returns the files missing."""
    missing = []
    for rel in tree_paths(n, manifests):
        if (root / rel).exists():
            _write_version(root, rel, n, dest)
        else:
            missing.append(rel)
    for rel in INFRASTRUCTURE:
        if rel in VERSIONED_INFRASTRUCTURE and (root / rel).exists():
            _write_version(root, rel, n, dest)
        elif (root / rel).exists():
            _copy(root / rel, dest / rel.rstrip("/"))
    for rel in LINKED:
        if (root / rel).exists():
            (dest / rel).symlink_to((root / rel).resolve(), target_is_directory=True)
    (dest / "sitecustomize.py").write_text(GUARD.format(step=str(dest)))
    return missing


def build_step(n: int, manifests: list[Manifest], root: Path) -> tuple[Path, list[str]]:
    """Create ``build/steps/NN`` from chapters 0..n; return it and the files that were missing."""
    dest = step_dir(n, root)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    return dest, write_tree(n, manifests, root, dest)


# ---------------------------------------------------------------------------- diagnosis


def diagnose(
    output: str,
    n: int,
    manifests: list[Manifest],
    root: Path | None = None,
    step: Path | None = None,
) -> list[str]:
    """Explain import and file errors in a failed command's output.

    Returns one sentence per distinct missing module or file, e.g. "chapter 5 reaches
    forward: minisgl.engine is imported but not introduced until chapter 6
    (minisgl/engine/__init__.py)". Modules outside minisgl are reported as missing
    third-party packages; an empty list means no import or file error was found.
    """
    root = root or ROOT
    intro = introduced_in(manifests)
    found: list[str] = []
    for mod in re.findall(r"ModuleNotFoundError: No module named '([\w.]+)'", output):
        if mod.split(".")[0] != ENGINE:
            found.append(
                f"chapter {n}: third-party module '{mod}' is not installed (not a forward reach)"
            )
        else:
            found.append(_explain(n, mod, _module_files(mod), intro, root, "is imported"))
    for name, mod in re.findall(r"ImportError: cannot import name '(\w+)' from '([\w.]+)'", output):
        if mod.split(".")[0] != ENGINE:
            continue
        # `from minisgl.x import y`: y may be a submodule the chapter lacks, or a name that
        # x's __init__.py (missing while x is a namespace package) would define
        sub = _module_files(f"{mod}.{name}")
        if any(p in intro or (root / p).exists() for p in sub):
            found.append(_explain(n, f"{mod}.{name}", sub, intro, root, "is imported"))
        else:
            found.append(
                _explain(n, mod, _module_files(mod), intro, root, f"is imported (for {name})")
            )
    pattern = r"FileNotFoundError: \[Errno 2\] No such file or directory: '([^']+)'"
    for path in re.findall(pattern, output):
        rel = path
        if step is not None and path.startswith(str(step) + "/"):
            rel = path[len(str(step)) + 1 :]
        found.append(_explain(n, rel, [rel], intro, root, "is opened"))
    return list(dict.fromkeys(found))


def _module_files(module: str) -> list[str]:
    base = module.replace(".", "/")
    return [f"{base}/__init__.py", f"{base}.py"]


def _explain(
    n: int, name: str, candidates: list[str], intro: dict[str, int], root: Path, what: str
) -> str:
    for path in candidates:
        if path in intro:
            c = intro[path]
            if c > n:
                return (
                    f"chapter {n} reaches forward: {name} {what} but not introduced "
                    f"until chapter {c} ({path})"
                )
            return (
                f"chapter {n}: {name} {what} and {path} is introduced in chapter {c}, "
                "yet this fails (a name missing from it?)"
            )
    for path in candidates:
        if (root / path).exists():
            return f"chapter {n} reaches forward: {name} {what} but no chapter introduces {path}"
    return f"chapter {n}: {name} {what} but does not exist in the repository"


# ------------------------------------------------------------------------------ running


def _env(pythonpath: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(pythonpath)  # replaces, never extends: only this tree counts
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def _run(
    cmd: list[str], cwd: Path, timeout: float, extra_env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """(exit status, stdout + stderr, stdout) of ``cmd`` run in ``cwd``."""
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, env=_env(cwd, extra_env), capture_output=True, text=True, timeout=timeout
        )
        return proc.returncode, proc.stdout + proc.stderr, proc.stdout
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") + (e.stderr or b"")
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        return 124, out + f"\n[timed out after {timeout:.0f} s]", ""


def _verify_import(cwd: Path, expect_engine: bool, timeout: float) -> tuple[str | None, str]:
    """Check in a subprocess that ``import minisgl`` resolves inside ``cwd`` (or fails if
    the step has no engine files yet). Returns a problem or None, and the output."""
    code = "import minisgl; print(minisgl.__file__)"
    rc, out, _ = _run([sys.executable, "-c", code], cwd, timeout)
    lines = out.strip().splitlines()
    where = lines[-1] if lines else ""
    if not expect_engine:
        if rc == 0:
            return f"import minisgl resolves to {where}, but this step has none", out
        return None, out
    if rc != 0:
        return f"import minisgl fails in {cwd}: {where}", out
    if not Path(where).resolve().is_relative_to(cwd.resolve()):
        return f"import minisgl resolves to {where}, outside {cwd}", out
    return None, out


def _tail(text: str) -> str:
    lines = text.rstrip().splitlines()
    return "\n".join(lines[-TAIL_LINES:])


def _tops(files: list[str]) -> set[str]:
    """The top-level names (``minisgl``, ``pyproject.toml``) a step tree of ``files`` has."""
    return {p.split("/")[0] for p in [*files, *INFRASTRUCTURE, *LINKED]}


def _run_commands(
    outcome: Outcome,
    commands: list[tuple[str, list[str]]],
    cwd: Path,
    n: int | None,
    manifests: list[Manifest],
    root: Path,
    timeout: float,
    tops: set[str] = frozenset(),
) -> None:
    """Run each command in cwd; on failure explain it (forward reaches need a chapter n).
    A main (``examples/<name>.py``) runs as ``python -m tools.outputs`` runs it, and its stdout
    is kept for ``tools.outputs --check --from-steps``, fingerprinted over ``tops`` of cwd."""
    logs = []
    misses = cwd / captured.GUARD_MISSES
    for label, cmd in commands:
        main = label.startswith("examples/") and label.endswith(".py")
        misses.unlink(missing_ok=True)
        env = {**captured.ENV, "STEP_GUARD_MISSES": str(misses)} if main else None
        rc, out, stdout = _run(cmd, cwd, timeout, env)
        if label == EARLIER and rc == 5:  # pytest collected nothing: all of it marked slow
            rc = 0
        if main:
            name = Path(label).stem
            if rc == 0 and not misses.exists():  # it ran, and the guard hid no module from it
                chapter = None if cwd == root else n
                captured.save(root, name, stdout, captured.fingerprint(cwd, tops, root, chapter))
            else:
                captured.forget(root, name)
            misses.unlink(missing_ok=True)
        shown = " ".join("<import each module>" if a == IMPORT_ALL else a for a in cmd)
        logs.append(f"$ {shown}   (cwd {cwd}, exit {rc})\n{out}")
        outcome.ran.append(label)
        if rc != 0:
            outcome.ok = False
            outcome.failed.append(label)
            reasons = diagnose(out, n, manifests, root, step=cwd) if n is not None else []
            outcome.problems.extend(reasons or [f"{label} failed (exit {rc}):\n{_tail(out)}"])
    outcome.log = "\n".join(logs)


def _python_texts(book: Book, k: int) -> dict[str, str]:
    return {p: book.version(p, k) for p in book.tree(k) if p.endswith(".py")}


def _reads_same(test: str, a: dict[str, str], b: dict[str, str]) -> bool:
    """Whether ``test`` reads the same text in trees ``a`` and ``b``: the same import closure
    (``tools/closure.py``), file for file, and of the conftest only the fixtures it can use."""

    def seen(path: str, texts: dict[str, str]) -> str:
        if path in ALWAYS:
            return fixtures_seen(texts[path], texts[test])
        return texts[path]

    files = closure(test, a)
    return files == closure(test, b) and all(seen(f, a) == seen(f, b) for f in files)


def earlier_tests(n: int, manifests: list[Manifest], root: Path) -> tuple[list[str], list[str]]:
    """The test files of the chapters before ``n``, and those of them to run again in chapter
    ``n``'s tree: the ones that read other text in chapter ``n``'s version than in the chapter
    before's, where they already ran."""
    numbers = [m.number for m in manifests]
    if n not in numbers or numbers.index(n) == 0:
        return [], []
    book = Book(manifests, root, VERSIONED_INFRASTRUCTURE)
    now, before = _python_texts(book, n), _python_texts(book, numbers[numbers.index(n) - 1])
    tests = [t for m in manifests if m.number < n for t in m.tests if t in now]
    return tests, [t for t in tests if not _reads_same(t, now, before)]


def as_in_final(n: int, tests: list[str], manifests: list[Manifest], root: Path) -> list[str]:
    """Those of ``tests`` that read in chapter ``n``'s tree exactly the text they read in the
    repository's (the last chapter's): the full suite's run there already ran them on it."""
    book = Book(manifests, root, VERSIONED_INFRASTRUCTURE)
    now, final = _python_texts(book, n), _python_texts(book, book.last)
    return [t for t in tests if t in final and _reads_same(t, now, final)]


def check_chapter(
    n: int,
    manifests: list[Manifest],
    root: Path | None = None,
    timeout: float = 1800,
    earlier: bool = True,
    after_full_suite: bool = False,
) -> Outcome:
    """Build ``build/steps/NN`` and run chapter n's mains and tests in it, and (``earlier``)
    the earlier chapters' tests that reach something chapter n changed. ``after_full_suite``:
    the whole suite has just passed on the repository's tree, so a test that reads the same
    text here as there is not run again, and earlier chapters' tests run without the slow."""
    root = root or ROOT
    start = time.monotonic()
    m = get_manifest(n, manifests)
    outcome = Outcome(label=f"{m.name}")
    dest, missing = build_step(n, manifests, root)
    own = [p for p in missing if p in m.listed]
    if own:
        outcome.ok = False
        outcome.problems += [f"chapter {n}: {p} is listed but does not exist" for p in own]
    if len(missing) > len(own):  # reported by their own chapter; fatal here only if needed
        outcome.notes.append(
            f"{len(missing) - len(own)} file(s) of earlier "
            "chapters are missing: " + ", ".join(sorted(set(missing) - set(own)))
        )
    has_engine = any(p.startswith(ENGINE + "/") for p in files_so_far(n, manifests))
    problem, out = _verify_import(dest, has_engine, timeout)
    if problem:
        outcome.ok = False
        outcome.problems.append(f"chapter {n}: {problem}")
        outcome.problems += diagnose(out, n, manifests, root, step=dest)
    else:  # still run what is there: its failure may say more than "missing"
        mains = [p for p in [m.main, *m.extra_mains] if p not in m.final_mains and p not in missing]
        commands = [(p, [sys.executable, p]) for p in mains]
        modules = _engine_modules(files_so_far(n, manifests), missing)
        if modules:
            commands.insert(0, ("imports", [sys.executable, "-c", IMPORT_ALL, *modules]))
        tests = [p for p in m.tests if p not in missing]
        pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        ran_in_final = as_in_final(n, tests, manifests, root) if after_full_suite else []
        if ran_in_final:
            tests = [t for t in tests if t not in ran_in_final]
            outcome.notes.append(
                f"{len(ran_in_final)} of this chapter's test files read the text the full "
                "suite ran them on: not run again"
            )
        if tests:
            commands.append(("tests", [*pytest, *tests]))
        if earlier:
            before, rerun = earlier_tests(n, manifests, root)
            quick = []
            if after_full_suite:
                quick = ["-m", "not slow and not browser"]
                rerun = [t for t in rerun if t not in as_in_final(n, rerun, manifests, root)]
            if rerun:
                commands.append((EARLIER, [*pytest, *quick, *rerun]))
            outcome.notes.append(
                f"{len(rerun)} of {len(before)} earlier chapters' test files run again; "
                "the rest reach nothing this chapter changed"
                + (" or read the text the full suite ran them on" if after_full_suite else "")
            )
        _run_commands(
            outcome, commands, dest, n, manifests, root, timeout, {p.name for p in dest.iterdir()}
        )
        (dest / "check.log").write_text(outcome.log)
        outcome.log_path = (dest / "check.log").relative_to(root).as_posix()
    outcome.seconds = time.monotonic() - start
    return outcome


def check_final_main(
    path: str, n: int, manifests: list[Manifest], root: Path | None = None, timeout: float = 1800
) -> Outcome:
    """Run a main that previews the finished engine against the full repository."""
    root = root or ROOT
    start = time.monotonic()
    outcome = Outcome(label=f"final {path}")
    if not (root / path).is_file():
        outcome.ok = False
        outcome.problems.append(f"chapter {n}: final main {path} does not exist")
    else:
        problem, _ = _verify_import(root, True, timeout)
        if problem:
            outcome.ok = False
            outcome.problems.append(problem)
        else:
            tops = _tops([f for m in manifests for f in m.tree_files])
            _run_commands(
                outcome,
                [(path, [sys.executable, path])],
                root,
                None,
                manifests,
                root,
                timeout,
                tops,
            )
    outcome.seconds = time.monotonic() - start
    return outcome


# ---------------------------------------------------------------------------- commands


def cmd_list(manifests: list[Manifest]) -> int:
    print(
        f"{'ch':<3} {'slug':<12} {'stage':<5} {'new':>3} {'mod':>3} {'early':>5} "
        f"{'so far':>6}  title"
    )
    for m in manifests:
        files = {p: s for p, s in files_so_far(m.number, manifests).items() if p.startswith(ENGINE)}
        modified = sum(1 for s in files.values() if s == "modified")
        print(
            f"{m.number:02d}  {m.slug:<12} {m.stage:<5} {len(m.new):>3} {modified:>3} "
            f"{len(m.early):>5} {len(files):>6}  {m.title}"
        )
    return 0


def cmd_run(n: int, argv: list[str], manifests: list[Manifest], root: Path) -> int:
    """Build chapter ``n``'s tree and run its main there with ``argv``: what the chapter's
    page shows (``tools.outputs`` captures it the same way)."""
    try:
        m = get_manifest(n, manifests)
    except KeyError as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
    where = root if m.main in m.final_mains else build_step(n, manifests, root)[0]
    print(f"$ python {m.main} {' '.join(argv)}   (in {where})", file=sys.stderr, flush=True)
    env = _env(where, captured.ENV)
    return subprocess.run([sys.executable, m.main, *argv], cwd=where, env=env).returncode


def cmd_changes(n: int, manifests: list[Manifest], root: Path) -> int:
    """Print the files chapter ``n`` brings in and the diff of every file it edits."""
    import difflib

    from tools.docs.versioned import SourceVersions

    sv = SourceVersions(root, manifests)
    if n not in sv.numbers:
        print(f"error: no chapter {n}", file=sys.stderr)
        return 2
    new, edited = sv.changes(n)
    print(f"chapter {n} brings in {len(new)} file(s):")
    for path in new:
        print(f"  {path}")
    print(f"and edits {len(edited)}:")
    for path, (before, after) in sorted(edited.items()):
        diff = difflib.unified_diff(
            before.split("\n"), after.split("\n"), path, path, lineterm="", n=3
        )
        print("\n".join(diff))
    return 0


def all_static_problems(
    manifests: list[Manifest], root: Path, allow_unlisted: bool = False
) -> list[str]:
    """The manifests' problems (tools/manifest.py), then every chapter version's: markers,
    later chapters or names, parsing (tools/version_checks.py), lint and format."""
    found = static_problems(manifests, root, allow_unlisted=allow_unlisted)
    found += version_checks.problems(manifests, root, VERSIONED_INFRASTRUCTURE)
    found += version_checks.lint_problems(Book(manifests, root, VERSIONED_INFRASTRUCTURE))
    return found


def cmd_check(args: argparse.Namespace, manifests: list[Manifest], root: Path) -> int:
    numbers = args.chapters or [m.number for m in manifests]
    static = all_static_problems(manifests, root, allow_unlisted=args.allow_unlisted)
    print(f"static checks: {len(static)} problem(s)")
    for p in static:
        print(f"  - {p}")
    if args.static_only:
        return 1 if static else 0
    try:
        chosen = [get_manifest(n, manifests) for n in numbers]
    except KeyError as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2

    jobs: list[tuple[str, object]] = [
        (
            m.name,
            lambda m=m: check_chapter(
                m.number, manifests, root, args.timeout, args.earlier, args.after_full_suite
            ),
        )
        for m in chosen
    ]
    if not args.no_final:
        finals = dict.fromkeys((p, m.number) for m in chosen for p in m.final_mains)
        jobs += [
            (p, lambda p=p, n=n: check_final_main(p, n, manifests, root, args.timeout))
            for p, n in finals
        ]
    outcomes: list[Outcome] = []
    for out in in_order([(fn, ()) for _, fn in jobs], args.jobs):
        outcomes.append(out)
        log = f", log {out.log_path}" if out.log_path and not out.ok else ""
        print(f"{'ok  ' if out.ok else 'FAIL'} {out.label}  ({out.seconds:.1f} s{log})", flush=True)
        for p in out.problems + [f"note: {n}" for n in out.notes]:
            print("     " + p.replace("\n", "\n     "))

    print("\nsummary")
    print(f"  {'step':<40} {'result':<6} {'time':>8}  ran")
    for out in outcomes:
        print(
            f"  {out.label:<40} {'ok' if out.ok else 'FAIL':<6} {out.seconds:>7.1f}s  "
            f"{', '.join(r + (' (FAIL)' if r in out.failed else '') for r in out.ran) or '-'}"
        )
    failed = [o for o in outcomes if not o.ok]
    print(
        f"  {len(outcomes) - len(failed)}/{len(outcomes)} steps passed"
        + (f", {len(static)} static problem(s)" if static else "")
    )
    return 1 if failed or static else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.steps", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the chapters and what each introduces")
    show = sub.add_parser("show", help="chapter N's version of a file")
    show.add_argument("chapter", type=int)
    show.add_argument("path")
    changes = sub.add_parser("changes", help="what chapter N changed: new files, and diffs")
    changes.add_argument("chapter", type=int)
    run = sub.add_parser("run", help="chapter N's main, run in chapter N's tree")
    run.add_argument("chapter", type=int)
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the main")
    tree = sub.add_parser("tree", help="the files so far at chapter N")
    tree.add_argument("chapter", type=int)
    tree.add_argument("--format", choices=["text", "markdown"], default="text")
    check = sub.add_parser("check", help="rebuild chapters 0..N and run each one's main and tests")
    check.add_argument("chapters", type=int, nargs="*", help="chapter numbers (default: all)")
    check.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=1,
        help="steps run at once (default 1; more: one thread per child, tools/jobs.py)",
    )
    check.add_argument("--timeout", type=float, default=1800, help="seconds per command")
    check.add_argument(
        "--static-only",
        action="store_true",
        help="only the static checks: manifests, versions, lint",
    )
    check.add_argument(
        "--allow-unlisted",
        action="store_true",
        help="do not fail on minisgl files that no chapter introduces yet",
    )
    check.add_argument("--no-final", action="store_true", help="skip the final_mains")
    check.add_argument(
        "--no-earlier",
        dest="earlier",
        action="store_false",
        help="run only each chapter's own tests, not the earlier chapters' again",
    )
    check.add_argument(
        "--after-full-suite",
        action="store_true",
        help="the full suite has just passed on the repository's tree (CI runs `make test` "
        "first): skip tests that read the same text here as there, and run earlier chapters' "
        "tests again without those marked slow",
    )
    args = parser.parse_args(argv)

    root = args.root.resolve()
    manifests = load_manifests(root)
    if args.command == "show":
        if not (root / args.path).is_file():
            print(f"error: no file {args.path}", file=sys.stderr)
            return 2
        first = Book(manifests, root, VERSIONED_INFRASTRUCTURE).introduced.get(args.path)
        if first is not None and first > args.chapter:
            print(
                f"error: {args.path} is not in chapter {args.chapter}'s tree "
                f"(chapter {first} brings it in)",
                file=sys.stderr,
            )
            return 2
        text = (root / args.path).read_text(encoding="utf-8")
        print(versions.version(text, args.chapter, args.path), end="")
        return 0
    if args.command == "changes":
        return cmd_changes(args.chapter, manifests, root)
    if args.command == "run":
        return cmd_run(args.chapter, args.args, manifests, root)
    if args.command == "list":
        return cmd_list(manifests)
    if args.command == "tree":
        print(render_tree(args.chapter, args.format, manifests))
        return 0
    return cmd_check(args, manifests, root)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `... | head` closed the pipe: what it read is all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
