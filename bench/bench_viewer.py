"""Time the viewer's first paint and search in headless Chromium, side by side with speedscope.

For profiles of 1k, 10k and 100k distinct functions, in one run and one
browser, interleaved round by round:

* gpuflame: the ``gpuflame view`` HTML opened from ``file://``; first paint
  is the page's own hook (``gpuflameState.timings.firstPaint``, taken at the
  end of the first flame-graph draw, ``performance.now()`` since navigation
  start), and the same canvas probe as speedscope's as a cross-check;
* speedscope (npm package ``speedscope``, ``bench/viewer``) on the same
  profile written by gpuflame's speedscope exporter, served with its
  ``dist/release`` from a loopback ``http.server`` (its ``#profileURL=``
  needs http), ``view=left-heavy`` (the merged flame graph); first paint is
  the canvas probe: a script added before any page script that records
  every 2D canvas context the page makes and, on each animation frame after
  a draw call, reads them back; the first frame in which one holds a pixel
  is the paint (speedscope draws its rectangles with WebGL and their labels
  on a 2D overlay in the same frame). Late by at most one frame.

Search: on the 100k profile, set the box's value and dispatch ``input``;
the time until the next animation frame has run the redraw, per query.

    python bench/bench_viewer.py                 # needs npm ci --prefix bench/viewer
    python bench/bench_viewer.py --frames 1000 --repeat 1
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "browser"))
sys.path.insert(0, str(ROOT / "tests"))

from chrome_pipe import CdpError, Chrome, find_chromium  # noqa: E402

from gpuflame.formats import dumps, save  # noqa: E402
from large_profile import tree_profile  # noqa: E402

OUT = ROOT / "bench" / "out" / "viewer"
SPEEDSCOPE = ROOT / "bench" / "viewer" / "node_modules" / "speedscope" / "dist" / "release"
SIZES = (1_000, 10_000, 100_000)
# typed as a user would, one keystroke a query; the first pays for normalizing every name once
QUERIES = ("f", "fu", "fun", "func", "function_", "function_4", "function_42", "C", "Cl", "Class", "Class1",
           "Class1 > method_3", "Class1.method_3", "zzz")
GOAL_PAINT_S = 1.0
GOAL_SEARCH_MS = 100.0

# Runs before any page script: remember 2D contexts, and on every animation
# frame after a 2D draw call look for a non-transparent pixel in them.
PROBE = r"""
(() => {
  const contexts = [], getContext = HTMLCanvasElement.prototype.getContext;
  HTMLCanvasElement.prototype.getContext = function (kind, ...rest) {
    const ctx = getContext.call(this, kind, ...rest);
    if (ctx && kind === "2d" && !contexts.includes(ctx)) contexts.push(ctx);
    return ctx;
  };
  let dirty = false;
  for (const name of ["fillRect", "fillText", "drawImage", "fill", "stroke"]) {
    const original = CanvasRenderingContext2D.prototype[name];
    CanvasRenderingContext2D.prototype[name] = function (...args) { dirty = true; return original.apply(this, args); };
  }
  const painted = (ctx) => {
    const c = ctx.canvas;
    if (!c.isConnected || !c.width || !c.height) return false;
    const px = ctx.getImageData(0, 0, c.width, c.height).data;
    for (let i = 3; i < px.length; i += 4) if (px[i]) return true;
    return false;
  };
  window.__benchPaint = null;
  const tick = () => {
    if (dirty) {
      dirty = false;
      if (contexts.some(painted)) { window.__benchPaint = performance.now(); return; }
    }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
})();
"""


# ---- profiles ----------------------------------------------------------------


def write_inputs(frames: int, src: Path) -> tuple[Path, Path, dict[str, Any]]:
    """The gpuflame HTML and the speedscope JSON of one generated profile.

    The profile and its speedscope JSON are made once; the HTML is rebuilt
    every run by ``gpuflame view`` from *src*, so it is the viewer under test.
    """
    OUT.mkdir(parents=True, exist_ok=True)
    pb, html, ss = (OUT / f"f{frames}{ext}" for ext in (".pb.gz", ".html", ".speedscope.json"))
    if not (pb.exists() and ss.exists()):
        profile = tree_profile(frames)
        save(profile, pb)
        ss.write_bytes(dumps(profile, "speedscope"))
    env = {**os.environ, "PYTHONPATH": str(src)}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gpuflame", "view", str(pb), "-o", str(html)],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    write_s = time.perf_counter() - t0
    return html, ss, {"html_mb": html.stat().st_size / 1e6, "json_mb": ss.stat().st_size / 1e6, "write_s": write_s}


# ---- the browser ---------------------------------------------------------------


@contextmanager
def serve(folder: Path) -> Iterator[str]:
    """A loopback http.server over *folder*; yields its base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # one line per request would swamp the table
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def open_browser(binary: str) -> Chrome:
    """One headless Chromium, cache off (every round loads from scratch), probe installed."""
    chrome = Chrome(binary)
    for domain in ("Page", "Network", "Runtime"):
        chrome.send(f"{domain}.enable")
    chrome.send("Network.setCacheDisabled", {"cacheDisabled": True})
    chrome.send("Page.addScriptToEvaluateOnNewDocument", {"source": PROBE})
    return chrome


def navigate(chrome: Chrome, url: str) -> None:
    """Go via about:blank so the page before cannot paint into the measurement."""
    chrome.send("Page.navigate", {"url": "about:blank"})
    chrome.wait_for("document.readyState === 'complete' && location.href === 'about:blank'")
    chrome.events.clear()
    chrome.send("Page.navigate", {"url": url})


def renderer_mib(chrome: Chrome) -> float:
    """Resident memory of the browser's largest renderer process (the page's), MiB, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    pending, best = [chrome.proc.pid], 0.0
    while pending:
        pid = pending.pop()
        pending.extend(children.get(pid, []))
        try:
            if b"--type=renderer" in Path(f"/proc/{pid}/cmdline").read_bytes():
                rss = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                           if line.startswith("VmRSS:"))
                best = max(best, int(rss.split()[1]) / 1024)
        except (OSError, StopIteration):
            continue
    return best


def gpuflame_paint(chrome: Chrome, html: Path, timeout: float) -> dict[str, float]:
    """First paint by the page's hook and by the probe, ms since navigation start."""
    navigate(chrome, html.as_uri())
    ready = ("window.gpuflameState && (window.gpuflameState.error || (window.gpuflameState.ready && "
             "window.__benchPaint !== null)) && window.gpuflameState")
    state = chrome.wait_for(ready, timeout=timeout)
    if state["error"]:
        raise CdpError(f"viewer error: {state['error']}")
    return {"hook": state["timings"]["firstPaint"], "probe": chrome.evaluate("window.__benchPaint"),
            "rects": state["drawnRects"], "decode": state["timings"].get("decode", 0.0),
            "prepare": state["timings"].get("prepare", 0.0), "build": state["buildMs"], "draw": state["drawMs"],
            "renderer_mib": renderer_mib(chrome)}


def speedscope_paint(chrome: Chrome, base: str, profile: Path, timeout: float) -> dict[str, float]:
    """speedscope's first paint by the probe, ms since navigation start."""
    url = f"{base}/speedscope/index.html#profileURL={base}/{profile.name}&view=left-heavy"
    navigate(chrome, url)
    probe = chrome.wait_for("window.__benchPaint", timeout=timeout)
    # speedscope titles the page "<profile name> - speedscope" once a profile is loaded
    loaded = chrome.evaluate("document.title.endsWith(' - speedscope')")
    if not loaded:
        raise CdpError("speedscope painted but does not show the profile")
    entry = "performance.getEntriesByType('resource').find((e) => e.name.endsWith({})).responseEnd"
    return {"probe": probe, "script": chrome.evaluate(entry.format(json.dumps(".js"))),
            "fetched": chrome.evaluate(entry.format(json.dumps(profile.name)))}


SEARCH_JS = """
(async (q) => {
  const box = document.getElementById("search");
  const t0 = performance.now();
  box.value = q;
  box.dispatchEvent(new Event("input"));
  const handler = performance.now() - t0;
  await new Promise((resolve) => requestAnimationFrame(resolve)); // queued after the viewer's redraw
  const s = window.gpuflameState;
  return { handler, frame: performance.now() - t0, query: s.query, share: s.matchShare, draw: s.drawMs };
})
"""


def search_latency(chrome: Chrome, html: Path, timeout: float) -> list[dict[str, Any]]:
    """Per query: handler time and time to the redrawn frame (ms); the first pays for name normalizing."""
    gpuflame_paint(chrome, html, timeout)
    results = []
    for q in QUERIES:
        r = chrome.evaluate(f"({SEARCH_JS})({json.dumps(q)})")
        if r["query"] != q:
            raise CdpError(f"search box did not take {q!r}: state says {r['query']!r}")
        results.append({"q": q, **r})
    return results


# ---- the run -------------------------------------------------------------------


def best_of(rounds: list[dict[str, float]], key: str) -> float:
    return min(r[key] for r in rounds)


def fmt_s(ms: float | None) -> str:
    return "n/a" if ms is None else f"{ms / 1000:.3f} s"


def speedscope_problem() -> str | None:
    """Why speedscope cannot run here, or None."""
    if not (SPEEDSCOPE / "index.html").exists():
        return f"{SPEEDSCOPE}/index.html missing: run `npm ci --prefix bench/viewer`"
    return None


def measure(binary: str, sizes: list[int], repeat: int, timeout: float, src: Path) -> dict[int, dict[str, Any]]:
    """Interleaved rounds (gpuflame, speedscope) per size, in one browser."""
    inputs = {n: write_inputs(n, src) for n in sizes}
    link = OUT / "speedscope"
    problem = speedscope_problem()
    if link.is_symlink():
        link.unlink()  # it may point at a removed install
    if problem is None:
        link.symlink_to(SPEEDSCOPE, target_is_directory=True)
    results: dict[int, dict[str, Any]] = {n: {"g": [], "s": [], "s_error": problem, **inputs[n][2]} for n in sizes}
    chrome = open_browser(binary)
    try:
        with serve(OUT) as base:
            for _ in range(repeat):
                for n in sizes:
                    html, ss, _ = inputs[n]
                    results[n]["g"].append(gpuflame_paint(chrome, html, timeout))
                    if results[n]["s_error"] is None:
                        try:
                            results[n]["s"].append(speedscope_paint(chrome, base, ss, timeout))
                        except CdpError as err:
                            results[n]["s_error"] = str(err)
            if sizes:
                results[max(sizes)]["search"] = search_latency(chrome, inputs[max(sizes)][0], timeout)
    finally:
        chrome.close()
    return results


def report(results: dict[int, dict[str, Any]], repeat: int) -> None:
    print(f"first paint, ms since navigation start, best of {repeat} (headless Chromium, 1280x900)")
    print(f"{'frames':>8} {'html MB':>8} {'json MB':>8} {'gpuflame hook':>14} {'gpuflame probe':>15} "
          f"{'speedscope':>11} {'ratio s/g':>10} {'rects':>7}")
    for n, r in results.items():
        g_hook, g_probe = best_of(r["g"], "hook"), best_of(r["g"], "probe")
        s = best_of(r["s"], "probe") if r["s"] else None
        ratio = f"{s / g_probe:9.2f}x" if s else "n/a"
        print(f"{n:>8,} {r['html_mb']:>8.1f} {r['json_mb']:>8.1f} {fmt_s(g_hook):>14} {fmt_s(g_probe):>15} "
              f"{fmt_s(s):>11} {ratio:>10} {r['g'][0]['rects']:>7,}")
        parts = min(r["g"], key=lambda x: x["hook"])
        print(f"{'':>8} gpuflame phases (best round): decode {parts['decode']:.0f} ms, prepare "
              f"{parts['prepare']:.0f} ms, tree {parts['build']:.0f} ms, draw {parts['draw']:.0f} ms; renderer "
              f"{max(x['renderer_mib'] for x in r['g']):.0f} MiB resident (most of any round); "
              f"`gpuflame view` wrote the page in {r['write_s']:.1f} s")
        if r["s"]:
            parts = min(r["s"], key=lambda x: x["probe"])
            print(f"{'':>8} speedscope (best round): its script loaded at {parts['script']:.0f} ms, the profile "
                  f"fetched at {parts['fetched']:.0f} ms")
        if r["s_error"]:
            print(f"{'':>8} speedscope not measured: {r['s_error']}")
    largest = max(results)
    r = results[largest]
    g = best_of(r["g"], "probe") / 1000
    s = best_of(r["s"], "probe") / 1000 if r["s"] else None
    ok = g < GOAL_PAINT_S and (s is None or g <= s)
    print(f"goal: < {GOAL_PAINT_S:.0f} s at {largest:,} frames and no slower than speedscope: "
          f"{'met' if ok else 'MISSED'} ({g:.3f} s vs {'speedscope not measured' if s is None else f'{s:.3f} s'})")
    search = r.get("search", [])
    if search:
        first, rest = search[0], search[1:]
        med_frame = statistics.median(x["frame"] for x in rest)
        med_handler = statistics.median(x["handler"] for x in rest)
        print(f"search on {largest:,} frames, {len(rest)} queries after the first: median {med_frame:.1f} ms to "
              f"the redrawn frame (handler {med_handler:.1f} ms, max {max(x['frame'] for x in rest):.1f} ms); "
              f"first query {first['frame']:.1f} ms (normalizes every name once)")
        print("  " + ", ".join(f"{x['q']!r} {x['frame']:.0f}" for x in search))
        print(f"goal: search < {GOAL_SEARCH_MS:.0f} ms a keystroke: "
              f"{'met' if med_frame < GOAL_SEARCH_MS else 'MISSED'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, action="append",
                        help="distinct functions in a generated profile (repeatable; default 1k, 10k, 100k)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for one page")
    parser.add_argument("--src", type=Path, default=ROOT / "src",
                        help="the gpuflame sources whose viewer to measure (e.g. an unpacked `git archive HEAD`)")
    args = parser.parse_args()
    binary = find_chromium()
    if binary is None:
        print("no chromium installed (apt-get install chromium): viewer benchmark skipped")
        return 0
    sizes = sorted(set(args.frames or SIZES))
    t0 = time.perf_counter()
    print(f"viewer from {args.src}")
    results = measure(binary, sizes, args.repeat, args.timeout, args.src.resolve())
    report(results, args.repeat)
    print(f"(benchmark took {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
