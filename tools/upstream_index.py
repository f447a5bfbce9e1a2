"""Build docs/upstream_index.json: where each symbol of upstream mini-sglang lives, by line.

    python -m tools.upstream_index                          # from the default local checkout
    python -m tools.upstream_index --git-dir PATH --commit SHA
    python -m tools.upstream_index --check                  # fail if the JSON is out of date

The book links to upstream (`@@upstream scheduler/scheduler.py:Scheduler.normal_loop@@`) with
permalinks pinned to one commit. This tool reads every `python/minisgl/**/*.py` of that commit
from a local git directory (`git show <commit>:<path>`; nothing is downloaded), finds every
class, function, method and module-level name with `ast` (tools/docs/symbols.py, decorators
included) and writes only their line ranges:

    {"repository": "https://github.com/sgl-project/mini-sglang", "commit": "<sha>",
     "root": "python/minisgl",
     "files": {"scheduler/scheduler.py": {"Scheduler": [40, 267], ...}, ...}}

No upstream code or prose enters this repository: only paths, symbol names and line numbers.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

from tools.docs.symbols import symbol_table

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_GIT_DIR = Path("/work/.mirror/sgl-project+mini-sglang/repo")
REPOSITORY = "https://github.com/sgl-project/mini-sglang"
PACKAGE = "python/minisgl"
OUTPUT = ROOT / "docs" / "upstream_index.json"


def _git(git_dir: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(git_dir), *args], check=True, capture_output=True, text=True
    ).stdout


def build_index(git_dir: Path, commit: str = "HEAD") -> Dict[str, object]:
    """Index `PACKAGE` at `commit` of the git directory `git_dir` (commit resolved to a full sha).

    Raises subprocess.CalledProcessError when git cannot read the commit.
    """
    sha = _git(git_dir, "rev-parse", f"{commit}^{{commit}}").strip()
    paths = [
        p
        for p in _git(git_dir, "ls-tree", "-r", "--name-only", sha, "--", PACKAGE).split("\n")
        if p.endswith(".py")
    ]
    files: Dict[str, Dict[str, List[int]]] = {}
    for path in sorted(paths):
        source = _git(git_dir, "show", f"{sha}:{path}")
        try:
            table = symbol_table(source, filename=path)
        except SyntaxError as e:
            print(f"warning: {path} does not parse ({e}); skipped", file=sys.stderr)
            continue
        files[path[len(PACKAGE) + 1 :]] = {name: [a, b] for name, (a, b) in sorted(table.items())}
    return {"repository": REPOSITORY, "commit": sha, "root": PACKAGE, "files": files}


def dumps(index: Dict[str, object]) -> str:
    # one symbol per line keeps diffs readable when the pinned commit moves
    lines = [
        "{",
        f'  "repository": {json.dumps(index["repository"])},',
        f'  "commit": {json.dumps(index["commit"])},',
        f'  "root": {json.dumps(index["root"])},',
        '  "files": {',
    ]
    files = index["files"]
    assert isinstance(files, dict)
    for i, (path, symbols) in enumerate(files.items()):
        comma = "," if i < len(files) - 1 else ""
        if not symbols:
            lines.append(f"    {json.dumps(path)}: {{}}{comma}")
            continue
        lines.append(f"    {json.dumps(path)}: {{")
        items = list(symbols.items())
        for j, (name, span) in enumerate(items):
            lines.append(
                f"      {json.dumps(name)}: {json.dumps(span)}"
                + ("," if j < len(items) - 1 else "")
            )
        lines.append("    }" + comma)
    lines += ["  }", "}", ""]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.upstream_index", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--git-dir", type=Path, default=DEFAULT_GIT_DIR, help="a local clone of upstream"
    )
    parser.add_argument(
        "--commit",
        default=None,
        help="commit to pin (default: the commit already pinned in the JSON, else HEAD)",
    )
    parser.add_argument("--out", type=Path, default=OUTPUT)
    parser.add_argument(
        "--check", action="store_true", help="fail if the JSON differs from a rebuild"
    )
    args = parser.parse_args(argv)
    commit = args.commit
    if commit is None and args.out.is_file():
        commit = json.loads(args.out.read_text(encoding="utf-8")).get("commit")
    text = dumps(build_index(args.git_dir, commit or "HEAD"))
    if args.check:
        if not args.out.is_file() or args.out.read_text(encoding="utf-8") != text:
            print(f"{args.out} is out of date: run python -m tools.upstream_index", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    index = json.loads(text)
    n = sum(len(v) for v in index["files"].values())
    print(f"wrote {args.out}: {len(index['files'])} files, {n} symbols at {index['commit'][:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
