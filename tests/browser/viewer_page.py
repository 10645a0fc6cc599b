"""Open the viewer page in headless Chromium and read or drive its state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.browser.chrome_pipe import Chrome

READY = "window.gpuflameState && (window.gpuflameState.ready || window.gpuflameState.error) && window.gpuflameState"


def open_viewer(chrome: Chrome, html: Path) -> dict[str, Any]:
    """Load a viewer page from file:// and wait until it has drawn (or failed); its state."""
    chrome.send("Page.navigate", {"url": html.as_uri()})
    return chrome.wait_for(READY)


def state(chrome: Chrome) -> dict:
    return chrome.evaluate("window.gpuflameState")


def search(chrome: Chrome, text: str) -> dict:
    chrome.evaluate(
        "(() => { const s = document.getElementById('search'); s.value = ''; s.focus(); "
        "s.dispatchEvent(new Event('input')); })()"
    )
    chrome.type_text(text)
    return chrome.wait_for(f"window.gpuflameState.query === {json.dumps(text)} && window.gpuflameState")


def choose(chrome: Chrome, select_id: str, value: str) -> None:
    chrome.evaluate(
        f"(() => {{ const s = document.getElementById({json.dumps(select_id)}); "
        f"s.value = {json.dumps(value)}; s.dispatchEvent(new Event('change')); }})()"
    )


def click_bar(chrome: Chrome, name: str) -> None:
    centre = chrome.wait_for(f"window.gpuflameBarCenter({json.dumps(name)})")
    chrome.click(centre["x"], centre["y"])


def settle(chrome: Chrome) -> dict:
    """The state after the next animation frame (drawing is batched to frames)."""
    chrome.evaluate("new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")
    return state(chrome)
