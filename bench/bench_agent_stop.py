"""How long the node agent takes to stop while a process floods the driver (issue 38 item 4).

A C program's four threads call ``cuMemAlloc_v2``/``cuMemFree_v2`` in a loop
on a stand-in libcuda.so.1 (tests/agent/standin_cuda.c); ``gpuflame agent
--pid`` watches it, and is stopped by SIGTERM (or its ``--duration``) once the
flood has made 200,000 pairs. Printed: seconds from the signal (or from the
duration's end, counted from the "watching" line, so a little short) to the
agent's exit, and its ``--json`` ``stop`` (each step's span, the events left in
the ring). Set-ups: the agent on a CPU of its own; sharing the flood's CPU;
sharing it at nice 10.

Needs root, BPF and clang/bpftool/libbpf (as tests/agent/).

    sudo python bench/bench_agent_stop.py [--repeat 3] [--before SRC] [--setup NAME]

``--before SRC`` runs the agent from another source tree's ``src`` (a checkout
of the code before), with a 90 s limit: the agent it kills there is reported.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))  # the test suite's helpers, as the package tests.*

from tests.agent.agent_helpers import FLOOD, NativeCaller, agent_cli, build_standin, watching, why_not  # noqa: E402

LIMIT_S = 90.0
SETUPS = {
    "own CPU": ((), ()),
    "shares the flood's CPU": (("taskset", "-c", "0"), ("taskset", "-c", "0")),
    "shares it at nice 10": (("taskset", "-c", "0"), ("taskset", "-c", "0", "nice", "-n", "10")),
}


def once(lib: str, folder: Path, how: str, setup: str, before: str) -> str:
    flood_cpu, agent_cpu = SETUPS[setup]
    flood = NativeCaller(FLOOD, lib, folder, prefix=flood_cpu)
    env = {"PYTHONPATH": before} if before else None
    extra = ("--duration", "3s") if how == "duration" else ()
    try:
        proc = agent_cli(
            "--pid", str(flood.pid), "-o", str(folder / "a.pb.gz"), "--json", *extra, env=env, prefix=agent_cpu
        )
        watching(proc)
        started = time.monotonic()
        flood.go()
        if how == "sigterm":
            due = time.monotonic()
            proc.send_signal(signal.SIGTERM)
        else:
            due = started + 3.0
        try:
            out, _ = proc.communicate(timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return f"not stopped after {LIMIT_S:g} s (killed)"
        took = time.monotonic() - due
    finally:
        flood.close()
    stop = json.loads(out).get("stop", {}) if proc.returncode == 0 else {}
    return f"{took:5.2f} s, exit {proc.returncode}, stop {json.dumps(stop)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", default="", metavar="SRC", help="run the agent from this src folder")
    parser.add_argument("--setup", choices=SETUPS, action="append", help="only these set-ups (default: all)")
    args = parser.parse_args()
    reason = why_not()
    if reason:
        print(f"skipped: {reason}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        lib = build_standin(folder / "libcuda.so.1")
        for setup in args.setup or SETUPS:
            for how in ("sigterm", "duration"):
                for _ in range(args.repeat):
                    print(f"{setup:24} {how:8} {once(lib, folder, how, setup, args.before)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
