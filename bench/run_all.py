"""Run every benchmark in bench/ in turn (``make bench``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STEPS = [
    ["bench/make_snapshot.py"],
    ["bench/bench_convert.py"],
    ["bench/bench_read_snapshot.py"],
    ["bench/bench_stop.py"],
    ["bench/bench_run_whole.py"],
    ["bench/bench_simulate.py"],
    ["bench/bench_profile.py"],
    ["bench/bench_capture_torch.py"],
    ["bench/bench_gil_contention.py"],
    ["bench/bench_pyroscope.py"],
    ["bench/bench_viewer.py"],
    ["bench/bench_agent.py"],  # root and BPF only; says why it skips otherwise
    ["bench/bench_agent_reader.py"],
    ["bench/bench_agent_stop.py", "--repeat", "1"],  # root and BPF only, as bench_agent.py
    ["bench/bench_pytest_plugin.py"],
]


def main() -> int:
    for step in STEPS:
        print(f"$ python {' '.join(step)}", flush=True)
        rc = subprocess.call([sys.executable, *step], cwd=ROOT)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
