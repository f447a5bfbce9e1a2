"""Step through the scheduler trace viewer that chapter 7 embeds (tools/trace_view), in Chromium:
what it displays at each step is the trace's own numbers, read back from the DOM.

    mkdocs build --strict && pytest -m browser tests/browser/test_trace_viewer.py -v
    BOOK_SITE=/tmp/site pytest -m browser tests/browser/test_trace_viewer.py   # another build

As tests/browser/test_site.py: Debian's /usr/bin/chromium through Playwright, the site served
on loopback, every other request refused. Screenshots of chapters 7 and 9's viewers at 1,400 px
go to build/screenshots/ (and to TRACE_SHOTS, when set).
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import threading
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("BOOK_SITE", ROOT / "site"))
SHOTS = [ROOT / "build" / "screenshots"] + (
    [Path(os.environ["TRACE_SHOTS"])] if os.environ.get("TRACE_SHOTS") else []
)
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]

pytestmark = pytest.mark.browser

# what the viewer shows for the current step: the summary line and one row per request
READ_STEP = """(frame) => {
  const d = frame.document, text = (id) => d.getElementById(id).textContent;
  return {
    index: Number(text('step-index')), kind: text('step-kind'), tokens: Number(text('step-tokens')),
    size: Number(text('step-size')), free: Number(text('free-pages')),
    reqs: [...d.querySelectorAll('#batch tbody tr')].map((tr) => {
      const f = (name) => tr.querySelector(`[data-field="${name}"]`).textContent;
      return { uid: Number(tr.dataset.uid), row: Number(f('row')), cached_len: Number(f('cached_len')),
               extend_len: Number(f('extend_len')), device_len: Number(f('device_len')),
               pages: Number(f('pages')), new_pages: Number(f('new_pages')),
               sampled: f('sampled') === '—' ? null : Number(f('sampled').split(' ')[0]) };
    }),
    rows: [...d.querySelectorAll('#ptable tr[data-row]')].filter((tr) => !tr.textContent.endsWith('free'))
      .map((tr) => Number(tr.dataset.row)),
    newCells: d.querySelectorAll('#pool .new').length,
    freedCells: d.querySelectorAll('#pool .freed').length,
    nowColumn: [...d.querySelectorAll('#timeline th.now')].map((th) => Number(th.dataset.step)),
  };
}"""


def expected(step: dict) -> dict:
    return {
        "index": step["index"],
        "kind": step["kind"],
        "tokens": step["num_tokens"],
        "size": len(step["reqs"]),
        "free": step["free_pages"],
        "reqs": [
            {
                "uid": r["uid"],
                "row": r["row"],
                "cached_len": r["cached_len"],
                "extend_len": r["extend_len"],
                "device_len": r["device_len"],
                "pages": len(r["pages"]),
                "new_pages": len(r["new_pages"]),
                "sampled": r["sampled"],
            }
            for r in step["reqs"]
        ],
        "rows": sorted(row["row"] for row in step["rows"]),
        "newCells": len({p for r in step["reqs"] for p in r["new_pages"]}),
        "freedCells": len(step["freed"]),
        "nowColumn": [step["index"]],
    }


def _skip_reason() -> str | None:
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is absent (on Debian: apt-get install chromium)"
    if not list(SITE.glob("chapters/ch07_*/index.html")):
        return f"{SITE} has no chapter 7 page (run: mkdocs build --strict)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright; no browser download needed)"
    return None


@pytest.fixture(scope="module")
def site_url() -> Iterator[str]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(SITE))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser(site_url: str):
    from playwright.sync_api import sync_playwright

    for d in SHOTS:
        d.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        yield browser
        browser.close()


def _open_viewer(browser, site_url: str, chapter: str, width: int):
    """The chapter page at ``width`` px and its viewer's frame, scrolled into view."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.route(re.compile(r"^https?://(?!127\.0\.0\.1[:/]).*"), lambda route: route.abort())
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(site_url + f"chapters/{chapter}/")
    iframe = page.locator("iframe.trace-viewer")
    assert iframe.count() == 1, f"{chapter} embeds {iframe.count()} trace viewers"
    iframe.scroll_into_view_if_needed()
    frame = iframe.element_handle().content_frame()
    frame.wait_for_function("document.getElementById('step-kind').textContent !== ''")
    return page, iframe, frame, errors


def _read(frame) -> dict:
    return frame.evaluate(f"({READ_STEP})(window)")


def test_chapter7_viewer_shows_the_trace_step_by_step(browser, site_url: str):
    trace = json.loads((ROOT / "outputs" / "traces" / "ch07_scheduler.json").read_text())
    steps = trace["steps"]
    page, iframe, frame, errors = _open_viewer(browser, site_url, "ch07_scheduler", 1400)
    # the page carries the stored trace itself, not a copy of an older one
    embedded = frame.evaluate("JSON.parse(document.getElementById('trace-data').textContent)")
    assert embedded == trace
    assert _read(frame) == expected(steps[0])
    for k in range(1, len(steps)):  # "next" through every step
        frame.click("#next")
        assert _read(frame) == expected(steps[k]), f"step {k}"
    frame.click("#next")  # past the end: stays on the last step
    assert _read(frame)["index"] == len(steps) - 1
    for k in range(len(steps) - 2, -1, -1):  # "prev" all the way back
        frame.click("#prev")
        assert _read(frame) == expected(steps[k]), f"step {k}"
    frame.focus("#next")  # the arrow keys step too
    frame.press("body", "ArrowRight")
    frame.press("body", "ArrowRight")
    assert _read(frame) == expected(steps[2])
    frame.press("body", "ArrowLeft")
    assert _read(frame) == expected(steps[1])
    frame.press("body", "End")
    assert _read(frame)["index"] == len(steps) - 1
    frame.evaluate("(() => { const s = document.getElementById('scrub'); s.value = 3; "
                   "s.dispatchEvent(new Event('input')); })()")  # fmt: skip
    assert _read(frame) == expected(steps[3])
    # play advances by itself, pause stops it
    frame.click("#play")
    frame.wait_for_function("Number(document.getElementById('step-index').textContent) >= 5")
    frame.click("#play")
    stopped = _read(frame)["index"]
    page.wait_for_timeout(2000)
    assert _read(frame)["index"] == stopped and frame.inner_text("#play").endswith("play")
    assert _read(frame) == expected(steps[stopped])
    # the frame is as tall as the viewer: nothing scrolls inside it
    inner = frame.evaluate("document.documentElement.scrollHeight")
    assert inner <= iframe.bounding_box()["height"] + 2
    assert errors == []
    page.context.close()


@pytest.mark.parametrize("chapter", ["ch07_scheduler", "ch09_radix_cache"])
def test_viewer_screenshot_at_1400_px(browser, site_url: str, chapter: str):
    trace = json.loads((ROOT / "outputs" / "traces" / f"{chapter}.json").read_text())
    page, iframe, frame, errors = _open_viewer(browser, site_url, chapter, 1400)
    k = 3 if chapter == "ch07_scheduler" else 4  # uid1 leaves; the shared prefix is locked twice
    frame.focus("#next")  # the keys go to the frame that has the focus
    for _ in range(k):
        frame.press("body", "ArrowRight")
    assert _read(frame) == expected(trace["steps"][k])
    if chapter == "ch09_radix_cache":
        nodes = trace["steps"][k]["radix"]["nodes"]
        shown = frame.evaluate("document.querySelectorAll('#tree [data-node]').length")
        assert shown == len(nodes)
    # the whole page, clipped to the frame: the site's fixed header stays out of the picture
    box = iframe.bounding_box()
    top = box["y"] + page.evaluate("window.scrollY")
    clip = {"x": box["x"], "y": top, "width": box["width"], "height": box["height"]}
    for d in SHOTS:
        page.screenshot(path=str(d / f"{chapter}_viewer_1400.png"), full_page=True, clip=clip)
    assert errors == []
    page.context.close()


def test_the_viewer_page_fits_1000_px(browser, site_url: str):
    """The viewer's own page (its "full page" link) at a narrow window: nothing scrolls sideways."""
    context = browser.new_context(viewport={"width": 1000, "height": 900})
    page = context.new_page()
    for name in sorted(p.stem for p in (ROOT / "outputs" / "traces").glob("*.json")):
        page.goto(site_url + f"traces/{name}.html")
        for _ in range(3):
            page.keyboard.press("ArrowRight")
        assert page.inner_text("#step-index") == "3"
        assert page.evaluate("document.documentElement.scrollWidth") <= 1000, name
    context.close()


def test_the_book_pages_keys_step_its_viewer_and_it_says_what_it_shows(browser, site_url: str):
    """No click first: ← and → on the chapter's page step the viewer that crosses the middle of
    the window; the keys are written on the page, the step range matches the step numbers, and
    the time chart's title says whether the run overlapped."""
    for chapter in ("ch07_scheduler", "ch11_overlap"):
        trace = json.loads((ROOT / "outputs" / "traces" / f"{chapter}.json").read_text())
        page, iframe, frame, errors = _open_viewer(browser, site_url, chapter, 1400)
        page.evaluate(  # the frame's top 100 px below the window's: it crosses the middle
            "window.scrollBy(0, document.querySelector('iframe.trace-viewer')"
            ".getBoundingClientRect().top - 100)"
        )
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowLeft")
        assert _read(frame) == expected(trace["steps"][1]), chapter
        assert "← → step" in frame.inner_text(".controls")
        last = len(trace["steps"]) - 1
        assert frame.inner_text("#step-range") == f"0-{last}"
        assert f"steps (0-{last})" in frame.inner_text("#title")
        # text_content: a trace without step times hides the chart, and its title with it
        overlap_off = "(overlap off)" in (frame.text_content("#gantt-title") or "")
        assert overlap_off == (not trace["config"]["overlap"]), chapter
        assert errors == []
        page.context.close()
