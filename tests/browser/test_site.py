"""Drive the built site in a real browser: home -> chapter 7 -> a code link -> back, then search.

    mkdocs build --strict && pytest -m browser tests/browser -v

Uses the Playwright Python API with the machine's own Chromium (`/usr/bin/chromium`, on
Debian `apt-get install chromium`); no browser is ever downloaded. The site is served from
site/ on a free loopback port. Links to GitHub are answered by a local stub, so the test
needs no network. Screenshots go to build/screenshots/.
"""

from __future__ import annotations

import functools
import http.server
import re
import threading
from pathlib import Path
from typing import Iterator

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
def page(site_url: str):
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        # no network: nothing leaves the machine, and GitHub links get a local stub that
        # says which URL was asked for (the route registered last is tried first)
        context.route(re.compile(r"^https?://(?!127\.0\.0\.1).*"), lambda route: route.abort())
        context.route(
            re.compile(r"^https://github\.com/.*"),
            lambda route: route.fulfill(
                status=200,
                content_type="text/html",
                body=f"<title>GitHub (stub)</title><h1>stub for</h1><p id='url'>{route.request.url}</p>",
            ),
        )
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.js_errors = errors  # type: ignore[attr-defined]
        yield page
        context.close()
        browser.close()


def test_home_to_chapter_7_to_a_code_link_and_back(page, site_url: str):
    page.goto(site_url)
    assert "mini-sglang from Scratch" in page.title()
    page.screenshot(path=str(SHOTS / "01_home.png"), full_page=True)

    # the sidebar lists chapter 7 under its stage
    link = page.locator("nav.md-nav a.md-nav__link", has_text=re.compile(r"^\s*7\.\s")).first
    link.click()
    page.wait_for_url(re.compile(r"/chapters/ch07_[a-z_]+/$"))
    chapter_url = page.url
    assert page.locator("article h1").first.is_visible()
    assert page.locator(".chapter-stage", has_text="Stage 2").count() == 1
    page.screenshot(path=str(SHOTS / "02_chapter07.png"), full_page=True)

    # a code excerpt's link when the prose has one, else the chapter's main
    code_links = page.locator("article a.code-link")
    target = (
        code_links.first
        if code_links.count()
        else page.locator(".chapter-meta a[href*='/blob/main/']").first
    )
    href = target.get_attribute("href") or ""
    assert re.search(r"/blob/main/[\w/]+\.py(#L\d+-L\d+)?$", href), href
    target.click()
    page.wait_for_url(href)
    # the stub page echoes the URL it was asked for; a #L10-L20 fragment never leaves the browser
    assert page.locator("#url").inner_text() == href.split("#")[0]
    page.screenshot(path=str(SHOTS / "03_code_link.png"))

    page.go_back()
    page.wait_for_url(chapter_url)
    assert page.locator(".chapter-stage").count() == 1
    page.screenshot(path=str(SHOTS / "04_back_on_chapter07.png"))

    # the notebook link points at a notebook the site really serves
    nb = page.locator(".chapter-meta a[href$='.ipynb']").first
    response = page.request.get(nb.evaluate("a => a.href"))
    assert response.ok and '"nbformat": 4' in response.text()
    assert page.js_errors == []  # type: ignore[attr-defined]


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
