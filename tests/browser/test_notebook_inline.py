"""A real notebook's saved ``%%gpuflame`` output, rendered in headless Chromium.

The notebook runs in a real IPython kernel (nbclient + ipykernel) on a
LlamaMLP built by transformers from a config (random weights). Its saved
text/html output is put into a page as a notebook front end puts an output
(into the DOM, from a file:// page it did not write), and the sandboxed
``<iframe srcdoc>`` must draw the flame graph on its own: the right names,
no network request, no error. The screenshot is docs/notebook.md's picture
(``GPUFLAME_UPDATE_DOCS=1`` writes it to docs/).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser.chrome_pipe import Chrome, find_chromium
from tests.browser.viewer_page import READY
from tests.helpers.notebook_kernel import execute

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install chromium)")
DOCS_PICTURE = Path(__file__).resolve().parents[2] / "docs" / "notebook-inline.png"

CELLS = [
    "%load_ext gpuflame",
    """import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP
torch.manual_seed(0)
config = LlamaConfig(hidden_size=256, intermediate_size=1024, hidden_act="silu")""",
    """%%gpuflame
mlp = LlamaMLP(config)
y = mlp(torch.randn(64, 256))
y.shape""",
]


@pytest.fixture(scope="module")
def output_html(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The text/html of the %%gpuflame cell, as saved in the .ipynb."""
    nb = execute(CELLS, tmp_path_factory.mktemp("notebook"))
    outputs = nb.cells[2].outputs
    assert [o.output_type for o in outputs] == ["display_data", "execute_result"], outputs
    assert outputs[1]["data"]["text/plain"] == "torch.Size([64, 256])"
    return outputs[0]["data"]["text/html"]


@pytest.fixture
def inline(output_html: str, tmp_path: Path) -> Iterator[tuple[Chrome, str, Path]]:
    """Chromium showing the output in a host page; the sandboxed frame's DevTools session."""
    host = tmp_path / "host.html"
    host.write_text(f"<!doctype html><html><body><div class='output'>{output_html}</div></body></html>")
    chrome = Chrome(CHROMIUM, width=1100, height=800)
    try:
        for domain in ("Page", "Network", "Runtime"):
            chrome.send(f"{domain}.enable")
        # the sandboxed frame is its own renderer: attach to it paused, watch it from its first request
        chrome.send("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": True, "flatten": True})
        chrome.send("Page.navigate", {"url": host.as_uri()})
        frame = _wait_for_frame(chrome)
        for domain in ("Network", "Runtime"):
            chrome.send(f"{domain}.enable", session=frame)
        chrome.send("Runtime.runIfWaitingForDebugger", session=frame)
        yield chrome, frame, host
    finally:
        chrome.close()


def _wait_for_frame(chrome: Chrome) -> str:
    def attached() -> list[str]:
        return [
            e["params"]["sessionId"]
            for e in chrome.events_named("Target.attachedToTarget")
            if e["params"]["targetInfo"]["type"] == "iframe"
        ]

    chrome.wait_for("document.readyState === 'complete'")
    for _ in range(200):
        if attached():
            return attached()[0]
        chrome.evaluate("new Promise((r) => setTimeout(r, 50))")
    raise AssertionError("the output's iframe never started")


def test_the_saved_output_draws_the_flame_graph_inline(inline: tuple[Chrome, str, Path], tmp_path: Path) -> None:
    chrome, frame, host = inline
    state = chrome.wait_for(READY, session=frame)
    assert state["error"] is None and state["drawnRects"] >= 5
    assert state["type"] == "peak_space"
    labels = set(chrome.evaluate("window.gpuflameBarLabels()", session=frame))
    assert {"LlamaMLP > __init__", "LlamaMLP > forward", "Linear > __init__", "<module>"} <= labels
    # the kernel's own frames were cut away: the cell is the root
    assert not {name for name in labels if "InteractiveShell" in name or "Kernel" in name}
    requests = [e for e in chrome.events_named("Network.requestWillBeSent")]
    assert [e["params"]["request"]["url"] for e in requests] == [host.as_uri()]
    assert not chrome.events_named("Runtime.exceptionThrown")
    # the frame is sandboxed: the host page cannot reach into it (opaque origin)
    assert (
        chrome.evaluate(
            "(() => { try { return document.querySelector('iframe').contentWindow.document && 'open'; }"
            " catch (e) { return 'blocked'; } })()"
        )
        == "blocked"
    )
    picture = _screenshot(chrome)
    (tmp_path / "notebook-inline.png").write_bytes(picture)
    assert picture[:8] == b"\x89PNG\r\n\x1a\n" and len(picture) > 10_000
    if os.environ.get("GPUFLAME_UPDATE_DOCS"):
        DOCS_PICTURE.write_bytes(picture)


def test_the_frame_is_tall_enough_for_the_whole_graph(inline: tuple[Chrome, str, Path]) -> None:
    """The bottom ``total`` bar shows without scrolling the frame (it was cut off when the toolbar wrapped)."""
    chrome, frame, _ = inline
    chrome.wait_for(READY, session=frame)
    fits = chrome.evaluate(
        "document.getElementById('graph').getBoundingClientRect().bottom <= window.innerHeight", session=frame
    )
    assert fits is True


def _screenshot(chrome: Chrome) -> bytes:
    """The output only (the iframe and its caption), as a notebook shows it."""
    import base64

    box = chrome.evaluate(
        "(() => { const r = document.querySelector('.output').getBoundingClientRect(); "
        "return {x: r.left, y: r.top, width: r.width, height: r.height}; })()"
    )
    clip = {**box, "scale": 1}
    return base64.b64decode(chrome.send("Page.captureScreenshot", {"format": "png", "clip": clip})["data"])
