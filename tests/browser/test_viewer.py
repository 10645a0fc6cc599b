"""The HTML viewer in a real headless Chromium, opened from file:// as a user would.

Driven over the DevTools protocol (chrome_pipe.py). Skipped when no Chromium
is installed; make tools installs Debian's.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from pathlib import Path

import pytest

from gpuflame.cli.main import main
from gpuflame.formats import save
from tests.browser.chrome_pipe import Chrome, find_chromium
from tests.browser.viewer_page import choose, click_bar, open_viewer, search, settle, state
from tests.helpers.viewer_profiles import (
    CHAIN,
    DECODER_LAYER,
    INUSE_TOTAL,
    LINEAR_INIT,
    MLP_INIT,
    MLP_PEAK,
    NATIVE,
    PEAK_TOTAL,
    TRAMPOLINE_FRAME,
    XSS_IMG,
    XSS_SCRIPT,
    MiB,
    chain_profile,
    viewer_profile,
)

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def html_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("viewer")
    profile = folder / "run.pb.gz"
    save(viewer_profile(), profile)
    assert main(["view", str(profile)]) == 0
    return folder / "run.html"


@pytest.fixture
def page(chrome: Chrome, html_file: Path) -> Chrome:
    """The viewer freshly loaded from file://, with the event log cleared."""
    chrome.events.clear()
    state = open_viewer(chrome, html_file)
    assert state["error"] is None, state["error"]
    return chrome


def test_draws_the_graph_from_file_url_without_network(page: Chrome, html_file: Path) -> None:
    s = state(page)
    assert s["ready"] and s["drawnRects"] >= 10
    assert s["total"] == PEAK_TOTAL and s["type"] == "peak_space"
    assert len(s["types"]) == 6
    urls = [e["params"]["request"]["url"] for e in page.events_named("Network.requestWillBeSent")]
    assert urls == [html_file.as_uri()]
    assert not page.events_named("Runtime.exceptionThrown")
    assert page.evaluate("document.title") == "gpuflame: run.pb.gz"


def test_search_either_spelling_shows_the_share(page: Chrome) -> None:
    for query in ("LlamaMLP.__init__", "LlamaMLP > __init__", "llamamlp>__init__"):
        s = search(page, query)
        assert s["matchTotal"] == MLP_PEAK, query
        assert "30.0%" in s["matchText"]
        assert page.evaluate("document.getElementById('match-share').textContent") == s["matchText"]
    s = search(page, "")
    assert s["matchShare"] is None


def test_click_focuses_a_block_and_the_breadcrumb_goes_back(page: Chrome) -> None:
    click_bar(page, "GPUModelRunner > initialize_kv_cache")
    s = settle(page)
    assert s["focus"] == "GPUModelRunner > initialize_kv_cache"
    assert s["focusPath"] == ["<module>", "main", "GPUModelRunner > initialize_kv_cache"]
    crumbs = page.evaluate("[...document.querySelectorAll('#breadcrumb button')].map(b => b.textContent)")
    assert crumbs == ["total", "<module>", "main", "GPUModelRunner > initialize_kv_cache"]
    page.evaluate("document.querySelector('#breadcrumb button').click()")
    assert settle(page)["focus"] == "total"


def test_switching_sample_type_changes_the_total_and_keeps_focus(page: Chrome) -> None:
    click_bar(page, "main")
    assert settle(page)["focus"] == "main"
    choose(page, "type-select", "2")  # inuse_space
    s = settle(page)
    assert s["type"] == "inuse_space" and s["total"] == INUSE_TOTAL
    assert s["focus"] == "main"
    choose(page, "type-select", "1")  # peak_objects: counts, not bytes
    s = settle(page)
    assert s["total"] == 6
    assert "6 in" in page.evaluate("document.getElementById('status').textContent")


def test_label_selector_keeps_one_process(page: Chrome) -> None:
    options = page.evaluate("[...document.querySelectorAll('#label-select option')].map(o => [o.value, o.textContent])")
    value = next(v for v, text in options if text == "pid=2")
    choose(page, "label-select", value)
    assert settle(page)["total"] == 10 * 1024 * 1024


def test_top_table_sorts_and_links_to_the_graph(page: Chrome) -> None:
    page.evaluate("document.getElementById('table-toggle').click()")
    s = settle(page)
    assert s["tableSort"] == "self"
    assert s["tableRows"][0] == NATIVE.name  # the leaf under the KV cache: 55 MiB self
    page.evaluate("document.querySelector('#top-table th button[data-sort=total]').click()")
    s = settle(page)
    assert s["tableSort"] == "total" and s["tableRows"][:2] == ["<module>", "main"]
    page.evaluate("document.querySelector('#top-table th button[data-sort=self]').click()")
    row = page.evaluate(
        "(() => { const r = document.querySelector('#top-table tbody tr'); r.click(); "
        "return r.firstChild.textContent; })()"
    )
    s = settle(page)
    assert row == NATIVE.name
    assert s["focus"] == row and s["matchShare"] == pytest.approx(0.55)


def test_hiding_trampolines_keeps_the_bytes(page: Chrome) -> None:
    before = state(page)
    page.evaluate("document.getElementById('hide-trampolines').click()")
    after = settle(page)
    assert after["hideTrampolines"] and after["nodes"] < before["nodes"]
    assert after["total"] == before["total"]


def test_icicle_toggle_redraws(page: Chrome) -> None:
    page.evaluate("document.getElementById('icicle').click()")
    s = settle(page)
    assert s["icicle"] and s["drawnRects"] >= 10


def test_hostile_names_are_text_and_nothing_runs(page: Chrome) -> None:
    s = search(page, XSS_IMG)
    assert s["matchTotal"] == 5 * 1024 * 1024
    page.evaluate("document.getElementById('table-toggle').click()")
    cells = page.evaluate("[...document.querySelectorAll('#top-table tbody td:first-child')].map(td => td.textContent)")
    assert cells == [XSS_IMG]
    search(page, "alert(2)")
    cells = page.evaluate("[...document.querySelectorAll('#top-table tbody td:first-child')].map(td => td.textContent)")
    assert cells == [XSS_SCRIPT]
    labels = page.evaluate("[...document.querySelectorAll('#label-select option')].map(o => o.textContent)")
    assert "device=<svg onload=alert(3)>" in labels
    click_bar(page, XSS_SCRIPT)
    settle(page)
    assert page.evaluate("document.querySelectorAll('img, svg, iframe, object').length") == 0
    assert page.evaluate("document.scripts.length") == 2
    assert not page.events_named("Page.javascriptDialogOpening")
    assert not page.events_named("Runtime.exceptionThrown")


def test_sandwich_of_a_function_called_from_two_places(page: Chrome) -> None:
    centre = page.wait_for(f"window.gpuflameBarCenter({json.dumps(MLP_INIT.name)})")
    page.click(centre["x"], centre["y"], modifiers=8)  # shift-click
    s = settle(page)
    assert s["sandwich"] == MLP_INIT.name and s["sandwichTotal"] == MLP_PEAK
    assert s["sandwichCallers"] == [
        {"name": DECODER_LAYER.name, "total": 20 * MiB},
        {"name": TRAMPOLINE_FRAME.name, "total": 10 * MiB},
    ]
    assert s["sandwichCallees"] == [{"name": LINEAR_INIT.name, "total": 20 * MiB}]
    me, caller, callee = (
        page.evaluate(f"window.gpuflameBar({json.dumps(n)})")
        for n in (MLP_INIT.name, DECODER_LAYER.name, LINEAR_INIT.name)
    )
    assert caller["y"] > me["y"] > callee["y"]  # callers below, callees above
    assert me["width"] > 1000  # the function spans the whole width
    page.evaluate("document.getElementById('sandwich-back').click()")
    s = settle(page)
    assert s["sandwich"] is None and s["focus"] == "total"


def test_sandwich_from_the_top_table(page: Chrome) -> None:
    page.evaluate("document.getElementById('table-toggle').click()")
    settle(page)
    page.evaluate(
        "[...document.querySelectorAll('#top-table tbody tr')]"
        f".find(r => r.firstChild.textContent === {json.dumps(LINEAR_INIT.name)})"
        ".querySelector('button.sandwich').click()"
    )
    s = settle(page)
    assert s["sandwich"] == LINEAR_INIT.name and s["sandwichTotal"] == 20 * MiB
    assert s["sandwichCallers"] == [{"name": MLP_INIT.name, "total": 20 * MiB}] and s["sandwichCallees"] == []
    assert s["focus"] == "total"  # the row's button does not also select the row
    page.evaluate("document.getElementById('reset').click()")
    assert settle(page)["sandwich"] is None


@pytest.fixture(scope="module")
def chain_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("chain")
    save(chain_profile(), folder / "chain.pb.gz")
    assert main(["view", str(folder / "chain.pb.gz")]) == 0
    return folder / "chain.html"


def test_groups_collapse_a_single_child_run_and_expand_again(chrome: Chrome, chain_file: Path) -> None:
    open_viewer(chrome, chain_file)
    names = [f.name for f in CHAIN]
    group = f"{names[0]} \u22ef (3) \u22ef {names[-1]}"
    labels = set(chrome.evaluate("window.gpuflameBarLabels()"))
    assert set(names) <= labels and state(chrome)["groupBars"] == 0  # groups start expanded
    chrome.evaluate("document.getElementById('collapse-groups').click()")
    s = settle(chrome)
    labels = chrome.evaluate("window.gpuflameBarLabels()")
    assert s["groupsCollapsed"] and s["groupBars"] == 1
    assert group in labels and not set(names) & set(labels)
    assert {"leaf_a", "leaf_b", "other", "<module>"} <= set(labels)
    bar = chrome.evaluate(f"window.gpuflameBar({json.dumps(group)})")
    assert bar["group"] == 5 and bar["total"] == 15 * MiB
    chrome.click(bar["x"], bar["y"])  # a click expands that group
    s = settle(chrome)
    assert s["groupBars"] == 0 and set(names) <= set(chrome.evaluate("window.gpuflameBarLabels()"))
    chrome.evaluate("document.getElementById('collapse-groups').click()")
    assert settle(chrome)["groupBars"] == 1
    chrome.evaluate("document.getElementById('expand-groups').click()")
    s = settle(chrome)
    assert not s["groupsCollapsed"] and s["groupBars"] == 0
    assert set(names) <= set(chrome.evaluate("window.gpuflameBarLabels()"))


def test_screenshot_is_a_non_blank_png(page: Chrome, tmp_path: Path) -> None:
    png = page.screenshot()
    (tmp_path / "viewer.png").write_bytes(png)
    width, height, pixels = decode_png_rows(png)
    assert width >= 800 and height >= 600
    assert len(set(pixels)) > 50  # many distinct bytes: bars, text and background, not one colour


def decode_png_rows(png: bytes) -> tuple[int, int, bytes]:
    """Width, height and the raw (filtered) scanlines of a PNG: enough to tell it is not blank."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind, body = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return width, height, zlib.decompress(idat)


def framework_profile():
    """user -> torch -> user -> torch -> torch (leaf): the stack --prune-framework is for."""
    from gpuflame.model import Frame, Profile, memory_sample_types

    torch_dir = "/venv/lib/python3.11/site-packages/torch"
    p = Profile(sample_types=memory_sample_types()[:1])
    p.add(
        [
            Frame("kaiming_uniform_", f"{torch_dir}/nn/init.py", 450),
            Frame("Linear > __init__", f"{torch_dir}/nn/modules/linear.py", 109),
            Frame("LlamaMLP > __init__", "/app/model.py", 20),
            Frame("Module > _call_impl", f"{torch_dir}/nn/modules/module.py", 1790),
            Frame("main", "/app/run.py", 5),
            Frame("<module>", "/app/run.py", 9),
        ],
        [8 * MiB],
    )
    return p


def test_hiding_framework_frames_keeps_the_entry_and_the_bytes(chrome: Chrome, tmp_path: Path) -> None:
    save(framework_profile(), tmp_path / "fw.pb.gz")
    assert main(["view", str(tmp_path / "fw.pb.gz")]) == 0
    before = open_viewer(chrome, tmp_path / "fw.html")
    assert {"kaiming_uniform_", "Module > _call_impl"} <= set(chrome.evaluate("window.gpuflameBarLabels()"))
    chrome.evaluate("document.getElementById('hide-framework').click()")
    after = settle(chrome)
    labels = set(chrome.evaluate("window.gpuflameBarLabels()"))
    assert after["hideFramework"] and after["total"] == before["total"]
    # the torch function the user's code called stays, with the bytes of what it called
    assert {"<module>", "main", "LlamaMLP > __init__", "Linear > __init__"} <= labels
    assert not {"kaiming_uniform_", "Module > _call_impl"} & labels
    assert chrome.evaluate("window.gpuflameBar('Linear > __init__')")["total"] == 8 * MiB


# -- memory over time ---------------------------------------------------------------


def test_a_snapshot_profile_shows_memory_over_time_with_its_peak(chrome: Chrome, tmp_path: Path) -> None:
    make_snapshots = pytest.importorskip("tests.fixtures.make_snapshots")  # needs torch (a test dependency)
    from gpuflame.formats import load, torch_snapshot

    profile = torch_snapshot.from_snapshot(make_snapshots.build_all()["handwritten_small_trace"])
    save(profile, tmp_path / "snap.pb.gz")
    assert main(["view", str(tmp_path / "snap.pb.gz")]) == 0
    points = load(tmp_path / "snap.pb.gz").timeline.series[(("device", "cuda:0"),)]
    peak_time, peak_bytes = max(points, key=lambda p: p[1])
    chrome.events.clear()
    s = open_viewer(chrome, tmp_path / "snap.html")
    assert s["error"] is None and s["timeline"] is not None
    tl = s["timeline"]
    assert tl["visible"] and tl["peakBytes"] == peak_bytes
    assert tl["peakTime"] == peak_time - points[0][0]
    assert [p[1] for p in tl["points"]] == [b for _, b in points]
    box = chrome.evaluate(
        "(() => { const r = document.getElementById('timeline').getBoundingClientRect(); "
        "return {top: r.top, height: r.height, graph: document.getElementById('graph')"
        ".getBoundingClientRect().top}; })()"
    )
    assert box["height"] > 40 and box["top"] < box["graph"]  # a strip above the flame graph
    # the peak dot is painted where the state says (red, not the line's blue)
    pixel = chrome.evaluate(
        "(() => { const c = document.getElementById('timeline'), r = window.devicePixelRatio || 1; "
        f"const x = Math.round({tl['peakX']} * r), y = Math.round({tl['peakY']} * r); "
        "const d = c.getContext('2d').getImageData(x, y, 1, 1).data; "
        "return [d[0], d[1], d[2]]; })()"
    )
    assert pixel[0] > 150 and pixel[2] < 100, pixel
    assert not chrome.events_named("Runtime.exceptionThrown")


def test_a_profile_without_a_timeline_shows_no_strip(page: Chrome) -> None:
    assert state(page)["timeline"] is None
    assert page.evaluate("document.getElementById('timeline-box').hidden") is True


def test_the_demo_run_renders_offline_with_the_guides_names(chrome: Chrome, tmp_path: Path) -> None:
    """Issue 4's check: `gpuflame run` of the demo, `gpuflame view`, headless Chromium, the guide's names shown."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["GPUFLAME_STORE"] = str(tmp_path / "store")
    demo = [str(root / "examples" / "demo.py"), "--rounds", "1", "--new-tokens", "2"]
    run = subprocess.run(
        [sys.executable, "-m", "gpuflame", "run", "-o", str(tmp_path / "demo.pb.gz"), *demo],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert main(["view", str(tmp_path / "demo.pb.gz")]) == 0
    html = tmp_path / "demo.html"
    chrome.events.clear()
    s = open_viewer(chrome, html)
    assert s["error"] is None and s["drawnRects"] > 10
    labels = set(chrome.evaluate("window.gpuflameBarLabels()"))
    assert {"LlamaMLP > __init__", "Linear > __init__", "ModelRunner > load_model"} <= labels
    urls = [e["params"]["request"]["url"] for e in chrome.events_named("Network.requestWillBeSent")]
    assert urls == [html.as_uri()]
    png = chrome.screenshot()
    (tmp_path / "demo.png").write_bytes(png)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def adamw_profile():
    """AdamW's state, as the torch backend records it: user -> optimizer wrappers -> Adam's own methods."""
    from gpuflame.model import Frame, Profile, memory_sample_types

    optim = "/venv/lib/python3.11/site-packages/torch/optim"
    p = Profile(sample_types=memory_sample_types()[:1])
    p.add(
        [
            Frame("Adam > _init_group", f"{optim}/adam.py", 178, start_line=139),
            Frame("Adam > step", f"{optim}/adam.py", 238, start_line=213),
            Frame("_use_grad_for_differentiable > _use_grad", f"{optim}/optimizer.py", 80, start_line=74),
            Frame("Optimizer > profile_hook_step > wrapper", f"{optim}/optimizer.py", 530, start_line=510),
            Frame("train", "/app/train.py", 21, start_line=13),
            Frame("<module>", "/app/train.py", 25, start_line=1),
        ],
        [2 * MiB],
    )
    p.add(
        [Frame("train", "/app/train.py", 15, start_line=13), Frame("<module>", "/app/train.py", 25, start_line=1)],
        [2 * MiB],
    )
    return p


def test_hidden_framework_still_names_adam_and_search_finds_it(chrome: Chrome, tmp_path: Path) -> None:
    save(adamw_profile(), tmp_path / "adamw.pb.gz")
    assert main(["view", str(tmp_path / "adamw.pb.gz")]) == 0
    open_viewer(chrome, tmp_path / "adamw.html")
    chrome.evaluate("document.getElementById('hide-framework').click()")
    settle(chrome)
    labels = set(chrome.evaluate("window.gpuflameBarLabels()"))
    assert {"Optimizer > profile_hook_step > wrapper", "Adam > _init_group"} <= labels  # entry and what it is
    assert not {"_use_grad_for_differentiable > _use_grad", "Adam > step"} & labels
    s = search(chrome, "Adam")
    assert s["matchTotal"] == 2 * MiB and "50.0%" in s["matchText"]


def test_tooltip_says_where_the_function_is_defined(chrome: Chrome, tmp_path: Path) -> None:
    save(adamw_profile(), tmp_path / "adamw.pb.gz")
    assert main(["view", str(tmp_path / "adamw.pb.gz")]) == 0
    open_viewer(chrome, tmp_path / "adamw.html")
    bar = chrome.wait_for("window.gpuflameBar('train')")
    chrome.hover(bar["x"], bar["y"])
    tip = "document.getElementById('tooltip')"
    text = chrome.wait_for(f"!{tip}.hidden && {tip}.textContent")
    assert "defined at /app/train.py:13" in text
    assert "train.py:15" not in text and "train.py:21" not in text


def test_one_bar_is_one_bar(chrome: Chrome, tmp_path: Path) -> None:
    """The status line counts in words: "1 bar, 1 function", not "1 bars"."""
    from gpuflame.model import Frame, Profile

    p = Profile([("peak_space", "bytes")])
    p.add([Frame("only", "/a.py", 1)], [1024])
    save(p, tmp_path / "one.pb.gz")
    assert main(["view", str(tmp_path / "one.pb.gz")]) == 0
    assert open_viewer(chrome, tmp_path / "one.html")["error"] is None
    status = chrome.evaluate("document.getElementById('status').textContent")
    assert "in 1 bar, 1 function" in status, status


INFLATE_IN_PIECES = """(async () => {
  const head = new TextEncoder().encode('{"a":1}');  // 4 + 7 bytes, padded to 16
  const body = new Uint8Array(16 + 24);
  new DataView(body.buffer).setUint32(0, head.length, true);
  body.set(head, 4);
  for (let i = 16; i < body.length; i++) body[i] = i;
  const out = [];
  for (const size of [1, 2, 3, 5, 11, 16, 17, 40]) {
    let at = 0;
    const stream = new ReadableStream({ pull(c) {
      if (at >= body.length) { c.close(); return; }
      c.enqueue(body.slice(at, at + size)); at += size;
    } });
    const got = await window.gpuflameInflate(stream, body.length);
    out.push([size, Array.from(got.json), Array.from(new Uint8Array(got.arrays))]);
  }
  let short = null;
  try { await window.gpuflameInflate(new Blob([body.slice(0, 20)]).stream(), body.length); }
  catch (e) { short = e.message; }
  return { out, body: Array.from(body), short };
})()"""


def test_the_payload_inflates_into_head_and_arrays_whatever_its_pieces(page: Chrome) -> None:
    """viewer.js inflate: the stream's pieces may cut anywhere (inside the length, the head, the arrays)."""
    got = page.evaluate(INFLATE_IN_PIECES)
    body = got["body"]
    for size, json_bytes, arrays in got["out"]:
        assert (json_bytes, arrays) == (body[4:11], body[16:]), size  # the JSON without its length and padding
    assert got["short"] == "the page's data is cut short"
