"""The trace viewer's tooling: tools/trace_view (the page), `# output: trace` in tools/outputs
(the book's stored traces and their --check), and the `@@trace name@@` macro."""

import json
import re
import sys
from pathlib import Path

import pytest

from tools import outputs, trace_view
from tools.docs.macros import Context, MacroError, macro_trace

ROOT = Path(__file__).resolve().parents[1]
BOOK_TRACES = sorted((ROOT / "outputs" / "traces").glob("*.json"))


@pytest.mark.parametrize("path", BOOK_TRACES, ids=lambda p: p.stem)
def test_the_books_traces_follow_the_schema(path):
    trace_view.validate(json.loads(path.read_text()))


def test_the_examples_the_book_shows_traces_of_record_them():
    found = {e.name: e for e in outputs.discover(ROOT)}
    names = ["ch07_scheduler", "ch08_cache_manager", "ch09_radix_cache"]
    names += ["ch10_chunked_prefill", "ch11_overlap", "ch15_server_trace", "ch24_structured"]
    assert all(found[n].trace for n in names)
    assert [p.stem for p in BOOK_TRACES] == sorted(names)
    assert not found["ch15_server_trace"].deterministic  # arrivals depend on timing


def embedded(page: str):
    m = re.search(r'<script type="application/json" id="trace-data">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))


def test_render_inlines_the_trace_so_that_no_text_can_end_its_script():
    doc = json.loads(BOOK_TRACES[0].read_text())
    doc["meta"]["note"] = "</script><script>alert(1)</script>"
    page = trace_view.render(doc)
    assert "</script><script>alert" not in page
    assert embedded(page) == doc  # "<\/" is the same JSON string
    assert "http://" not in page and "https://" not in page  # nothing is fetched


def test_the_command_writes_a_page_and_names_bad_fields(tmp_path, capsys):
    good = tmp_path / "t.json"
    good.write_text(BOOK_TRACES[0].read_text())
    assert trace_view.main([str(good)]) == 0
    assert capsys.readouterr().out.strip() == str((tmp_path / "t.html").resolve())
    assert embedded((tmp_path / "t.html").read_text()) == json.loads(good.read_text())
    doc = json.loads(good.read_text())
    doc["steps"][2]["kind"] = "verify"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert trace_view.main([str(bad)]) == 1
    err = capsys.readouterr().err
    assert "steps/2/kind" in err and "'verify'" in err and not (tmp_path / "bad.html").exists()
    bad.write_text("{")
    assert trace_view.main([str(bad)]) == 1
    assert "bad.json" in capsys.readouterr().err


EXAMPLE = """\
# capture-output
# output: trace
import json, sys, time
kind = open("kind.txt").read().strip()
print("ran")
if "--trace" in sys.argv:
    step = {"kind": kind, "timings_ms": {"launch_at": time.perf_counter()}}
    open(sys.argv[sys.argv.index("--trace") + 1], "w").write(json.dumps({"steps": [step]}))
"""


def test_outputs_stores_a_trace_and_checks_it_timings_aside(tmp_path, capsys):
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "traced.py").write_text(EXAMPLE)
    (tmp_path / "kind.txt").write_text("decode")
    root = ["--root", str(tmp_path), "traced"]
    assert outputs.main(root) == 0
    stored = json.loads((tmp_path / "outputs" / "traces" / "traced.json").read_text())
    assert stored["steps"][0]["kind"] == "decode"
    assert outputs.main(root + ["--check"]) == 0  # a new run: only its timings differ
    assert "ok    outputs/traces/traced.json" in capsys.readouterr().out
    (tmp_path / "kind.txt").write_text("prefill")
    assert outputs.main(root + ["--check"]) == 1
    out, err = capsys.readouterr()
    assert "step 0 differs" in out and "outputs/traces/traced.json" in err
    (tmp_path / "outputs" / "traces" / "traced.json").unlink()
    assert outputs.main(root + ["--check"]) == 1  # a missing trace is stale too


def test_the_trace_macro_embeds_the_viewer_page():
    ctx = Context(root=ROOT, page="chapters/ch07_scheduler.md")
    html = macro_trace("ch07_scheduler", ctx)
    # the frame is addressed from the page's URL, chapters/ch07_scheduler/
    assert 'src="../../traces/ch07_scheduler.html"' in html
    assert "[full page](../traces/ch07_scheduler.html)" in html  # mkdocs rewrites this one
    note = macro_trace("ch07_scheduler", Context(root=ROOT, mode="notebook"))
    assert "<iframe" not in note and "python -m tools.trace_view my.json" in note
    with pytest.raises(MacroError, match="outputs/traces/ch99_nothing.json does not exist"):
        macro_trace("ch99_nothing", ctx)


def test_without_jsonschema_the_format_and_version_are_still_checked(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # `import jsonschema` raises
    doc = json.loads(BOOK_TRACES[0].read_text())
    trace_view.validate(doc)
    assert "jsonschema is not installed" in capsys.readouterr().err
    with pytest.raises(ValueError, match="trace version 2"):
        trace_view.validate({**doc, "version": 2})
    with pytest.raises(ValueError, match="format"):
        trace_view.validate({"steps": []})
