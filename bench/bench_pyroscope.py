"""The cost of continuous mode: `gpuflame run --pyroscope` against the same run without pushing.

One loopback HTTP server answers every push with 200 (and counts them). The
demo workload (``examples/demo.py``, CPU, ``--backend torch``) runs, round by
round interleaved so a noisy machine slows every way alike:

* ``--interval 1s`` without Pyroscope (the snapshots are still taken and
  written: the baseline isolates what pushing adds);
* ``--interval 1s --pyroscope URL`` (a push every second);
* no interval and no Pyroscope, against the default interval (15 s) with
  Pyroscope (the goal: under 1% slowdown at the default interval).

Wall time is the whole ``gpuflame run`` command; CPU time is the children's
user + system time (``resource.getrusage``), so the CPU cost of one push is
the difference divided by the pushes the server received.

    python bench/bench_pyroscope.py [--repeat 3] [--rounds 6]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class PushCounter(BaseHTTPRequestHandler):
    """Accepts every push; counts requests and bytes."""

    pushes = 0
    received = 0
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with PushCounter.lock:
            PushCounter.pushes += 1
            PushCounter.received += len(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/proto")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def run_once(args: list[str], rounds: int, workdir: Path) -> tuple[float, float, int]:
    """(wall seconds, children's CPU seconds, pushes received) of one gpuflame run."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["GPUFLAME_STORE"] = str(workdir / "store")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    pushes_before = PushCounter.pushes
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuflame",
            "run",
            "--backend",
            "torch",
            "-o",
            str(workdir / "b.pb.gz"),
            *args,
            str(ROOT / "examples" / "demo.py"),
            "--rounds",
            str(rounds),
        ],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, PushCounter.pushes - pushes_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6, help="generate rounds of the demo per run")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), PushCounter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    ways = {
        "interval 1s, no push": ["--interval", "1s"],
        "interval 1s, push": ["--interval", "1s", "--pyroscope", url],
        "no interval, no push": [],
        "default interval, push": ["--pyroscope", url],
    }
    results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in ways}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            for name, extra in ways.items():
                results[name].append(run_once(extra, args.rounds, Path(tmp)))
    server.shutdown()

    print(f"workload: examples/demo.py --rounds {args.rounds}, backend torch, CPU; best of {args.repeat}")
    print(f"{'':24} {'wall best':>10} {'wall median':>12} {'cpu best':>9} {'pushes':>7}")
    best = {}
    for name, rows in results.items():
        walls, cpus, pushes = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
        best[name] = (min(walls), min(cpus), max(pushes))
        print(f"{name:24} {min(walls):9.2f}s {statistics.median(walls):11.2f}s {min(cpus):8.2f}s {max(pushes):7d}")
    slow_1s = best["interval 1s, push"][0] / best["interval 1s, no push"][0]
    slow_default = best["default interval, push"][0] / best["no interval, no push"][0]
    pushes_1s = max(1, best["interval 1s, push"][2])
    cpu_per_push = (best["interval 1s, push"][1] - best["interval 1s, no push"][1]) / pushes_1s
    print(
        f"push every second: {100 * (slow_1s - 1):+.1f}% wall time, "
        f"{1000 * cpu_per_push:.1f} ms CPU per push ({pushes_1s} pushes)"
    )
    print(f"default interval (15 s) with Pyroscope: {100 * (slow_default - 1):+.1f}% wall time (goal < 1%)")


if __name__ == "__main__":
    main()
