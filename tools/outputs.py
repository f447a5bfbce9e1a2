"""Capture what the examples print into outputs/<name>.txt, for the book's `@@output name@@`.

    python -m tools.outputs                   # run every captured example, (re)write outputs/
    python -m tools.outputs ch07_scheduler    # only this one
    python -m tools.outputs --check           # rerun the deterministic ones; fail on stale files
    python -m tools.outputs --check --from-steps --jobs 2   # CI: reuse what tools.steps check ran
    python -m tools.outputs --list            # which examples are captured, and how checked

Which examples: every chapter's `main` and `extra_mains` (chapters/chNN_<slug>/chapter.toml), and any
examples/*.py with a line `# capture-output`. A chapter's main runs in that chapter's tree, the
engine as the chapter leaves it (tools/steps.py `write_tree`, into a temporary folder: what
`python -m tools.steps run N` runs and the book's listings show); a `final_mains` entry or a
`# capture-output` example runs from the repository root. Each runs as
`python examples/<name>.py` (PYTHONPATH its tree, PYTHONHASHSEED=0); its stdout, and only its
stdout, is the output. An example that exits non-zero is reported (exit 1) and its old output kept; a
main that is not written yet is skipped with a note.

Nondeterministic output is declared in the example itself, by a comment line:

    # output: nondeterministic      the whole output varies (timings, throughput, sampling):
                                    captured as usual, skipped by --check
    # output: mask <regex>          the output is deterministic except what <regex> matches
                                    (e.g. `# output: mask \\d+\\.\\d+ ms`); --check replaces
                                    every match by `…` in both the old and the new output
                                    before comparing. Several mask lines may be given.
    # output: trace                 the example also records a scheduler trace: it runs with
                                    `--trace outputs/traces/<name>.json` (the viewer the book
                                    embeds, tools/trace_view); --check records a fresh trace
                                    and compares it with the stored one, timings left out

`--check` prints a unified diff per stale file and exits 1 listing them; a missing output
counts as stale. With `--from-steps` it takes an example's stdout from the last
`python -m tools.steps check` instead of rerunning it, but only when that run's fingerprint (the
SHA-256 of every file it could read, the models, the interpreter and the settings: see
tools/captured.py) still holds for the repository now; the others are rerun. `--jobs N` runs
N examples at once (one thread per child then, tools/jobs.py). Outputs depend on the machine
they were captured on (CPU here, float32): capture them on the machine the book's prose
describes.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Tuple, Union

from tools import captured, steps
from tools.docs.chapters import load_chapters
from tools.jobs import in_order
from tools.manifest import load_manifests

ROOT = Path(__file__).resolve().parents[1]

CAPTURE = re.compile(r"^#\s*capture-output\s*$", re.M)
NONDETERMINISTIC = re.compile(r"^#\s*output:\s*nondeterministic\s*$", re.M)
MASK = re.compile(r"^#\s*output:\s*mask\s+(.+?)\s*$", re.M)
TRACE = re.compile(r"^#\s*output:\s*trace\s*$", re.M)
TRACES = Path("outputs") / "traces"


@dataclass
class Example:
    """A captured example: `name` is `ch07_scheduler` for examples/ch07_scheduler.py."""

    name: str
    path: Path
    deterministic: bool = True
    masks: List[str] = field(default_factory=list)
    trace: bool = False  # also writes outputs/traces/<name>.json
    chapter: Optional[int] = None  # runs in this chapter's tree (None: the repository)

    def normalise(self, text: str) -> str:
        for pattern in self.masks:
            text = re.sub(pattern, "…", text)
        return text


def discover(root: Path) -> List[Example]:
    """Chapter mains plus `# capture-output` examples, sorted by name."""
    paths = {(root / main).resolve() for ch in load_chapters(root) for main in ch.mains}
    chapter_of = {
        (root / p).resolve(): m.number
        for m in load_manifests(root)
        for p in [m.main, *m.extra_mains]
        if p not in m.final_mains
    }
    for p in sorted((root / "examples").glob("*.py")) if (root / "examples").is_dir() else []:
        if CAPTURE.search(p.read_text(encoding="utf-8")):
            paths.add(p.resolve())
    examples = []
    for p in sorted(paths):
        text = p.read_text(encoding="utf-8") if p.is_file() else ""
        examples.append(
            Example(
                p.stem,
                p,
                not NONDETERMINISTIC.search(text),
                MASK.findall(text),
                bool(TRACE.search(text)),
                chapter_of.get(p),
            )
        )
    return examples


def run(example: Example, root: Path, timeout: float, trace: Optional[Path] = None) -> str:
    """The example's stdout (with ``trace``, it also records its trace there). Raises
    RuntimeError (with the stderr tail) if it fails or times out."""
    if not example.path.is_file():
        raise RuntimeError(f"{example.path.relative_to(root)} does not exist")
    with tempfile.TemporaryDirectory(prefix=f"{example.name}-") as tmp:
        where = root
        if example.chapter is not None:  # the engine as the example's chapter leaves it
            where = Path(tmp)
            steps.write_tree(example.chapter, load_manifests(root), root, where)
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(where), os.environ.get("PYTHONPATH", "")]).rstrip(
                os.pathsep
            ),
            **captured.ENV,
        )
        try:
            proc = subprocess.run(
                [sys.executable, str(example.path.relative_to(root))]
                + ([] if trace is None else ["--trace", str(trace.resolve())]),
                cwd=where,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"timed out after {timeout:.0f} s") from e
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().split("\n")[-15:])
        raise RuntimeError(f"exited with {proc.returncode}:\n{tail}")
    return proc.stdout


def _stdout(
    example: Example, root: Path, timeout: float, reuse: bool
) -> Tuple[Union[str, RuntimeError], str, Optional[str]]:
    """(the example's stdout, or the error of its run; where it came from, for the report;
    the trace it recorded, for a trace example)."""
    if example.trace:  # a trace is only recorded by running it: no reuse
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{example.name}.json"
            try:
                text = run(example, root, timeout, trace=path)
            except RuntimeError as err:
                return err, "", None
            if not path.is_file():
                return RuntimeError(f"--trace {path} wrote no file"), "", None
            return text, "", path.read_text(encoding="utf-8")
    if reuse:
        text = captured.load(root, example.name)
        if text is not None:
            return (
                text,
                f" (stdout of the same files from tools.steps check, {captured.STORE.as_posix()})",
                None,
            )
    try:
        return run(example, root, timeout), "", None
    except RuntimeError as err:
        return err, "", None


def trace_core(text: str) -> List[str]:
    """A trace's steps without their timings, one JSON line each: what --check compares."""
    doc = json.loads(text)
    lines = []
    for step in doc.pop("steps"):
        step.pop("timings_ms", None)
        lines.append(json.dumps(step, sort_keys=True))
    return [json.dumps(doc, sort_keys=True), *lines]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.outputs", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("names", nargs="*", help="example names (ch07_scheduler); all when none")
    parser.add_argument(
        "--check", action="store_true", help="fail listing stale outputs, with diffs"
    )
    parser.add_argument("--list", action="store_true", help="list the captured examples")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per example")
    parser.add_argument(
        "--jobs", "-j", type=int, default=1, help="examples run at once (default 1)"
    )
    parser.add_argument(
        "--from-steps",
        action="store_true",
        help="with --check: reuse the stdout of `tools.steps check` runs of the same files",
    )
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.from_steps and not args.check:
        parser.error("--from-steps only makes sense with --check")
    root = args.root.resolve()
    examples = discover(root)
    if args.names:
        wanted = {n.removesuffix(".py").removeprefix("examples/") for n in args.names}
        unknown = wanted - {e.name for e in examples}
        if unknown:
            parser.error(
                f"not a captured example: {', '.join(sorted(unknown))} "
                "(add it as a chapter main or mark it `# capture-output`)"
            )
        examples = [e for e in examples if e.name in wanted]
    if args.list:
        for e in examples:
            how = (
                "nondeterministic: not checked"
                if not e.deterministic
                else f"checked, masking {e.masks}"
                if e.masks
                else "checked"
            )
            how = how + (", records a trace" if e.trace else "")
            how = how if e.path.is_file() else "not written yet"
            print(f"{e.name:<28} {how}")
        return 0
    out_dir = root / "outputs"
    out_dir.mkdir(exist_ok=True)
    failed: List[str] = []
    stale: List[str] = []
    todo: List[Example] = []
    for e in examples:
        if not e.path.is_file():
            print(f"skip  {e.name} (examples/{e.name}.py is not written yet)")
        elif args.check and not e.deterministic:
            print(f"skip  {e.name} (nondeterministic)")
        else:
            todo.append(e)
    reuse = args.check and args.from_steps
    results = in_order([(_stdout, (e, root, args.timeout, reuse)) for e in todo], args.jobs)
    for e, (text, source, trace) in zip(todo, results, strict=True):
        target = out_dir / f"{e.name}.txt"
        if isinstance(text, RuntimeError):
            print(f"FAIL  {e.name}: {text}", file=sys.stderr)
            failed.append(e.name)
            continue
        if args.check:
            old = target.read_text(encoding="utf-8") if target.is_file() else ""
            if e.normalise(old) != e.normalise(text):
                stale.append(f"outputs/{e.name}.txt")
                diff = difflib.unified_diff(
                    old.splitlines(),
                    text.splitlines(),
                    f"outputs/{e.name}.txt",
                    f"python examples/{e.name}.py{source}",
                    lineterm="",
                )
                print("\n".join(diff))
            else:
                print(f"ok    {e.name}{source}")
            if trace is not None:
                stored = root / TRACES / f"{e.name}.json"
                old_steps = (
                    trace_core(stored.read_text(encoding="utf-8")) if stored.is_file() else []
                )
                new_steps = trace_core(trace)
                if old_steps != new_steps:
                    stale.append((TRACES / f"{e.name}.json").as_posix())
                    first = next(
                        (i for i, (a, b) in enumerate(zip(old_steps, new_steps)) if a != b),
                        min(len(old_steps), len(new_steps)),
                    )
                    what = "the header" if first == 0 else f"step {first - 1}"
                    print(
                        f"stale {TRACES.as_posix()}/{e.name}.json: {what} differs (timings aside)"
                    )
                else:
                    print(f"ok    {TRACES.as_posix()}/{e.name}.json (timings aside)")
        else:
            target.write_text(text, encoding="utf-8")
            print(f"wrote outputs/{e.name}.txt ({len(text.splitlines())} lines)")
            if trace is not None:
                (root / TRACES).mkdir(parents=True, exist_ok=True)
                (root / TRACES / f"{e.name}.json").write_text(trace, encoding="utf-8")
                print(
                    f"wrote {TRACES.as_posix()}/{e.name}.json ({len(json.loads(trace)['steps'])} steps)"
                )
    if stale:
        print(f"stale: {', '.join(stale)} (rerun python -m tools.outputs)", file=sys.stderr)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if stale or failed else 0


if __name__ == "__main__":
    sys.exit(main())
