"""The memory-over-time strip in a real headless Chromium: spikes, processes on their own times, the label selector.

The strip is read back as the user sees it: pixel columns of its canvas
(where the blue line is drawn) and the line the page computed, checked
against the model's own sum (``Timeline.total``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuflame.cli.main import main
from gpuflame.formats import save
from gpuflame.model import Frame, Profile, memory_sample_types
from gpuflame.model.timeline import Timeline
from tests.browser.chrome_pipe import Chrome, find_chromium
from tests.browser.viewer_page import choose, open_viewer, state

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install chromium)")

MB = 1_000_000
MS = 1_000_000  # nanoseconds
T0 = 1_767_225_600_000_000_000
SPIKES = [100 * MS + 200 * MS * k for k in range(5)]  # five spikes of 3 us, 200 ms apart
PID1 = (("device", "cpu"), ("pid", "1"))
PID2 = (("device", "cuda:0"), ("pid", "2"))


def spiky_profile() -> Profile:
    """pid 1: 1 MB held for 1 s with five 4 MB spikes; pid 2: 2 MB from 720 ms to 860 ms only.

    pid 3 has samples but no timeline; ``rank`` is a label no series carries.
    """
    p = Profile(sample_types=memory_sample_types()[:1])
    p.add([Frame("hold", "/app/a.py", 3)], [MB], {"device": "cpu", "pid": "1"})
    p.add([Frame("cache", "/app/b.py", 5)], [2 * MB], {"device": "cuda:0", "pid": "2"})
    p.add([Frame("other", "/app/c.py", 7)], [MB], {"device": "cpu", "pid": "3", "rank": "0"})
    first = [(T0, MB)]
    for t in SPIKES:
        first += [(T0 + t, 5 * MB), (T0 + t + 3_000, MB)]
    first.append((T0 + 1000 * MS, MB))
    p.timeline = Timeline({PID1: first, PID2: [(T0 + 720 * MS, 2 * MB), (T0 + 860 * MS, 2 * MB)]})
    return p


@pytest.fixture(scope="module")
def strip_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("strip")
    save(spiky_profile(), folder / "run.pb.gz")
    assert main(["view", str(folder / "run.pb.gz")]) == 0
    return folder / "run.html"


@pytest.fixture
def strip(chrome: Chrome, strip_file: Path) -> Chrome:
    chrome.events.clear()
    s = open_viewer(chrome, strip_file)
    assert s["error"] is None and s["timeline"]["visible"]
    return chrome


def relative(points: list[tuple[int, int]]) -> list[list[int]]:
    return [[t - T0, b] for t, b in points]


def at(chrome: Chrome, t: int, b: int) -> dict[str, float]:
    """Where the strip draws (t ns after the start, b bytes), in the canvas's CSS pixels."""
    return chrome.evaluate(f"window.gpuflameTimelineAt({t}, {b})")


def blue_rows(chrome: Chrome, x: float) -> list[float]:
    """The CSS y of every pixel of the strip's blue line in the pixel column at CSS x."""
    return chrome.evaluate(
        "(() => { const c = document.getElementById('timeline'), r = window.devicePixelRatio || 1; "
        f"const x = Math.round({x} * r), d = c.getContext('2d').getImageData(x, 0, 1, c.height).data, out = []; "
        "for (let y = 0; y < c.height; y++) { const [R, G, B, A] = d.slice(4 * y, 4 * y + 4); "
        "if (A > 60 && B > R + 60 && B > G + 30) out.push(y / r); } return out; })()"
    )


def pick(chrome: Chrome, text: str) -> dict:
    """Choose *text* in the label selector; the state once the strip has followed."""
    options = chrome.evaluate(
        "[...document.querySelectorAll('#label-select option')].map(o => [o.value, o.textContent])"
    )
    value = next(v for v, label in options if label == text)
    choose(chrome, "label-select", value)
    return chrome.wait_for(f"window.gpuflameState.timeline.title.includes({json.dumps(text)}) && window.gpuflameState")


def test_short_spikes_are_drawn_as_spikes_over_what_is_held(strip: Chrome) -> None:
    tl = state(strip)["timeline"]
    assert tl["points"] == relative(spiky_profile().timeline.total())  # the model's sum, point for point
    assert tl["peakBytes"] == 5 * MB and tl["peakTime"] == SPIKES[0]
    for t in SPIKES[1:]:  # the first spike carries the red peak dot
        column = blue_rows(strip, at(strip, t, 0)["x"])
        assert min(column) == pytest.approx(at(strip, t, 5 * MB)["y"], abs=2)  # up to 5 MB
        assert max(column) == pytest.approx(at(strip, t, MB)["y"], abs=2)  # and back to 1 MB
    between = blue_rows(strip, at(strip, 200 * MS, 0)["x"])
    assert between and min(between) == pytest.approx(at(strip, 0, MB)["y"], abs=2)  # not a flat 5 MB line


def test_each_process_counts_only_while_it_ran(strip: Chrome) -> None:
    """pid 2 ran from 720 ms to 860 ms: 3 MB then, 1 MB before and after (never counted from time 0)."""
    for t, held in [(200 * MS, MB), (790 * MS, 3 * MB), (950 * MS, MB)]:
        column = blue_rows(strip, at(strip, t, 0)["x"])
        assert min(column) == pytest.approx(at(strip, t, held)["y"], abs=2), t


def test_the_strip_follows_the_label_selector(strip: Chrome) -> None:
    full = spiky_profile().timeline
    s = pick(strip, "pid=2")
    tl = s["timeline"]
    assert tl["points"] == relative(full.total((("pid", "2"),))) and tl["series"] == 1
    assert tl["peakBytes"] == 2 * MB and tl["peakTime"] == 720 * MS
    assert tl["span"] == 1000 * MS  # the run's time axis: pid 2 sits where it ran
    assert blue_rows(strip, at(strip, 200 * MS, 0)["x"]) == []  # not yet started: nothing drawn
    column = blue_rows(strip, at(strip, 790 * MS, 0)["x"])
    assert min(column) == pytest.approx(at(strip, 790 * MS, 2 * MB)["y"], abs=2)
    s = pick(strip, "device=cpu")
    assert s["timeline"]["points"] == relative(full.total((("device", "cpu"),)))
    assert s["timeline"]["peakBytes"] == 5 * MB
    s = pick(strip, "pid=3")  # a process with samples but no timeline: said, not a blank strip
    assert s["timeline"]["points"] == [] and s["timeline"]["visible"]
    assert "pid=3" in s["timeline"]["title"]
    s = pick(strip, "rank=0")  # no series carries rank: all of them, and the strip says why
    assert s["timeline"]["points"] == relative(full.total()) and s["timeline"]["unsplit"] == "rank"
    assert "not split by rank" in s["timeline"]["title"]
    s = pick(strip, "all")
    assert s["timeline"]["points"] == relative(full.total()) and s["timeline"]["series"] == 2
    assert not strip.events_named("Runtime.exceptionThrown")


def test_devices_sampled_at_one_time_are_one_moment_on_the_strip(chrome: Chrome, tmp_path: Path) -> None:
    """JAX writes each device's total at its sample's time: cpu:0 fell 32 -> 0 MB as cpu:1 rose 4 -> 20 MB.

    The strip summed them series by series and drew a 52 MB peak that never was (36 MB was).
    """
    p = Profile(sample_types=memory_sample_types()[:1])
    p.add([Frame("put", "/app/a.py", 3)], [32 * MB], {"device": "cpu:0", "pid": "1"})
    p.add([Frame("put", "/app/a.py", 3)], [20 * MB], {"device": "cpu:1", "pid": "1"})
    cpu0, cpu1 = (("device", "cpu:0"), ("pid", "1")), (("device", "cpu:1"), ("pid", "1"))
    p.timeline = Timeline({cpu1: [(T0, 4 * MB), (T0 + 50 * MS, 20 * MB)], cpu0: [(T0, 32 * MB), (T0 + 50 * MS, 0)]})
    save(p, tmp_path / "sampled.pb.gz")
    assert main(["view", str(tmp_path / "sampled.pb.gz")]) == 0
    tl = open_viewer(chrome, tmp_path / "sampled.html")["timeline"]
    assert tl["points"] == relative(p.timeline.total()) == [[0, 36 * MB], [50 * MS, 20 * MB]]
    assert tl["peakBytes"] == 36 * MB and tl["peakTime"] == 0
