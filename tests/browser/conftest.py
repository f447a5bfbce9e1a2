"""Browser tests of the built site: `pytest -m browser tests/browser` after `mkdocs build`."""


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: drives the built site in a headless Chromium (needs /usr/bin/chromium and site/)")
