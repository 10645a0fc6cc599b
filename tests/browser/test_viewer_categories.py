"""The viewer's categories in headless Chromium: the label selector keeps one category, and the
colour-by-category mode paints each bar the colour of the kind of memory holding most of its bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuflame.cli.main import main
from gpuflame.formats import save
from gpuflame.model import Frame, Profile
from gpuflame.model.categories import CATEGORIES
from tests.browser.chrome_pipe import Chrome, find_chromium
from tests.browser.viewer_page import choose, open_viewer, settle, state

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install chromium)")

MiB = 1 << 20
MAIN = Frame("main", "/w/train.py", 3)
INIT = Frame("Linear > __init__", "/w/linear.py", 10)
STEP = Frame("Adam > _init_group", "/t/optim/adam.py", 139)
MIXED = Frame("train_step", "/w/train.py", 20)  # holds 3 MiB of optimizer state and 1 MiB of activations
FWD = Frame("MLP > forward", "/w/mlp.py", 5)
PARAMETER_BLUE, OPTIMIZER_TEAL = "#4e79a7", "#76b7b2"


def category_profile() -> Profile:
    p = Profile([("peak_space", "bytes")], default_type="peak_space")
    p.add([INIT, MAIN], [2 * MiB], {"category": "parameter", "pid": "1"})
    p.add([STEP, MIXED, MAIN], [3 * MiB], {"category": "optimizer_state", "pid": "1"})
    p.add([FWD, MIXED, MAIN], [1 * MiB], {"category": "activation", "pid": "1"})
    return p


def make_page(tmp_path: Path, profile: Profile) -> Path:
    save(profile, tmp_path / "cat.pb.gz")
    assert main(["view", str(tmp_path / "cat.pb.gz")]) == 0
    return tmp_path / "cat.html"


def test_colour_by_category_paints_the_dominant_kind(chrome: Chrome, tmp_path: Path) -> None:
    s = open_viewer(chrome, make_page(tmp_path, category_profile()))
    assert s["error"] is None and s["categoryBox"] and not s["byCategory"]
    plain = chrome.evaluate("window.gpuflameBar('Linear > __init__').color")
    assert plain != PARAMETER_BLUE  # the usual palette until the mode is on
    chrome.evaluate("document.getElementById('by-category').click()")
    s = settle(chrome)
    assert s["byCategory"]
    init = chrome.evaluate("window.gpuflameBar('Linear > __init__')")
    mixed = chrome.evaluate("window.gpuflameBar('train_step')")
    assert (init["color"], init["category"]) == (PARAMETER_BLUE, "parameter")
    assert (mixed["color"], mixed["category"]) == (OPTIMIZER_TEAL, "optimizer_state")  # 3 MiB of its 4
    legend = chrome.evaluate("[...document.querySelectorAll('#category-legend .swatch')].map(e => e.textContent)")
    assert legend == list(CATEGORIES)  # the whole vocabulary, in the model's order
    assert chrome.evaluate("!document.getElementById('category-legend').hidden")


def test_label_selector_keeps_one_category(chrome: Chrome, tmp_path: Path) -> None:
    open_viewer(chrome, make_page(tmp_path, category_profile()))
    options = chrome.evaluate(
        "[...document.querySelectorAll('#label-select option')].map(o => [o.value, o.textContent])"
    )
    value = next(v for v, text in options if text == "category=optimizer_state")
    choose(chrome, "label-select", value)
    assert settle(chrome)["total"] == 3 * MiB


def test_no_category_switch_without_categories(chrome: Chrome, tmp_path: Path) -> None:
    p = Profile([("peak_space", "bytes")], default_type="peak_space")
    p.add([INIT, MAIN], [MiB], {"pid": "1"})
    s = open_viewer(chrome, make_page(tmp_path, p))
    assert s["error"] is None and not s["categoryBox"]
    assert not state(chrome)["byCategory"]


def test_label_selector_keeps_one_phase(chrome: Chrome, tmp_path: Path) -> None:
    """Phases (model/phases.py) use the same selector: keep the memory one phase allocated."""
    p = Profile([("peak_space", "bytes")], default_type="peak_space")
    p.add([INIT, MAIN], [2 * MiB], {"phase": "load_model", "pid": "1"})
    p.add([FWD, MIXED, MAIN], [5 * MiB], {"phase": "train", "pid": "1"})
    open_viewer(chrome, make_page(tmp_path, p))
    options = chrome.evaluate(
        "[...document.querySelectorAll('#label-select option')].map(o => [o.value, o.textContent])"
    )
    choose(chrome, "label-select", next(v for v, text in options if text == "phase=load_model"))
    assert settle(chrome)["total"] == 2 * MiB
