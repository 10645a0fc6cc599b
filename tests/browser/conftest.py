"""Fixtures for tests that drive a real headless Chromium (skipped where there is none)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.browser.chrome_pipe import Chrome, find_chromium

CHROMIUM = find_chromium()


@pytest.fixture(scope="module")
def chrome() -> Iterator[Chrome]:
    """One headless Chromium per test module, with the event domains the tests read."""
    if CHROMIUM is None:
        pytest.skip("no chromium installed (apt-get install chromium)")
    browser = Chrome(CHROMIUM)
    try:
        for domain in ("Page", "Network", "Runtime"):
            browser.send(f"{domain}.enable")
        yield browser
    finally:
        browser.close()
