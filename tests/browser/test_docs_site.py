"""The documentation site in a real headless Chromium at 1280 px, the width the pages were
found wanting at: the home page's flame graph must be readable at the size it is shown, and
no code block may clip a line (commands wrap, what a command prints scrolls).

The site is built here with MkDocs (the docs extra, which the test extra includes), into a
folder of the test's own; a screenshot of each page is kept beside it for a reader.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser.chrome_pipe import Chrome
from tests.browser.conftest import CHROMIUM
from tests.helpers.paths import REPO

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install chromium)")

# The SVG's labels are 12 px (render/svg.py); shown below 10 px they stop being readable.
SVG_FONT_PX = 12
READABLE_PX = 10


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out


def load(chrome: Chrome, page: Path) -> None:
    chrome.send("Page.navigate", {"url": page.as_uri()})
    chrome.wait_for("document.readyState === 'complete' && document.images.length >= 0")
    chrome.wait_for("Array.from(document.images).every(i => i.complete)")


def keep_screenshot(chrome: Chrome, path: Path) -> None:
    path.write_bytes(base64.b64decode(chrome.send("Page.captureScreenshot")["data"]))


def test_the_home_page_flame_graph_is_readable_at_its_shown_size(chrome: Chrome, site: Path) -> None:
    load(chrome, site / "index.html")
    keep_screenshot(chrome, site / "index-1280.png")
    shown = chrome.evaluate(
        "(() => { const i = document.querySelector('img[src$=\"demo-flame.svg\"]');"
        " return {shown: i.getBoundingClientRect().width, natural: i.naturalWidth,"
        " viewport: window.innerWidth}; })()"
    )
    assert shown["viewport"] == 1280
    label_px = SVG_FONT_PX * shown["shown"] / shown["natural"]
    assert label_px >= READABLE_PX, f"the flame graph's labels show at {label_px:.1f} px: {shown}"


CLIPPED = """(() => Array.from(document.querySelectorAll('.md-typeset pre > code')).map(c => {
  const block = c.closest('div[class*="language-"]');
  const style = getComputedStyle(c);
  return {lang: block ? block.className : '', clipped: c.scrollWidth > c.clientWidth + 1,
          scrolls: style.overflowX === 'auto' || style.overflowX === 'scroll',
          wraps: style.whiteSpace === 'pre-wrap', text: c.textContent.slice(0, 60)};
}))()"""


@pytest.mark.parametrize("page", ["index.html", "reading-flame-graphs.html", "run.html", "simulate.html"])
def test_code_blocks_wrap_or_scroll_instead_of_clipping(chrome: Chrome, site: Path, page: str) -> None:
    load(chrome, site / page)
    keep_screenshot(chrome, site / page.replace(".html", "-1280.png"))
    blocks = chrome.evaluate(CLIPPED)
    assert blocks, f"{page} has no code block to check"
    for block in blocks:
        if "language-text" in block["lang"]:  # what a command prints keeps its columns
            assert not block["clipped"] or block["scrolls"], block
        else:  # a command and its comment wrap
            assert block["wraps"] and not block["clipped"], block
