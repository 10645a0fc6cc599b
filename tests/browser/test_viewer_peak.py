"""The viewer says what the peak is: a moment that happened, or a bound (issue 10, item 3)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpuflame.cli.main import main
from gpuflame.formats import save
from gpuflame.model import Frame, Profile, memory_sample_types, merge
from gpuflame.model.peak import PROCESS, PeakUnit
from tests.browser.chrome_pipe import Chrome, find_chromium
from tests.helpers.paths import FIXTURES

pytestmark = pytest.mark.skipif(find_chromium() is None, reason="no chromium installed (apt-get install chromium)")

READY = "window.gpuflameState && (window.gpuflameState.ready || window.gpuflameState.error) && window.gpuflameState"


def window(pid: int, nbytes: int, start: int, end: int) -> Profile:
    p = Profile(sample_types=memory_sample_types(), default_type="peak_space")
    p.add([Frame(f"work{pid}", "job.py", 1)], [nbytes, 1, nbytes // 2, 1, nbytes, 1], {"device": "cpu", "pid": pid})
    p.time_nanos, p.duration_nanos = start, end - start
    p.peaks = [PeakUnit("cpu", PROCESS, start, end, pid=str(pid))]
    return p


def status(chrome: Chrome, html: Path) -> str:
    chrome.send("Page.navigate", {"url": html.as_uri()})
    state = chrome.wait_for(READY)
    assert state["error"] is None, state["error"]
    return chrome.evaluate("document.getElementById('status').textContent")


def test_the_status_line_says_an_overlapping_merge_is_an_upper_bound(chrome: Chrome, tmp_path: Path) -> None:
    now = time.time_ns()
    save(merge([window(1, 4 << 20, now, now + 100), window(2, 2 << 20, now + 10, now + 20)]), tmp_path / "m.pb.gz")
    assert main(["view", str(tmp_path / "m.pb.gz")]) == 0
    text = status(chrome, tmp_path / "m.html")
    assert "peak_space: 6.00 MiB" in text
    assert "peak_space: sum of each process's own peak on cpu" in text and "an upper bound" in text
    assert "live at the moment of the highest total" not in text


def test_a_single_process_keeps_the_single_moment_caption(chrome: Chrome, tmp_path: Path) -> None:
    save(window(7, 4 << 20, 1, 2), tmp_path / "one.pb.gz")
    assert main(["view", str(tmp_path / "one.pb.gz")]) == 0
    text = status(chrome, tmp_path / "one.html")
    assert "peak_space: live at the moment of the highest total of pid 7 on cpu" in text
    assert "the strip above counts allocations only" not in text  # nothing reserved beyond the allocations


def test_a_snapshots_page_says_which_peak_is_which(chrome: Chrome, tmp_path: Path) -> None:
    """The graph's peak counts what the allocator reserved, the strip's only allocations: two numbers on
    one page, each said for what it is."""
    snapshot = FIXTURES / "handwritten_small_trace.pickle"
    assert main(["view", str(snapshot), "-o", str(tmp_path / "snap.html")]) == 0
    text = status(chrome, tmp_path / "snap.html")
    assert "the graph counts what the allocator reserved (allocations + <allocator rounding> + " in text
    assert "the strip above counts allocations only" in text
    label = chrome.evaluate("document.getElementById('timeline').getAttribute('aria-label')")
    assert label.startswith("live allocations over time (not cached blocks or rounding)")


def test_the_fragmentation_profile_opens_on_its_type(chrome: Chrome, tmp_path: Path) -> None:
    """gpuflame simulate -o on a real snapshot: the page opens on `fragmentation`, `reserved` beside it
    (issue 21 item 6), and its total is the replay's fragmentation at the reserved peak."""
    from gpuflame.formats.load_save import load

    snap = Path(__file__).resolve().parents[1] / "data" / "torch-snapshot-silmont2000-mem_snapshot.pickle.gz"
    frag = tmp_path / "frag.pb.gz"
    assert main(["simulate", str(snap), "-o", str(frag), "--json"]) == 0
    assert main(["view", str(frag), "-o", str(tmp_path / "frag.html")]) == 0
    chrome.send("Page.navigate", {"url": (tmp_path / "frag.html").as_uri()})
    state = chrome.wait_for(READY)
    assert state["error"] is None, state["error"]
    assert state["type"] == "fragmentation" and state["types"] == ["fragmentation", "reserved"]
    assert state["total"] == load(frag).totals()["fragmentation"] > 0
