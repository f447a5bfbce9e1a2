"""Drive the built site in a real browser: every page's listings and tables fit, a code link
opens its lines in the source browser, search finds a symbol.

    mkdocs build --strict && pytest -m browser tests/browser -v

Uses the Playwright Python API with the machine's own Chromium (`/usr/bin/chromium`, on
Debian `apt-get install chromium`); no browser is ever downloaded. The site is served from
site/ on a free loopback port and every other request is refused, so the test needs no
network and proves the site works offline. Screenshots go to build/screenshots/.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import threading
from pathlib import Path
from typing import Iterator, List

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "site"
SHOTS = ROOT / "build" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WIDTHS = (1400, 1000)  # a laptop, both sidebars shown; a narrow window, the table of contents only
COLUMNS = 100  # the project's line length: a listing this wide fits at WIDTHS (extra.css)
# Elements allowed to scroll sideways at WIDTHS, each named with its reason. None: a listing
# of at most COLUMNS columns fits (a wider one, a long command or a program's output, scrolls
# by design) and every table fits; add a selector only for a deliberate scroller.
DELIBERATE_SCROLLERS: List[str] = []

# Every listing (`pre`, and the `code` inside it that mkdocs-material makes the scroller) of at
# most COLUMNS columns (a diff's +/- column aside), every table and the wrapper material puts
# around it, that is wider inside than it shows. Folded answers are opened first: what a
# reader unfolds must fit too.
OVERFLOWING = """([allowed, columns]) => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  const found = [];
  const sel = 'article pre, article pre > code, article table, article .md-typeset__scrollwrap';
  for (const e of document.querySelectorAll(sel)) {
    if (allowed.some(s => e.closest(s))) continue;
    if (e.closest('pre')) {
      const diff = e.closest('.language-diff') ? 1 : 0;
      const widest = Math.max(...(e.textContent || '').split('\\n').map(l => l.length));
      if (widest > columns + diff) continue;  // wider than the project's lines: it scrolls
    }
    if (e.scrollWidth > e.clientWidth) {
      found.push(`${e.tagName.toLowerCase()} ${e.scrollWidth}>${e.clientWidth} px: ` +
                 (e.innerText || '').trim().split('\\n')[0].slice(0, 60));
    }
  }
  return found;
}"""


pytestmark = pytest.mark.browser


def _skip_reason() -> str | None:
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is absent (on Debian: apt-get install chromium)"
    if not (SITE / "index.html").is_file():
        return "site/ is not built (run: mkdocs build --strict)"
    if not list((SITE / "chapters").glob("ch07_*/index.html")):
        return "site/ has no chapter 7 page"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright; no browser download needed)"
    return None


def _site_pages() -> List[str]:
    """Every page of the built site, as a path relative to its root ("" is the home page)."""
    pages = [p.parent.relative_to(SITE).as_posix() for p in SITE.rglob("index.html")]
    return sorted("" if p == "." else p + "/" for p in pages)


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
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser(site_url: str):
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        yield browser
        browser.close()


def _new_page(browser, width: int = 1280, search: bool = True):
    context = browser.new_context(viewport={"width": width, "height": 900})
    # offline: nothing but the local site is fetched (the route registered last is tried first)
    context.route(re.compile(r"^https?://(?!127\.0\.0\.1[:/]).*"), lambda route: route.abort())
    if not search:  # the search index is 1 MB that every page's worker would parse again
        index = json.loads((SITE / "search" / "search_index.json").read_text(encoding="utf-8"))
        empty = json.dumps({"config": index["config"], "docs": []})
        context.route(
            re.compile(r".*/search/search_index\.json$"),
            lambda route: route.fulfill(content_type="application/json", body=empty),
        )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.js_errors = errors  # type: ignore[attr-defined]
    return page


@pytest.fixture
def page(browser):
    page = _new_page(browser)
    yield page
    page.context.close()


def test_no_listing_or_table_scrolls_or_clips_on_any_page(browser, site_url: str):
    """At each of WIDTHS, on every page, source pages included."""
    page = _new_page(browser, WIDTHS[0], search=False)
    pages = _site_pages()
    assert len(pages) > 100, "the source browser's pages are missing"
    overflowing: dict = {}
    for rel in pages:
        page.goto(site_url + rel, wait_until="domcontentloaded")
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 900})
            found = page.evaluate(OVERFLOWING, [DELIBERATE_SCROLLERS, COLUMNS])
            if found:
                overflowing[f"{width} px: {rel or 'home'}"] = found
    chapter7 = site_url + next(p for p in pages if p.startswith("chapters/ch07_"))
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(chapter7)
        page.locator("#what-it-prints").scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / f"ch07_what_it_prints_{width}.png"))
        page.screenshot(path=str(SHOTS / f"ch07_full_{width}.png"), full_page=True)
    assert page.js_errors == []  # type: ignore[attr-defined]
    page.context.close()
    count = sum(map(len, overflowing.values()))
    assert overflowing == {}, f"{count} elements overflow on {len(overflowing)} pages"


def test_on_a_phone_code_scrolls_sideways_and_never_wraps(browser, site_url: str):
    """At 390 px chapter 7's long lines scroll inside their listing; no line of any listing
    breaks onto a second row, and the copy button copies a listing as written."""
    page = _new_page(browser, 390)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=site_url[:-1])
    page.goto(site_url + "chapters/ch07_scheduler/")
    found = page.evaluate("""() => {
      document.querySelectorAll('details').forEach(d => { d.open = true; });
      let scrolling = null, wrapped = [];
      for (const code of document.querySelectorAll('article pre > code')) {
        if (getComputedStyle(code).whiteSpace !== 'pre') wrapped.push('white-space');
        const height = parseFloat(getComputedStyle(code).lineHeight);
        for (const line of code.querySelectorAll('span[id^="__span-"]')) {
          const box = line.getBoundingClientRect();
          if (line.textContent.trim() && box.height > 1.5 * height)
            wrapped.push(line.textContent.trim().slice(0, 60));
        }
        if (!scrolling && code.scrollWidth > code.clientWidth) {
          code.id = 'scrolling-listing'; scrolling = code.textContent;
        }
      }
      return {scrolling, wrapped};
    }""")
    assert found["wrapped"] == [], f"lines that wrap at 390 px: {found['wrapped'][:5]}"
    assert found["scrolling"], "no listing of chapter 7 scrolls at 390 px: this test checks nothing"
    block = page.locator("#scrolling-listing").locator("xpath=..")
    block.hover()
    block.locator('button[data-md-type="copy"]').click()
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied.rstrip("\n") == found["scrolling"].rstrip("\n")
    page.context.close()


def test_a_code_title_opens_its_lines_in_the_source_browser(page, site_url: str):
    page.goto(site_url)
    assert "mini-sglang from Scratch" in page.title()
    page.screenshot(path=str(SHOTS / "01_home.png"), full_page=True)

    # the sidebar lists chapter 7 under its stage
    link = page.locator("nav.md-nav a.md-nav__link", has_text=re.compile(r"^\s*7\.\s")).first
    link.click()
    page.wait_for_url(re.compile(r"/chapters/ch07_[a-z_]+/$"))
    chapter_url = page.url
    assert page.locator(".chapter-stage", has_text="Stage 2").count() == 1

    # the link under the listing titled `minisgl/scheduler/scheduler.py · Scheduler.normal_loop`
    title = page.locator(
        ".highlight .filename", has_text="minisgl/scheduler/scheduler.py · Scheduler.normal_loop"
    ).first
    listing = title.locator("xpath=..").locator("code").text_content() or ""
    target = title.locator("xpath=../following::a[contains(@class, 'code-link')][1]")
    m = re.search(r"lines (\d+)–(\d+)", target.inner_text())
    assert m, target.inner_text()
    first, last = int(m.group(1)), int(m.group(2))
    href = target.get_attribute("href") or ""
    # chapter 7's own version of the file, the one the listing was cut from
    assert href.endswith(f"source/ch07/minisgl/scheduler/scheduler.py/#L{first}-L{last}"), href
    target.click()
    page.wait_for_url(
        re.compile(rf"/source/ch07/minisgl/scheduler/scheduler\.py/#L{first}-L{last}$")
    )
    page.wait_for_selector(".source-hl")

    # exactly those lines are marked, they read as the listing did, and the first is in view
    marked = page.locator(".source-listing span.source-hl")
    assert marked.count() == last - first + 1
    assert page.locator(f"#L{first}").evaluate("a => a.parentElement.id").endswith(f"-{first}")
    lines = [t.rstrip("\n") for t in marked.all_text_contents()]
    indent = min(len(x) - len(x.lstrip()) for x in lines if x.strip())
    assert "\n".join(x[indent:] for x in lines).strip() == listing.strip()
    top = page.locator(f"#L{first}").bounding_box()
    assert top is not None and 0 <= top["y"] < 900
    page.screenshot(path=str(SHOTS / "03_code_link_source_page.png"))

    page.go_back()
    page.wait_for_url(chapter_url)
    assert page.locator(".chapter-stage").count() == 1

    # the notebook link points at a notebook the site really serves
    nb = page.locator(".chapter-meta a[href$='.ipynb']").first
    response = page.request.get(nb.evaluate("a => a.href"))
    assert response.ok and '"nbformat": 4' in response.text()
    assert page.js_errors == []  # type: ignore[attr-defined]


def test_no_page_links_a_repository_that_is_not_configured(page, site_url: str):
    """Only upstream (pinned links into sgl-project) and BOOK_REPO_URL, when it is set."""
    repo = os.environ.get("BOOK_REPO_URL", "").rstrip("/")
    bad = {}
    for rel in [p for p in _site_pages() if not p.startswith("source/")]:
        page.goto(site_url + rel)
        hrefs = page.evaluate("() => [...document.querySelectorAll('a[href]')].map(a => a.href)")
        wrong = [
            h
            for h in hrefs
            if re.match(r"https?://(www\.)?(github|gitlab)\.com/", h)
            and not h.startswith("https://github.com/sgl-project/")
            and not (repo and h.startswith(repo))
        ]
        if not repo and page.locator(".md-source, .md-content__button").count():
            wrong.append("a repository button or an edit button")
        if wrong:
            bad[rel] = wrong
    assert bad == {}


def test_search_finds_prefill_adder(page, site_url: str):
    page.goto(site_url)
    page.locator("label.md-search__icon, .md-search__input").first.click()
    box = page.locator("input.md-search__input")
    results = page.locator(".md-search-result__item")
    # the search index loads in a web worker: a query typed before it is ready is dropped,
    # so type again until results show (or give up after ~20 s)
    for _ in range(10):
        box.fill("")
        box.press_sequentially("PrefillAdder", delay=20)
        try:
            results.first.wait_for(timeout=2_000)
            break
        except Exception:
            continue
    assert results.count() >= 1
    assert "PrefillAdder" in page.locator(".md-search-result").inner_text()
    page.screenshot(path=str(SHOTS / "05_search_prefilladder.png"))
    results.first.locator("a").first.click()
    page.wait_for_load_state()
    assert page.url.startswith(site_url)
    page.screenshot(path=str(SHOTS / "06_search_result.png"))
