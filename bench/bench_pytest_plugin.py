"""What the pytest plugin costs per test, on a suite of 200 small torch tests (or 200 trivial ones).

A generated suite is run by pytest in a new process, every way once per
round, the ways in turn and their order turned each round (a noisy, shared
machine slows neighbours alike). Each way's cost is its CPU time over the
bare run's of the same round (paired); every round's ratio is printed, and
the median, beside a null control (bare against bare again: the noise) and
the load average before and after.

* ``--suite small``: a 64-wide ``Linear`` forward and a matmul, the ``Linear``
  made by a fixture in a quarter of the tests (those record two phases);
* ``--suite trivial``: one 64x32 matmul each, no fixture;

the ways:

* bare: ``pytest`` (the plugin is installed, and off); null: the same again;
* ``--gpuflame``: every test profiled (body and fixtures apart), the table at the end;
* all: ``--gpuflame-fail-on-increase --gpuflame-categories`` (the stored
  peaks compared, categories from the object graph, the table);
* the peer: pytest-memray's ``--memray`` (host memory, every malloc), when installed;
* ``--against SRC``: all once more with gpuflame imported from SRC
  (another checkout's ``src``, e.g. ``git archive HEAD~3 src | tar -x -C /tmp/old``).

Goal: all under 1.10x on the small suite, 1.25x on the trivial one.
Three clocks per way (CPU of the pytest process, wall, pytest's session
time); the ratios are of CPU time, the steadiest on a shared machine.

    python bench/bench_pytest_plugin.py [--suite small|trivial] [--tests N] [--repeat 5] [--against SRC] [--no-peer]

The last line, ``ratio all: X``, is what ``bench/run_all.py --check`` reads.
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

TRIVIAL = """
import pytest
import torch

B = torch.randn(64, 32)

@pytest.mark.parametrize("i", range({tests}))
def test_trivial(i):
    assert (torch.randn(64, 64) @ B).shape == (64, 32)
"""

ALL = ["--gpuflame-fail-on-increase", "--gpuflame-categories"]


def run(folder: Path, args: list[str], src: str = "") -> tuple[float, float, float]:
    """CPU time and wall time of one pytest process, and the session time pytest prints.

    *src*: import gpuflame from that folder instead of the installed one. Bytecode is written
    (PYTHONDONTWRITEBYTECODE dropped): the warm run leaves gpuflame's modules compiled, as pytest
    rewrote them, as a user's second run finds them; with it set every run compiled them again.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
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


def load() -> str:
    """The load averages over 1, 5 and 15 minutes, as ``uptime`` says them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def suite_text(suite: str, tests: int) -> str:
    if suite == "trivial":
        return TRIVIAL.format(tests=tests)
    return SUITE.format(plain=tests - tests // 4, with_fixture=tests // 4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=("small", "trivial"), default="small")
    parser.add_argument("--tests", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--against",
        metavar="SRC",
        default="",
        help="also run all with gpuflame imported from SRC (an older checkout's src)",
    )
    parser.add_argument(
        "--no-peer",
        action="store_true",
        help="leave pytest-memray out (it takes most of the bench's time), for more rounds",
    )
    args = parser.parse_args()
    ways = {"bare": [], "null (bare again)": [], "--gpuflame": ["--gpuflame"], "all": ALL}
    sources = {name: "" for name in ways}
    if args.against:
        if not (Path(args.against) / "gpuflame" / "__init__.py").is_file():
            raise SystemExit(f"--against: {args.against} has no gpuflame package (give the src folder)")
        ways["all (against SRC)"] = ALL
        sources["all (against SRC)"] = str(Path(args.against).resolve())
    if not args.no_peer and importlib.util.find_spec("pytest_memray") is not None:
        ways["pytest-memray --memray (peer)"] = ["--memray"]
    names = list(ways)
    rounds: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ways}
    loads = [load()]
    with tempfile.TemporaryDirectory(prefix="gpuflame-bench-pytest-") as tmp:
        folder = Path(tmp)
        (folder / f"test_{args.suite}_torch.py").write_text(suite_text(args.suite, args.tests))
        run(folder, ["--gpuflame"])  # warm: compiled hook, bytecode, a stored peak for every test
        if args.against:
            run(folder, ["--gpuflame"], sources["all (against SRC)"])
        for i in range(args.repeat):
            order = names[i % len(names) :] + names[: i % len(names)]  # turned each round
            for name in order:
                rounds[name].append(run(folder, ways[name], sources.get(name, "")))
            loads.append(load())
    report(args, rounds, loads)
    return 0


def report(args: argparse.Namespace, rounds: dict[str, list[tuple[float, float, float]]], loads: list[str]) -> None:
    """Every round's CPU ratio to bare, their median, and the best times beside."""
    bare = rounds["bare"]
    print(
        f"{args.tests} {args.suite} torch tests, {args.repeat} rounds, interleaved; load average "
        f"(1, 5, 15 min) before and after each round: {' | '.join(loads)}"
    )
    print(f"{'':30} {'cpu ratio, each round':>40} {'median':>7} {'best cpu':>9} {'best wall':>9} {'per test':>9}")
    for name, times in rounds.items():
        if name == "bare":
            continue
        ratios = [t[0] / b[0] for t, b in zip(times, bare, strict=True)]
        median = statistics.median(ratios)
        per_test = (median - 1) * statistics.median(b[0] for b in bare) / args.tests * 1000
        each = " ".join(f"{r:.2f}" for r in ratios)
        best = [min(column) for column in zip(*times, strict=True)]
        print(f"{name:30} {each:>40} {median:6.2f}x {best[0]:8.2f}s {best[1]:8.2f}s {per_test:6.2f} ms")
    best_bare = [min(column) for column in zip(*bare, strict=True)]
    print(f"{'bare':30} {'':>40} {'':>7} {best_bare[0]:8.2f}s {best_bare[1]:8.2f}s")
    ratios = [t[0] / b[0] for t, b in zip(rounds["all"], bare, strict=True)]
    null = [t[0] / b[0] for t, b in zip(rounds["null (bare again)"], bare, strict=True)]
    print(f"ratio null: {statistics.median(null):.3f}")
    print(f"ratio all: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    raise SystemExit(main())
