"""What the pytest plugin costs per test, on a suite of 200 small torch tests.

A generated suite (a small Linear forward and a matmul, the Linear made by
a fixture in a quarter of the tests: each test is well under a millisecond
of torch work) is run by
pytest in a new process, round by round in turn (a noisy, shared machine
slows them alike); each way's overhead is the median over rounds of its time
over the bare run's of the same round (paired: a round slowed by a neighbour
slows both), beside its best time:

* bare: ``pytest`` (the plugin is installed, and off);
* ``--gpuflame``: every test profiled (body and fixtures apart), the table at the end;
* ``--gpuflame-fail-on-increase``: the same, comparing with the stored peaks;
* the peer: pytest-memray's ``--memray`` (host memory, every malloc), when installed;
* ``--against SRC``: ``--gpuflame`` once more with gpuflame imported from SRC
  (another checkout's ``src``, e.g. ``git archive HEAD~3 src | tar -x -C /tmp/old``),
  to measure a change side by side with what it replaces.

The figure of merit is the overhead as a share of the bare suite's time
(goal: under 10%), and per test. Three clocks: the process's CPU time (user
+ system, the steadiest on a shared machine), its wall time (what CI waits
for) and pytest's own session time (collection and the tests, without the
interpreter's start).

    python bench/bench_pytest_plugin.py [--tests 200] [--repeat 3] [--against OLD/src] [--no-peer]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = """
import pytest
import torch

@pytest.fixture
def layer():
    return torch.nn.Linear(64, 64)

def forward(lin):
    x = torch.randn(32, 64)
    y = lin(x).relu()
    assert (y @ y.T).shape == (32, 32)

@pytest.mark.parametrize("i", range({plain}))
def test_small(i):
    forward(torch.nn.Linear(64, 64))

@pytest.mark.parametrize("i", range({with_fixture}))
def test_small_with_fixture(i, layer):
    forward(layer)
"""


def run(folder: Path, args: list[str], src: str = "") -> tuple[float, float, float]:
    """CPU time and wall time of one pytest process, and the session time pytest prints.

    *src*: import gpuflame from that folder instead of the installed one.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = re.search(r"passed in ([0-9.]+)s", done.stdout)
    if done.returncode != 0 or not found:
        raise SystemExit(f"pytest {' '.join(args)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return cpu, wall, float(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--against",
        metavar="SRC",
        default="",
        help="also run --gpuflame with gpuflame imported from SRC (an older checkout's src)",
    )
    parser.add_argument(
        "--no-peer",
        action="store_true",
        help="leave pytest-memray out (it takes most of the bench's time), for more rounds",
    )
    args = parser.parse_args()
    ways = {"bare": [], "--gpuflame": ["--gpuflame"], "--gpuflame-fail-on-increase": ["--gpuflame-fail-on-increase"]}
    sources = {name: "" for name in ways}
    if args.against:
        if not (Path(args.against) / "gpuflame" / "__init__.py").is_file():
            raise SystemExit(f"--against: {args.against} has no gpuflame package (give the src folder)")
        ways["--gpuflame (against SRC)"] = ["--gpuflame"]
        sources["--gpuflame (against SRC)"] = str(Path(args.against).resolve())
    if not args.no_peer and importlib.util.find_spec("pytest_memray") is not None:
        ways["pytest-memray --memray (peer)"] = ["--memray"]
    with tempfile.TemporaryDirectory(prefix="gpuflame-bench-pytest-") as tmp:
        folder = Path(tmp)
        suite = SUITE.format(plain=args.tests - args.tests // 4, with_fixture=args.tests // 4)
        (folder / "test_small_torch.py").write_text(suite)
        run(folder, ["--gpuflame"])  # warm: compiled hook, bytecode, a stored peak for every test
        if args.against:
            run(folder, ["--gpuflame"], sources["--gpuflame (against SRC)"])
        rounds: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ways}
        for _ in range(args.repeat):
            for name, extra in ways.items():
                rounds[name].append(run(folder, extra, sources.get(name, "")))
    bare = rounds["bare"]
    print(
        f"{args.tests} small torch tests, {args.repeat} rounds: the best time of each way, and its overhead "
        "as the median over rounds of (way / bare of the same round), and per test"
    )
    print(f"{'':30} {'cpu':>16} {'wall':>16} {'session':>16} {'per test (cpu)':>15}")
    for name, times in rounds.items():
        best = [min(column) for column in zip(*times, strict=True)]
        share = [statistics.median(t[i] / b[i] - 1 for t, b in zip(times, bare, strict=True)) for i in range(3)]
        cells = [f"{t:6.2f}s {100 * r:+6.1f}%" for t, r in zip(best, share, strict=True)]
        per_test = share[0] * statistics.median(b[0] for b in bare) / args.tests * 1000
        print(f"{name:30} {cells[0]:>16} {cells[1]:>16} {cells[2]:>16} {per_test:12.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
