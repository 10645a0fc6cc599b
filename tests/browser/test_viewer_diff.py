"""Diff mode of the HTML viewer (``gpuflame view BASE NEW``) in a real headless Chromium."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuflame.cli.main import main
from gpuflame.formats import save
from gpuflame.model import Frame, Profile, memory_sample_types
from tests.browser.chrome_pipe import Chrome, find_chromium
from tests.browser.viewer_page import click_bar, open_viewer, search, settle, state
from tests.helpers.viewer_profiles import (
    ALLOC_KV,
    BASE_PEAK_TOTAL,
    CACHED,
    LINEAR_INIT,
    PEAK_TOTAL,
    WARMUP,
    XSS_IMG,
    XSS_SCRIPT,
    MiB,
    base_profile,
    viewer_profile,
)

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install chromium)")

HSL = re.compile(r"hsl\((\d+),(\d+)%,(\d+)%\)")


@pytest.fixture(scope="module")
def diff_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("diff")
    save(base_profile(), folder / "base.pb.gz")
    save(viewer_profile(), folder / "new.pb.gz")
    assert main(["view", str(folder / "base.pb.gz"), str(folder / "new.pb.gz"), "-o", str(folder / "d.html")]) == 0
    return folder / "d.html"


@pytest.fixture
def page(chrome: Chrome, diff_file: Path) -> Chrome:
    chrome.events.clear()
    s = open_viewer(chrome, diff_file)
    assert s["error"] is None, s["error"]
    return chrome


def hue(chrome: Chrome, name: str) -> tuple[int, int, int]:
    bar = chrome.wait_for(f"window.gpuflameBar({name!r})")
    match = HSL.fullmatch(bar["color"])
    assert match, bar["color"]
    return tuple(int(g) for g in match.groups())  # type: ignore[return-value]


def test_header_shows_both_totals_and_the_delta(page: Chrome) -> None:
    s = state(page)
    assert s["diff"] and s["total"] == PEAK_TOTAL and s["baseTotal"] == BASE_PEAK_TOTAL
    assert s["diffText"] == "base 92.0 MiB \u2192 new 100.0 MiB: +8.00 MiB (+8.7%)"
    assert page.evaluate("document.getElementById('diff-summary').hidden") is False
    assert not page.events_named("Runtime.exceptionThrown")


def test_grown_is_red_shrunk_is_green_unchanged_is_grey(page: Chrome) -> None:
    grew, shrank, same = hue(page, ALLOC_KV.name), hue(page, LINEAR_INIT.name), hue(page, CACHED.name)
    assert grew[0] == 0 and shrank[0] == 120
    assert same[1] == 0  # no saturation: neutral
    # intensity follows the relative change: +37.5% is stronger than a bar that grew by 8.7%
    assert hue(page, "total")[2] > grew[2]


def test_colour_blind_palette_is_orange_and_blue(page: Chrome) -> None:
    page.evaluate("document.getElementById('cb-palette').click()")
    settle(page)
    assert state(page)["colourBlind"]
    assert hue(page, ALLOC_KV.name)[0] == 28 and hue(page, LINEAR_INIT.name)[0] == 212


def test_tooltip_shows_base_new_and_delta(page: Chrome) -> None:
    bar = page.wait_for(f"window.gpuflameBar({ALLOC_KV.name!r})")
    assert bar["base"] == 40 * MiB and bar["total"] == 55 * MiB
    page.hover(bar["x"], bar["y"])
    text = page.wait_for("!document.getElementById('tooltip').hidden && document.getElementById('tooltip').textContent")
    assert "base  40.0 MiB" in text and "new   55.0 MiB" in text and "delta +15.0 MiB (+37.5%)" in text
    shrunk = page.wait_for(f"window.gpuflameBar({LINEAR_INIT.name!r})")
    page.hover(shrunk["x"], shrunk["y"])
    text = page.wait_for(
        "document.getElementById('tooltip').textContent.includes('-10.0 MiB') && "
        "document.getElementById('tooltip').textContent"
    )
    assert "delta -10.0 MiB (-33.3%)" in text


def test_vanished_stacks_are_listed(page: Chrome) -> None:
    s = state(page)
    assert s["vanished"] == [{"path": f"<module> \u203a main \u203a {WARMUP.name}", "base": 7 * MiB}]
    assert page.evaluate("document.getElementById('vanished-box').hidden") is False
    assert WARMUP.name not in page.evaluate("window.gpuflameBarLabels()")


def test_search_focus_and_type_switch_keep_working(page: Chrome) -> None:
    s = search(page, "LlamaMLP.__init__")
    assert s["matchTotal"] == 30 * MiB
    search(page, "")
    click_bar(page, "main")
    assert settle(page)["focus"] == "main"
    page.evaluate(
        "(() => { const s = document.getElementById('type-select'); s.value = '2'; "
        "s.dispatchEvent(new Event('change')); })()"
    )
    s = settle(page)
    assert s["type"] == "inuse_space" and s["focus"] == "main" and s["baseTotal"] == BASE_PEAK_TOTAL
    assert "base 92.0 MiB" in s["diffText"]


def test_hostile_names_stay_text_in_diff_mode(page: Chrome) -> None:
    s = search(page, XSS_IMG)
    assert s["matchTotal"] == 5 * MiB
    page.evaluate("document.getElementById('table-toggle').click()")
    cells = page.evaluate("[...document.querySelectorAll('#top-table tbody td:first-child')].map(td => td.textContent)")
    assert cells == [XSS_IMG]
    search(page, "")
    click_bar(page, XSS_SCRIPT)
    settle(page)
    bar = page.wait_for(f"window.gpuflameBar({XSS_SCRIPT!r})")
    assert bar["base"] == 0  # only NEW has it: full red
    assert page.evaluate("document.querySelectorAll('img, svg, iframe, object').length") == 0
    assert page.evaluate("document.scripts.length") == 2
    assert not page.events_named("Page.javascriptDialogOpening")
    assert not page.events_named("Runtime.exceptionThrown")


def script_run(script: str, step_bytes: int) -> Profile:
    """A run of *script*: its ``<module>`` calls ``step`` (defined in it), which holds *step_bytes*."""
    p = Profile(memory_sample_types(inuse=False, alloc=False))
    stack = [Frame("step", script, 4), Frame("<module>", script, 1)]
    p.add(stack, {"peak_space": step_bytes, "peak_objects": 1}, {"device": "cpu"})
    return p


def test_a_renamed_script_is_one_file_as_gpuflame_diff_compares_it(chrome: Chrome, tmp_path: Path) -> None:
    """train.py then train_v2.py: the page matched neither (all red, the base's whole graph 'vanished'),
    while gpuflame diff said '<module> ... -4.00 MiB'; now both compare <module> and step by name."""
    save(script_run("/w/train.py", 8 * MiB), tmp_path / "base.pb.gz")
    save(script_run("/w/train_v2.py", 4 * MiB), tmp_path / "new.pb.gz")
    files = [str(tmp_path / name) for name in ("base.pb.gz", "new.pb.gz")]
    assert main(["view", *files, "-o", str(tmp_path / "d.html")]) == 0
    chrome.events.clear()
    s = open_viewer(chrome, tmp_path / "d.html")
    assert s["error"] is None and s["vanished"] == []
    for name in ("<module>", "step"):
        bar = chrome.wait_for(f"window.gpuflameBar({name!r})")
        assert (bar["base"], bar["total"]) == (8 * MiB, 4 * MiB)
        assert HSL.fullmatch(bar["color"]).group(1) == "120"  # shrank: green
    status = chrome.evaluate("document.getElementById('status').textContent")
    assert "/w/train.py (base) and /w/train_v2.py (new): one script renamed" in status
    assert not chrome.events_named("Runtime.exceptionThrown")
