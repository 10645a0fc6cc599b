"""Fixtures for tests that drive a real headless Chromium (skipped where there is none)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The profiles these tests open are shared with tests/test_view_cli.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chrome_pipe import Chrome, find_chromium  # noqa: E402

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
