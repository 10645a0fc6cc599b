"""``bench/run_all.py --check``: reading a bench's output and judging each claim, on canned outputs (no timing)."""

from __future__ import annotations

import importlib.util
import re
import sys
from types import ModuleType

import pytest

from tests.helpers.paths import REPO


def run_all() -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_all", REPO / "bench" / "run_all.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_all"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


RUN_ALL = run_all()
BY_NAME = {c.name: c for c in RUN_ALL.CLAIMS}

# what each bench prints where its ratio is, in the bench's own format (a line of each, figures made up)
CANNED = {
    "pytest-small": "null (bare again) 0.98 1.01 0.99x\nratio null: 0.990\nratio all: {}\n",
    "pytest-trivial": "ratio null: 1.010\nratio all: {}\n",
    "torch-hook": "gpuflame torch ratio {}x (goal < 1.3x); with --torch-hook dispatch 1.90x\n",
    "dispatch-tiny": "gpuflame torch ratio 1.10x (goal < 1.3x); with --torch-hook dispatch {}x\n",
    "dispatch-memray": "dispatch/memray {}x (the recorders' cost over bare, medians)\n"
    "dispatch:before/memray 9.99x (the recorders' cost over bare, medians)\n",
    "run-demo": "demo.py: 3 rounds\n  bare             CPU   4.10 s (1.00x bare)  wall   5.00 s (1.00x bare)\n"
    "  run:main         CPU   4.60 s ({}x bare)  wall   5.90 s (1.18x bare)\n",
    "convert-same-dict": "ratio (from the same dict):      {}x  (goal: >= 2x)\n",
    "convert-viz-in-process": "  null pickle/pickle 1.00x  convert/pickle 4.90x  convert/viz {}x  first/viz 9.00x\n",
    "convert-viz-command": "  null/pickle 1.01x  convert/pickle 4.92x  convert/viz-command {}x\n",
    "pprof-load": "ratio null/parse+top: 0.99x (rounds 0.99)\nratio load/parse+top: {}x (rounds 1.1 1.2)\n"
    "ratio load:base/parse+top: 9.10x (rounds 9.1)\n",
    "pprof-report": "ratio null/parse+top: 0.99x (rounds 0.99)\nratio report/parse+top: {}x (rounds 5.1)\n"
    "ratio report:base/parse+top: 9.20x (rounds 9.2)\n",
}


def test_every_claim_has_a_canned_output() -> None:
    assert set(CANNED) == set(BY_NAME)


@pytest.mark.parametrize("name", sorted(CANNED))
def test_each_claim_reads_its_bench_and_says_whether_it_holds(name: str) -> None:
    claim = BY_NAME[name]
    inside = claim.bound * (1.1 if claim.at_least else 0.9)
    outside = claim.bound * (0.9 if claim.at_least else 1.1)
    for value, holds in ((inside, True), (outside, False)):
        output = CANNED[name].format(f"{value:.2f}")
        assert RUN_ALL.measured(claim, output) == pytest.approx(round(value, 2))
        assert RUN_ALL.holds(claim, RUN_ALL.measured(claim, output)) is holds
        line = RUN_ALL.verdict_line(claim, RUN_ALL.measured(claim, output))
        assert line.lower().endswith("holds") and ("NO LONGER" in line) is not holds


def test_several_files_are_judged_by_the_worst() -> None:
    claim = BY_NAME["convert-viz-in-process"]  # a cost: the largest ratio
    output = "  convert/viz 3.40x  first/viz 9x\n  convert/viz 12.50x\n  convert/viz 1.80x\n"
    assert RUN_ALL.measured(claim, output) == 12.5
    speedup = BY_NAME["convert-same-dict"]  # a speed-up: the smallest
    assert RUN_ALL.measured(speedup, "ratio (from the same dict):  2.50x\nratio (from the same dict):  1.70x\n") == 1.7


def test_a_bench_that_printed_nothing_does_not_hold() -> None:
    claim = BY_NAME["pytest-small"]
    assert RUN_ALL.measured(claim, "pytest --gpuflame failed:\nINTERNALERROR") is None
    assert not RUN_ALL.holds(claim, None)
    assert "not measured" in RUN_ALL.verdict_line(claim, None)


def test_check_runs_inputs_once_then_each_claim(capsys: pytest.CaptureFixture[str]) -> None:
    ran: list[tuple[str, ...]] = []

    def fake(command: tuple[str, ...]) -> str:
        ran.append(command)
        return {"bench/bench_convert.py": "ratio (from the same dict):   1.50x\n"}.get(command[0], "ratio all: 1.05\n")

    claims = (BY_NAME["pytest-small"], BY_NAME["convert-same-dict"], BY_NAME["convert-same-dict"])
    assert RUN_ALL.check(claims, fake) == [True, False, False]
    assert [c[0] for c in ran].count("bench/make_snapshot.py") == 1
    out = capsys.readouterr().out
    assert re.search(r"pytest-small .* now 1\.05x .* holds", out)
    assert re.search(r"convert-same-dict .* now 1\.50x .* NO LONGER HOLDS", out)


def test_an_unknown_claim_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        RUN_ALL.main(["--check", "--only", "nonsense"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_benchmarks_md_lists_every_claim_with_its_bound() -> None:
    """The headline table in BENCHMARKS.md and the script's claims are one list: each name, bound and command."""
    text = (REPO / "BENCHMARKS.md").read_text(encoding="utf-8")
    section = text.split("## Headline ratios", 1)[1].split("\n## ", 1)[0]
    for claim in RUN_ALL.CLAIMS:
        row = next((line for line in section.splitlines() if f"`{claim.name}`" in line), "")
        assert row, claim.name
        assert f"{'>=' if claim.at_least else '<='} {claim.bound:.2f}x" in row, (claim.name, row)
        assert claim.command[0] in row, (claim.name, row)
