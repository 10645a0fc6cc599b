"""A click on the strip, in a real headless Chromium: the moment's memory keeps its categories.

A real torch training step recorded by the dispatch recorder on a clock the
test drives (tests/helpers/fake_clock.py): the gradients live for 300 ms
after the optimizer step, then ``zero_grad(set_to_none=True)`` frees them.
A click inside those 300 ms, then the label selector's ``category=gradient``,
must show the model's gradient bytes (``numel() * element_size()``), and the
page's totals match ``moment.at`` at the instant the page chose.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuflame.cli.main import main
from gpuflame.formats import load, save
from gpuflame.model import moment
from tests.browser.chrome_pipe import Chrome, find_chromium
from tests.browser.viewer_page import choose, open_viewer, settle
from tests.helpers.fake_clock import driven_clock

torch = pytest.importorskip("torch")
CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install chromium)")


def train(clock: Any) -> tuple[Any, int, int]:
    """One AdamW step; the gradients then live 300 ms. The model, and when the gradients were made and freed."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
    stepped = clock.ns
    clock.advance(0.3)
    freed = clock.ns
    opt.zero_grad(set_to_none=True)
    clock.advance(0.3)
    return model, stepped, freed


def test_a_click_keeps_each_block_s_category(chrome: Chrome, tmp_path: Path) -> None:
    from gpuflame.capture.recorders.dispatch import TorchTensorRecorder

    with driven_clock() as clock:
        rec = TorchTensorRecorder()
        rec.start()
        model, stepped, freed = train(clock)
        rec.stop()
    save(rec.snapshot(), tmp_path / "step.pb.gz")
    assert main(["view", str(tmp_path / "step.pb.gz")]) == 0
    profile = load(tmp_path / "step.pb.gz")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    zero = moment.origin(profile)

    chrome.events.clear()
    open_viewer(chrome, tmp_path / "step.html")
    at = (stepped + freed) // 2 - zero  # the gradients live, 150 ms from either edge
    local = chrome.evaluate(f"window.gpuflameTimelineAt({at}, 0)")
    rect = chrome.evaluate(
        "(() => { const r = document.getElementById('timeline').getBoundingClientRect(); "
        "return {left: r.left, top: r.top, height: r.height}; })()"
    )
    chrome.click(rect["left"] + local["x"], rect["top"] + rect["height"] / 2)
    s = settle(chrome)
    t1 = s["moment"]["t1"]
    assert s["moment"]["error"] is None and stepped < zero + t1 < freed
    expected = moment.at(profile, t1 / 1e9)
    assert s["total"] == expected.totals()["inuse_space"]
    options = chrome.evaluate(
        "[...document.querySelectorAll('#label-select option')].map(o => [o.value, o.textContent])"
    )
    for category in ("gradient", "parameter"):
        choose(chrome, "label-select", next(v for v, text in options if text == f"category={category}"))
        assert settle(chrome)["total"] == params, category
    assert not chrome.events_named("Runtime.exceptionThrown")
