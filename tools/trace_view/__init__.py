"""A scheduler trace (minisgl/scheduler/trace.py) as one self-contained HTML page.

    python examples/ch07_scheduler.py --trace my.json
    python -m tools.trace_view my.json            # writes my.html beside it, prints its path
    python -m tools.trace_view my.json -o v.html

The page is viewer.html (plain JavaScript, no library, nothing fetched) with the trace
inlined: open it from disk. It steps, plays and scrubs through the steps (arrow keys, space,
Home/End) and shows each step's batch, the KV pool as a grid of pages coloured by request,
the page table, the radix tree, chunked prefill's chunks and the overlap timeline. The book's
chapters 7-11 embed the same page, rendered from outputs/traces/ (tools/docs/hooks.py).
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

TEMPLATE = Path(__file__).with_name("viewer.html")
SCHEMA = Path(__file__).resolve().parents[2] / "minisgl" / "scheduler" / "trace.schema.json"


def validate(doc: Dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the first field that breaks the trace schema. Without the
    ``jsonschema`` package (the dev extra) only the format and version are checked."""
    if not isinstance(doc, dict) or doc.get("format") != "minisgl-trace":
        raise ValueError("not a minisgl trace: its format is not 'minisgl-trace'")
    try:
        import jsonschema
    except ImportError:
        schema_version = json.loads(SCHEMA.read_text(encoding="utf-8"))["properties"]["version"]
        if doc.get("version") != schema_version["const"]:
            raise ValueError(
                f"trace version {doc.get('version')}, the viewer reads {schema_version['const']}"
            )
        print(
            "note: jsonschema is not installed; only the format and version were checked",
            file=sys.stderr,
        )
        return

    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(schema).iter_errors(doc)
    )
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(the document)"
        raise ValueError(f"not a minisgl trace: at {where}: {error.message}")


def render(doc: Dict[str, Any], title: Optional[str] = None) -> str:
    """The viewer page for ``doc`` (a trace already loaded), as HTML text."""
    example = doc.get("meta", {}).get("example")
    title = title or (f"Scheduler trace: {example}" if example else "Scheduler trace")
    data = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    # inside <script>, "</" could end the element early; "<\/" is the same JSON string
    data = data.replace("</", "<\\/")
    page = TEMPLATE.read_text(encoding="utf-8")
    return page.replace("__TITLE__", html.escape(title)).replace("__TRACE__", data)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.trace_view", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("trace", type=Path, help="a trace written by an example's --trace")
    parser.add_argument("-o", "--output", type=Path, help="the page to write (default: .html)")
    args = parser.parse_args(argv)
    try:
        doc = json.loads(args.trace.read_text(encoding="utf-8"))
        validate(doc)
    except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        print(f"error: {args.trace}: {e}", file=sys.stderr)
        return 1
    out = args.output or args.trace.with_suffix(".html")
    out.write_text(render(doc), encoding="utf-8")
    print(out.resolve())
    return 0
