"""Click and drag on the memory-over-time strip, in a real headless Chromium.

The profile is recorded by the real torch recorder (dispatch mode) on a
workload with three phases apart in time; the recorder's clock is driven
by the test (tests/fake_clock.py), so the phases are exactly 300 ms apart
however loaded the machine is. What the page shows for an instant or a
window is checked against the model's own verbs
(``moment.at``/``moment.between``) at the very times the page chose.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuflame.cli.main import main
from gpuflame.formats import load, save
from gpuflame.model import Frame, Profile, memory_sample_types, merge, moment
from gpuflame.model.history import EventLog, History
from gpuflame.model.timeline import Timeline
from tests.browser.chrome_pipe import Chrome, find_chromium
from tests.browser.viewer_page import open_viewer, settle, state
from tests.helpers.fake_clock import driven_clock

torch = pytest.importorskip("torch")
CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install chromium)")

MS = 1_000_000


def weights() -> list:
    return [torch.zeros(256, 256) for _ in range(2)]  # 512 KiB


def kv_cache() -> list:
    return [torch.zeros(64, 512) for _ in range(2)]  # 256 KiB


def step() -> int:
    scratch = torch.ones(1024, 128)  # 512 KiB, freed at once (and a 4-byte sum)
    return int(scratch.sum())


@pytest.fixture(scope="module")
def moment_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gpuflame.capture.recorders.dispatch import TorchTensorRecorder

    folder = tmp_path_factory.mktemp("moment")
    with driven_clock() as clock:
        rec = TorchTensorRecorder()
        rec.start()
        held = weights()
        clock.advance(0.3)
        held += kv_cache()
        clock.advance(0.3)
        step()
        clock.advance(0.3)
        rec.stop()
    save(rec.snapshot(), folder / "run.pb.gz")
    assert main(["view", str(folder / "run.pb.gz")]) == 0
    assert len(held) == 4
    kv, step_, end = phase_times(load(folder / "run.pb.gz"))
    assert 300 * MS <= step_ - kv < 301 * MS and 300 * MS <= end - step_ < 301 * MS  # the clock the test drove
    return folder / "run.pb.gz"


@pytest.fixture
def page(chrome: Chrome, moment_file: Path) -> Chrome:
    chrome.events.clear()
    s = open_viewer(chrome, moment_file.with_suffix("").with_suffix(".html"))
    assert s["error"] is None and s["timeline"]["visible"]
    return chrome


def strip_point(chrome: Chrome, t_ns: int) -> tuple[float, float]:
    """Client coordinates of the strip at *t_ns* after its start, halfway up."""
    local = chrome.evaluate(f"window.gpuflameTimelineAt({t_ns}, 0)")
    rect = chrome.evaluate(
        "(() => { const r = document.getElementById('timeline').getBoundingClientRect(); "
        "return {left: r.left, top: r.top, height: r.height}; })()"
    )
    return rect["left"] + local["x"], rect["top"] + rect["height"] / 2


def drag(chrome: Chrome, a: tuple[float, float], b: tuple[float, float]) -> None:
    for kind, (x, y), buttons in (
        ("mouseMoved", a, 0),
        ("mousePressed", a, 1),
        ("mouseMoved", b, 1),
        ("mouseReleased", b, 0),
    ):
        chrome.send(
            "Input.dispatchMouseEvent",
            {"type": kind, "x": x, "y": y, "button": "left", "buttons": buttons, "clickCount": 1},
        )


def phase_times(profile: Profile) -> tuple[int, int, int]:
    """(when the KV cache was all there, when the step began, the strip's end), ns after the strip's 0.

    Read from the recorded profile itself (the driven clock puts 300 ms between phases, and a microsecond
    on each reading within one).
    """
    [points] = profile.timeline.series.values()
    zero = points[0][0]
    kv = next(t for t, b in points if b >= 768 * 1024)
    step = next(t for t, b in points if b > 768 * 1024)
    return kv - zero, step - zero, points[-1][0] - zero


def totals_by_leaf(p: Profile) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in p.samples:
        name = p.frames[s.stack[0]].name
        out[name] = out.get(name, 0) + s.values[0]
    return out


def test_a_click_shows_what_was_live_then_and_back_goes_to_the_peak(page: Chrome, moment_file: Path) -> None:
    profile = load(moment_file)
    peak_total = state(page)["total"]
    kv, step_, _ = phase_times(profile)
    at = (kv + step_) // 2  # after the KV cache, before the step (at least 300 ms apart)
    x, y = strip_point(page, at)
    page.click(x, y)
    s = settle(page)
    sel = s["moment"]
    assert sel["kind"] == "at" and sel["error"] is None and sel["visible"]
    assert abs(sel["t1"] - at) < (step_ - kv) // 4  # a pixel of the strip is far less than the gap
    expected = moment.at(profile, sel["t1"] / 1e9)
    assert s["type"] == "inuse_space" and s["total"] == expected.totals()["inuse_space"] == 768 * 1024
    assert sel["label"] == f"what was live at {sel['t1'] / 1e9:.3f} s"
    assert page.evaluate("document.getElementById('moment-label').textContent") == sel["label"]
    names = {b.split(" ")[0] for b in page.evaluate("window.gpuflameBarLabels()")}
    assert {"weights", "kv_cache"} <= names and "step" not in names
    page.click(
        *page.evaluate(
            "(() => { const r = document.getElementById('moment-back')"
            ".getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
    )
    s = settle(page)
    assert s["moment"] is None and s["type"] == "peak_space" and s["total"] == peak_total
    assert not page.events_named("Runtime.exceptionThrown")


def test_a_drag_shows_what_was_allocated_within_the_window(page: Chrome, moment_file: Path) -> None:
    profile = load(moment_file)
    kv, step_, end = phase_times(profile)
    drag(page, strip_point(page, (kv + step_) // 2), strip_point(page, end))
    s = settle(page)
    sel = s["moment"]
    assert sel["kind"] == "between" and sel["t1"] < sel["t2"]
    expected = moment.between(profile, sel["t1"] / 1e9, sel["t2"] / 1e9)
    assert s["type"] == "alloc_space" and s["total"] == expected.totals()["alloc_space"] == 512 * 1024 + 4
    assert totals_by_leaf(expected) == {"step": 512 * 1024 + 4}  # the scratch and the 4-byte sum
    assert sel["label"] == f"what was allocated from {sel['t1'] / 1e9:.3f} s to {sel['t2'] / 1e9:.3f} s"
    assert not page.events_named("Runtime.exceptionThrown")


def synthetic(history: bool, limit: int = 1000, pid: str = "1", shift: int = 0) -> Profile:
    """1 s of a process (*shift* ns after the strip's 0): 10 allocations of 100 B; *limit* 8 folds the oldest."""
    t0 = 1_767_225_600_000_000_000 + shift
    p = Profile(memory_sample_types())
    p.add([Frame("hold", "/app/a.py", 3)], [1000, 10, 1000, 10, 1000, 10], {"device": "cpu", "pid": pid})
    points = [(t0 + k * 100 * MS, 100 * k) for k in range(11)]
    p.timeline = Timeline({(("device", "cpu"), ("pid", pid)): points})
    if history:
        log = EventLog(t0, limit)
        for t, _ in points[1:]:
            log.add(t, 0, 100)
        track = log.track(t0 + 1000 * MS, (("pid", pid),))
        p.history = History([Frame("hold", "/app/a.py", 3)], [((0,), (("device", "cpu"),))], [track])
    return p


@pytest.mark.parametrize(
    ("history", "says"),
    [
        (False, "this profile has no event history"),
        (True, "not available: the history before 0.400 s was folded to keep its memory bounded"),
    ],
)
def test_a_moment_that_cannot_be_shown_says_why(chrome: Chrome, tmp_path: Path, history: bool, says: str) -> None:
    save(synthetic(history, limit=8), tmp_path / "s.pb.gz")
    assert main(["view", str(tmp_path / "s.pb.gz")]) == 0
    chrome.events.clear()
    s = open_viewer(chrome, tmp_path / "s.html")
    before = s["total"]
    chrome.click(*strip_point(chrome, 250 * MS))
    s = settle(chrome)
    assert says in s["moment"]["label"] and s["moment"]["visible"]
    assert s["total"] == before and s["type"] == "peak_space"  # the graph stays as it was
    if history:  # after the fold: exact
        chrome.click(*strip_point(chrome, 750 * MS))
        s = settle(chrome)
        assert s["moment"]["error"] is None and s["total"] == 700
    assert not chrome.events_named("Runtime.exceptionThrown")


def test_a_merged_run_sums_its_processes_at_the_clicked_instant(chrome: Chrome, tmp_path: Path) -> None:
    """Two processes on the common clock: pid 2 starts 400 ms in; a click counts what each held then."""
    a, b = synthetic(True), synthetic(True, pid="2", shift=400 * MS)
    merged = merge([a, b])
    save(merged, tmp_path / "m.pb.gz")
    assert main(["view", str(tmp_path / "m.pb.gz")]) == 0
    chrome.events.clear()
    open_viewer(chrome, tmp_path / "m.html")
    chrome.click(*strip_point(chrome, 650 * MS))
    s = settle(chrome)
    t1 = s["moment"]["t1"]
    expected = moment.at(load(tmp_path / "m.pb.gz"), t1 / 1e9)
    assert s["moment"]["error"] is None and s["total"] == expected.totals()["inuse_space"]
    assert {smp.label("pid") for smp in expected.samples} == {"1", "2"}  # both held memory then
    assert s["total"] == 600 + 200 and not chrome.events_named("Runtime.exceptionThrown")
