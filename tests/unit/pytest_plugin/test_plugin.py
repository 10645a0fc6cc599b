"""The pytest plugin, run by pytester on real tests that allocate known bytes with CPU torch.

The plugin is found through its entry point, not passed with ``-p``. Runs
are in-process (this process has torch imported already, so each run takes
a second), except where the run's own process matters: what a run that asks
for nothing imports, and pytest-xdist's workers.
"""

from __future__ import annotations

import json
import re
import tempfile

import pytest

# Imported before any run: pytester's in-process runs unload the modules they
# imported, and numpy or torch cannot be loaded twice in one process.
import torch  # noqa: F401, I001

import gpuflame.pytest_plugin.budget  # noqa: F401
import gpuflame.pytest_plugin.record  # noqa: F401
from gpuflame.formats import load

pytest_plugins = ("pytester",)


@pytest.fixture(autouse=True)
def _compiled_hook_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytester moves HOME; keep the CPU allocator hook compiled once, in the user's cache."""
    from gpuflame.capture.recorders.allocator.native import cache_dir

    monkeypatch.setenv("GPUFLAME_CACHE_DIR", str(cache_dir()))


MiB = 1 << 20

SUITE = """
import pytest, torch

KEPT = []

def allocate_four():
    return torch.empty(4 << 20, dtype=torch.uint8)

class Buffers:
    def grow(self, n):
        return torch.empty(n, dtype=torch.uint8)

@pytest.fixture
def weights():
    return Buffers().grow(2 << 20)

@pytest.mark.limit_gpu_memory("1 MiB")
def test_over_budget():
    x = allocate_four()

@pytest.mark.limit_gpu_memory("8 MiB")
def test_within_budget(weights):
    x = allocate_four()

@pytest.mark.limit_gpu_leaks("1 MiB")
def test_leaks():
    KEPT.append(Buffers().grow(3 << 20))   # held after the test: a leak
    KEPT.append(torch.empty(512 << 10))    # 2 MiB of float32, also held, at another line
    temporary = Buffers().grow(5 << 20)    # freed when the test returns

@pytest.mark.limit_gpu_leaks("1 MiB")
def test_small_leak_is_allowed():
    KEPT.append(Buffers().grow(512 << 10))

def test_unmarked():
    x = torch.ones(1024)
"""


def table_rows(text: str) -> dict[str, list[str]]:
    """The summary table: test id -> its cells (peak, in use, fixtures, top function)."""
    rows = {}
    for line in text.splitlines():
        cell = r"(\d[\d.]* [KMGTP]?i?B\*?|-|\?)"  # a size (with '*' for a shared fixture), none, or not recorded
        m = re.match(rf"^\s*{cell}\s+{cell}\s+{cell}\s+(.+?)\s+(\S+::\S+)$", line)
        if m:
            rows[m.group(5)] = [m.group(1), m.group(2), m.group(3), m.group(4)]
    return rows


@pytest.mark.slow
def test_budgets_fixtures_and_the_summary_table(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("--gpuflame", "--gpuflame-dir", "profiles")
    result.assert_outcomes(passed=3, failed=2)
    out = result.stdout.str()
    # over budget: the limit, the peak and the allocating function by name, and where the profile is
    assert "gpuflame: peak 4.00 MiB is over the limit of 1.00 MiB (limit_gpu_memory, 3,145,728 bytes over)" in out
    # each stack names the line that allocated its bytes (2 MiB: line 27, not 26 where test_leaks called grow)
    assert re.search(r"4\.00 MiB \(100\.0%\)  test_over_budget -> allocate_four  \(test_suite\.py:6\)", out)
    assert "profile: profiles/test_suite.py_test_over_budget.pb.gz" in out
    # leaks: both held stacks, not the freed one
    assert "gpuflame: 2 stacks still hold 5.00 MiB allocated during the test" in out
    assert re.search(r"3\.00 MiB \( 60\.0%\)  test_leaks -> Buffers > grow", out)
    assert re.search(r"2\.00 MiB \( 40\.0%\)  test_leaks  \(test_suite\.py:27\)", out)
    # the table: body and fixtures apart, highest peak first
    rows = table_rows(out)
    assert rows["test_suite.py::test_leaks"] == ["10.0 MiB", "5.00 MiB", "-", "Buffers > grow"]
    assert rows["test_suite.py::test_within_budget"] == ["4.00 MiB", "0 B", "2.00 MiB", "allocate_four"]
    assert rows["test_suite.py::test_over_budget"] == ["4.00 MiB", "0 B", "-", "allocate_four"]
    assert rows["test_suite.py::test_unmarked"][0] == "4.00 KiB"
    assert list(rows)[0] == "test_suite.py::test_leaks"
    # the kept profiles are what the messages describe
    folder = pytester.path / "profiles"
    body = load(folder / "test_suite.py_test_within_budget.pb.gz")
    fixture = load(folder / "test_suite.py_test_within_budget.fixtures.pb.gz")
    assert body.totals()["peak_space"] == 4 * MiB and fixture.totals()["peak_space"] == 2 * MiB
    assert {f.name for f in fixture.frames} == {"weights", "Buffers > grow"}  # pytest's frames cut away


@pytest.mark.subprocess
def test_off_unless_asked_markers_alone_profile_their_tests(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest()
    result.assert_outcomes(passed=3, failed=2)
    out = result.stdout.str()
    assert "test_over_budget -> allocate_four" in out
    assert "profiled tests" not in out  # no table without --gpuflame
    assert "profile: .pytest_cache/d/gpuflame/test_suite.py_test_over_budget.pb.gz" in out
    # a run that asks for nothing records nothing and loads neither a recorder nor the analysis (numpy);
    # a marked test whose framework is imported only in its body says that it got no numbers
    plain = pytester.makepyfile(
        test_plain="""
import sys, pytest

def test_nothing():
    assert not {"gpuflame.analysis.tree", "gpuflame.pytest_plugin.record", "numpy"} & set(sys.modules)

@pytest.mark.limit_gpu_memory("1 MiB")
def test_imports_torch_late():
    import torch
    x = torch.empty(4 << 20, dtype=torch.uint8)
"""
    )
    late = pytester.runpytest_subprocess(str(plain))
    late.assert_outcomes(passed=2, warnings=1)
    said = late.stdout.str()
    assert "gpuflame: nothing recorded for this test: torch or jax was not imported when the test started" in said


GROWING = """
import torch

def allocate():
    return torch.empty({size}, dtype=torch.uint8)

def test_grows():
    x = allocate()

def test_steady():
    x = torch.empty(1 << 20, dtype=torch.uint8)
"""


@pytest.mark.slow
def test_fail_on_increase_after_the_test_allocates_twice_as_much(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_growth=GROWING.format(size="4 << 20"))
    pytester.runpytest("--gpuflame").assert_outcomes(passed=2)
    pytester.makepyfile(test_growth=GROWING.format(size="(4 << 20) * 2"))
    failed = pytester.runpytest("--gpuflame-fail-on-increase")
    failed.assert_outcomes(passed=1, failed=1)
    out = failed.stdout.str()
    assert "gpuflame: peak grew from 4.00 MiB to 8.00 MiB (+100.0%, +4,194,304 bytes) since the last run" in out
    assert "test_grows -> allocate" in out and "FAILED test_growth.py::test_grows" in out
    # the failed test kept its old peak: the regression still fails, unless the tolerance allows it
    pytester.runpytest("--gpuflame-fail-on-increase").assert_outcomes(passed=1, failed=1)
    lenient = pytester.runpytest("--gpuflame-fail-on-increase", "--gpuflame-tolerance", "100%")
    lenient.assert_outcomes(passed=2)


def test_fail_on_increase_without_a_baseline_says_it_compared_nothing(pytester: pytest.Pytester) -> None:
    """With pytest's cache off, a 2x growth cannot fail: the run must say so, not read as checked."""
    pytester.makepyfile(test_growth=GROWING.format(size="4 << 20"))
    pytester.runpytest("--gpuflame", "-p", "no:cacheprovider").assert_outcomes(passed=2)
    pytester.makepyfile(test_growth=GROWING.format(size="(4 << 20) * 2"))
    result = pytester.runpytest("--gpuflame-fail-on-increase", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert "--gpuflame-fail-on-increase compared nothing: pytest's cache is off (-p no:cacheprovider)" in (
        result.stdout.str()
    )


def test_fail_on_increase_on_a_first_run_names_the_tests_without_a_baseline(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_growth=GROWING.format(size="4 << 20"))
    first = pytester.runpytest("--gpuflame-fail-on-increase")
    first.assert_outcomes(passed=2)
    assert "2 tests had no peak from an earlier run to compare with" in first.stdout.str()
    again = pytester.runpytest("--gpuflame-fail-on-increase")
    assert "had no peak from an earlier run" not in again.stdout.str()


@pytest.mark.parametrize(
    "stored", ['["a"]', "5", '{"test_growth.py::test_grows": "big"}', '{"test_growth.py::test_grows": 1e999}']
)
def test_fail_on_increase_with_a_damaged_cache_compares_what_is_a_peak(pytester: pytest.Pytester, stored) -> None:
    """pytest's cache is a file: a list there was an INTERNALERROR, a peak of "big" or 1e999 a TypeError in the test."""
    pytester.makepyfile(test_growth=GROWING.format(size="4 << 20"))
    peaks = pytester.path / ".pytest_cache/v/gpuflame/peaks"
    peaks.parent.mkdir(parents=True)
    peaks.write_text(stored)
    result = pytester.runpytest("--gpuflame-fail-on-increase")
    result.assert_outcomes(passed=2)
    assert "INTERNALERROR" not in result.stdout.str() and "had no peak from an earlier run" in result.stdout.str()
    kept = json.loads(peaks.read_text())
    assert isinstance(kept, dict) and kept["test_growth.py::test_grows"] == 4 << 20


def test_fail_on_increase_names_the_tests_whose_peak_is_not_kept_because_they_failed(
    pytester: pytest.Pytester,
) -> None:
    """'this run's peaks are kept for the next' must not be said of a failing test: its peak is never stored."""
    pytester.makepyfile(
        test_fails=GROWING.format(size="4 << 20") + "\n\ndef test_fails():\n    torch.ones(1024)\n    assert 0\n"
    )
    for _ in range(2):  # the failing test has no baseline in the second run either
        result = pytester.runpytest("--gpuflame-fail-on-increase")
        result.assert_outcomes(passed=2, failed=1)
        assert (
            "but not those of the 1 that failed (a peak is kept once its test passes): test_fails.py::test_fails"
            in (result.stdout.str())
        )
    assert "test_fails.py::test_fails" not in json.loads((pytester.path / ".pytest_cache/v/gpuflame/peaks").read_text())


BROKEN = """
import torch
from gpuflame.capture.exit_hooks import HOOKS


def test_a_bigger_peak_first():  # the table's one row (--gpuflame-top 1): the next test's profile is not built
    torch.empty(2 << 20, dtype=torch.uint8)


def test_breaks_its_recorder():
    x = torch.empty(1 << 20, dtype=torch.uint8)
    for session in HOOKS.sessions:  # an internal error of the recorder, as a failing hook would raise
        for recorder in session.recorders:
            recorder.fail("an injected internal error", "recording stops here")
"""

BROKEN_AT_STOP = """
import torch
from gpuflame.capture.exit_hooks import HOOKS


def test_a_bigger_peak_first():  # the table's one row (--gpuflame-top 1): the next test's profile is not built
    torch.empty(2 << 20, dtype=torch.uint8)


def test_breaks_its_recorder():
    x = torch.empty(1 << 20, dtype=torch.uint8)
    for session in HOOKS.sessions:  # the recorder fails at its stop, after the peak was read without a profile
        for recorder in session.recorders:
            def broken(stop=recorder._stop):
                stop()
                raise RuntimeError("an injected internal error")
            recorder._stop = broken
"""


@pytest.mark.parametrize("suite", [BROKEN, BROKEN_AT_STOP], ids=["in the test", "at its stop"])
def test_a_recording_that_degraded_is_no_baseline(pytester: pytest.Pytester, suite: str) -> None:
    """A recorder that stopped part way gives a short peak (0 B once, for every test of a broken run): it is
    said as incomplete, and never stored, so the next run does not fail every test as grown from it; a
    failure at the stop of a phase whose profile is not built is said the same."""
    pytester.makepyfile(test_broken=suite)
    args = ("--gpuflame-fail-on-increase", "--gpuflame-top", "1", "-W", "ignore::RuntimeWarning")
    first = pytester.runpytest(*args)
    first.assert_outcomes(passed=2)
    out = first.stdout.str()
    assert "the profile of this test is incomplete" in out and "an injected internal error" in out
    again = pytester.runpytest(*args)
    again.assert_outcomes(passed=2)
    assert "1 test had no peak from an earlier run to compare with" in again.stdout.str()


def test_a_failure_names_each_allocating_line_apart(pytester: pytest.Pytester) -> None:
    """4 MiB on one line and 512 KiB on the next are two rows, each with its own line and bytes."""
    pytester.makepyfile(
        test_lines="""
import pytest, torch

@pytest.mark.limit_gpu_memory("1 MiB")
def test_two_lines():
    a = torch.empty(4 << 20, dtype=torch.uint8)
    b = torch.empty(512 << 10, dtype=torch.uint8)
"""
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert re.search(r"4\.00 MiB \( 88\.9%\)  test_two_lines  \(test_lines\.py:5\)", out), out
    assert re.search(r"512\.0 KiB \( 11\.1%\)  test_two_lines  \(test_lines\.py:6\)", out), out


def test_a_tests_own_start_and_stop_get_their_answer_and_the_row_keeps_its_own(pytester: pytest.Pytester) -> None:
    """The test's own gpuflame.start/stop nest in the plugin's recording: its file is written, the row is right."""
    pytester.makepyfile(
        test_own="""
import gpuflame, torch

def test_records_itself(tmp_path):
    gpuflame.start(tmp_path / "mine.pb.gz", backend="torch")
    x = torch.empty(4 << 20, dtype=torch.uint8)
    assert gpuflame.stop() == (tmp_path / "mine.pb.gz").resolve()
    assert gpuflame.load(tmp_path / "mine.pb.gz").totals()["peak_space"] == 4 << 20
"""
    )
    result = pytester.runpytest("--gpuflame", "-p", "no:cacheprovider", "-W", "ignore::RuntimeWarning")
    result.assert_outcomes(passed=1)
    rows = table_rows(result.stdout.str())
    assert rows["test_own.py::test_records_itself"][0] == "4.00 MiB", rows


@pytest.mark.subprocess
def test_xdist_workers_results_are_merged(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("-n", "2", "--gpuflame")
    result.assert_outcomes(passed=3, failed=2)
    out = result.stdout.str()
    assert "gpuflame: 5 of 5 profiled tests, highest peak first" in out
    rows = table_rows(out)
    assert rows["test_suite.py::test_within_budget"] == ["4.00 MiB", "0 B", "2.00 MiB", "allocate_four"]
    assert rows["test_suite.py::test_leaks"][:2] == ["10.0 MiB", "5.00 MiB"]
    assert "test_over_budget -> allocate_four" in out


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (["--gpuflame-tolerance", "lots"], "--gpuflame-tolerance: not a tolerance: 'lots' (examples: 5%, 0%, 1MiB)"),
        (["--gpuflame-tolerance=-5%"], "--gpuflame-tolerance: not a tolerance: '-5%' (examples: 5%, 0%, 1MiB)"),
        (["--gpuflame-backend", "cobol"], "--gpuflame-backend must be one of auto, torch-cuda, torch, jax"),
        (["--gpuflame-top", "-1"], "--gpuflame-top must be 0 (every test) or more, not -1"),
    ],
)
def test_bad_options_are_one_line(pytester: pytest.Pytester, option: list[str], said: str) -> None:
    pytester.makepyfile(test_plain="def test_nothing():\n    assert 1\n")
    result = pytester.runpytest(*option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert said in result.stderr.str() and "Traceback" not in result.stderr.str()
    assert result.stderr.str().count("(examples") <= 1


def test_a_bad_limit_fails_the_test_in_one_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_bad="""
import pytest, torch

@pytest.mark.limit_gpu_memory("lots")
def test_bad_limit():
    x = torch.empty(1024)
"""
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["gpuflame: @pytest.mark.limit_gpu_memory: not a size: 'lots' *"])
    assert "Traceback" not in result.stdout.str() and "INTERNALERROR" not in result.stdout.str()


def test_no_backend_start_is_left_waiting_for_an_import(pytester: pytest.Pytester) -> None:
    """With ``auto``, a test only starts the backends of frameworks already imported: a later
    ``import jax`` must not start recorders into the stopped sessions of earlier tests."""
    from gpuflame.capture import post_import
    from gpuflame.capture.books import auto_phases

    def waiting() -> set[int]:
        # the known frameworks' phase marks (auto_phases) wait for their modules by design: they start nothing
        callbacks = (c for cs in post_import._callbacks.values() for c in cs)
        return {id(c) for c in callbacks if getattr(c, "func", None) is not auto_phases._wrap_module}

    before = waiting()  # what other tests in this process left (a gpuflame.start that waits for jax)
    pytester.makepyfile(
        test_pending="""
import torch

def test_allocates():
    x = torch.empty(1 << 20, dtype=torch.uint8)

def test_allocates_again():
    x = torch.empty(1 << 20, dtype=torch.uint8)
"""
    )
    pytester.runpytest("--gpuflame", "-p", "no:cacheprovider").assert_outcomes(passed=2)
    assert not waiting() - before


CATEGORY_SUITE = """
import torch

NET = torch.nn.Linear(256, 256, bias=False)  # made at import: before any test is recorded

def test_keeps_a_gradient():
    NET.weight.grad = torch.zeros(256, 256)  # 256 KiB set by hand: no hook sees it, only the object graph
"""


@pytest.mark.parametrize("asked", [False, True])
def test_categories_from_the_object_graph_only_when_asked(pytester: pytest.Pytester, asked: bool) -> None:
    """A walk of every object per test costs tens of ms: off unless --gpuflame-categories."""
    pytester.makepyfile(test_layer=CATEGORY_SUITE)
    args = ["--gpuflame-dir", "profiles", "-p", "no:cacheprovider"] + ["--gpuflame-categories"] * asked
    pytester.runpytest_inprocess(*args).assert_outcomes(passed=1)
    profile = load(pytester.path / "profiles" / "test_layer.py_test_keeps_a_gradient.pb.gz")
    index = profile.type_index("inuse_space")
    held = {s.label("category"): s.values[index] for s in profile.samples if s.values[index]}
    gradient_bytes = 256 * 256 * 4
    if asked:
        assert held.get("gradient") == gradient_bytes
    else:  # classed by the allocating stack: the test body is no forward, backward or optimizer
        assert "gradient" not in held and sum(held.values()) == gradient_bytes


def test_a_run_without_categories_leaves_the_graph_walk_on_for_the_process(pytester: pytest.Pytester) -> None:
    """The switch is the process's: after an in-process run the walk is back on for what comes next."""
    from gpuflame.capture.books import categories

    pytester.makepyfile(test_layer=CATEGORY_SUITE)
    pytester.runpytest_inprocess("--gpuflame", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert categories._graph_walk is True


FROZEN_SUITE = """
import gc, torch

NET = torch.nn.Linear(256, 256, bias=False)  # made at import: frozen with the rest at the first walk
KEPT = []

def test_a_model_made_at_import_is_still_found():
    assert gc.get_freeze_count() == 0  # nothing walked yet: the first walk, at this test's end, freezes
    NET.weight.grad = torch.zeros(256, 256)

def test_b_model_made_in_the_test_is_found():
    assert gc.get_freeze_count() > 0  # the walk reads what was made since the first walk, and NET
    net = torch.nn.Linear(128, 128, bias=False)
    KEPT.append(net)
    net.weight.grad = torch.zeros(128, 128)  # set by hand: no hook sees it, only the object graph
"""


def test_categories_walk_only_what_the_tests_made_and_the_models_before(pytester: pytest.Pytester) -> None:
    """With --gpuflame-categories the objects there are at the first test are frozen once (a walk per
    test of torch's and pytest's objects cost tens of ms): models made before and during the tests are
    still found, and the collector gets its objects back when the run ends."""
    import gc

    from gpuflame.capture.books import categories

    pytester.makepyfile(test_frozen=FROZEN_SUITE)
    args = ["--gpuflame-dir", "profiles", "--gpuflame-categories", "-p", "no:cacheprovider"]
    pytester.runpytest_inprocess(*args).assert_outcomes(passed=2)
    for test, side in (("a_model_made_at_import_is_still_found", 256), ("b_model_made_in_the_test_is_found", 128)):
        profile = load(pytester.path / "profiles" / f"test_frozen.py_test_{test}.pb.gz")
        index = profile.type_index("inuse_space")
        held = {s.label("category"): s.values[index] for s in profile.samples if s.values[index]}
        assert held.get("gradient") == side * side * 4, (test, held)
    assert gc.get_freeze_count() == 0 and categories._frozen_found is None


def test_a_passing_tests_profile_is_not_built_and_its_numbers_are_the_profiles(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no check fails, nothing is kept and the test cannot reach the table, no profile is built and
    the object graph is not walked (they cost more than a small test): its peak and in use come from the
    recorder's totals, the same numbers a built profile gives (--gpuflame-dir builds every one)."""
    from gpuflame.capture.books import categories

    walks, freezes = [], []  # the object graph read (each walk, and the one before freezing), the freezes
    walk, freeze = categories._objects_of, categories.freeze_for_walks
    monkeypatch.setattr(categories, "_objects_of", lambda kinds: walks.append(1) or walk(kinds))
    monkeypatch.setattr(categories, "freeze_for_walks", lambda: freezes.append(1) or freeze())
    pytester.makepyfile(test_sizes=SIZES_SUITE)
    # the torch backend named: with auto, a jax an earlier test imported into this process adds a recorder, and
    # two recorders' joint peak is only the merged profile's (hosted.peak_now), so every phase is built
    torch_only = ("--gpuflame-backend", "torch")
    lazy = pytester.runpytest_inprocess("--gpuflame", "--gpuflame-categories", "--gpuflame-top", "2", *torch_only)
    lazy.assert_outcomes(passed=5)
    assert walks == [] and freezes == []
    stored = json.loads((pytester.path / ".pytest_cache" / "v" / "gpuflame" / "peaks").read_text())
    assert stored == {f"test_sizes.py::test_{t}": mib * MiB for t, mib in SIZES_PEAKS.items()}
    built = pytester.runpytest_inprocess(
        "--gpuflame-categories",
        "--gpuflame-top",
        "5",
        "--gpuflame-dir",
        "profiles",
        "-p",
        "no:cacheprovider",
        *torch_only,
    )
    built.assert_outcomes(passed=5)
    assert len(walks) == 1 + 5 and len(freezes) == 1  # the objects before the first walk frozen; a walk a profile
    lazy_rows, built_rows = table_rows(lazy.stdout.str()), table_rows(built.stdout.str())
    # the two highest peaks, both named though each came after lower ones: a test that may reach the table is built
    assert list(lazy_rows) == ["test_sizes.py::test_e_eight", "test_sizes.py::test_c_five"]
    assert all(lazy_rows[test] == built_rows[test] for test in lazy_rows)
    for test, held in (("a_one", 0), ("b_three", 1), ("c_five", 0), ("d_two", 2), ("e_eight", 0)):
        peak = SIZES_PEAKS[test]
        profile = load(pytester.path / "profiles" / f"test_sizes.py_test_{test}.pb.gz")
        assert (profile.totals()["peak_space"], profile.totals()["inuse_space"]) == (peak * MiB, held * MiB)
        assert built_rows[f"test_sizes.py::test_{test}"][:2] == [f"{peak}.00 MiB", f"{held}.00 MiB" if held else "0 B"]


def test_the_peak_said_without_a_profile_is_the_profiles(tmp_path) -> None:
    """The numbers of a phase whose profile is not built (hosted.peak_now) are those the profile would give."""
    from gpuflame import hosted
    from gpuflame.pytest_plugin.record import HOST_DIRS

    recording = hosted.start(tmp_path / "unused.pb.gz", "torch", "pytest --gpuflame")
    kept = torch.empty(1 << 20, dtype=torch.uint8)
    gone = torch.empty(3 << 20, dtype=torch.uint8)
    del gone
    also = torch.empty(2 << 20, dtype=torch.uint8)
    said = hosted.peak_now(recording)
    profile = hosted.stop(recording, HOST_DIRS)
    assert profile is not None and kept.numel() + also.numel() == 3 * MiB
    assert said == (4 * MiB, 3 * MiB) == (profile.totals()["peak_space"], profile.totals()["inuse_space"])


SIZES_PEAKS = {"a_one": 1, "b_three": 3, "c_five": 5, "d_two": 2, "e_eight": 8}  # MiB, as SIZES_SUITE allocates
SIZES_SUITE = """
import torch

KEPT = []

def allocate(mib):
    return torch.empty(mib << 20, dtype=torch.uint8)

def test_a_one():
    allocate(1)

def test_b_three():
    KEPT.append(allocate(1))
    allocate(2)

def test_c_five():
    allocate(5)

def test_d_two():
    KEPT.append(allocate(2))

def test_e_eight():
    allocate(8)
"""


def test_a_tests_profiles_are_not_held_after_its_report(pytester: pytest.Pytester) -> None:
    """Items live as long as the run: a profile kept on each would hold every test's samples to the end."""
    pytester.makeconftest(
        """
import pytest
from gpuflame.pytest_plugin import BODY, FIXTURES

@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item):
    assert BODY not in item.stash and FIXTURES not in item.stash
    item.config.teardowns_checked = getattr(item.config, "teardowns_checked", 0) + 1

def pytest_terminal_summary(terminalreporter, config):
    terminalreporter.write_line(f"teardowns checked: {config.teardowns_checked}")
"""
    )
    pytester.makepyfile(test_held=SUITE)
    result = pytester.runpytest_inprocess("--gpuflame", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(["teardowns checked: 5"])


JAX_SUITE = """
import jax.numpy as jnp
import pytest

KEPT = []

def test_a_keeps_four():
    KEPT.append(jnp.ones((1 << 20,), dtype=jnp.float32))

@pytest.mark.limit_gpu_memory("2 MiB")
def test_b_keeps_one():
    KEPT.append(jnp.ones((1 << 18,), dtype=jnp.float32))

@pytest.mark.limit_gpu_leaks("3 MiB")
def test_c_keeps_two():
    KEPT.append(jnp.ones((1 << 19,), dtype=jnp.float32))
"""


@pytest.mark.subprocess  # JAX imported into this process would add a recorder to every other test here
def test_a_jax_test_is_charged_with_its_own_buffers_not_an_earlier_tests(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JAX lists every live buffer of the process: each test was charged with the 4 MiB the first test kept,
    so a 1 MiB test failed its 2 MiB budget and its leak check named the first test's stack."""
    pytester.makepyfile(test_jax_kept=JAX_SUITE)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    result = pytester.runpytest_subprocess(
        "--gpuflame-backend", "jax", "--gpuflame-dir", "profiles", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=3)
    for test, kept in (("a_keeps_four", 4 * MiB), ("b_keeps_one", MiB), ("c_keeps_two", 2 * MiB)):
        profile = load(pytester.path / "profiles" / f"test_jax_kept.py_test_{test}.pb.gz")
        assert profile.totals()["inuse_space"] == profile.totals()["peak_space"] == kept


def test_without_pytests_cache_a_failing_profile_goes_to_a_private_folder(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a fixed /tmp/gpuflame-pytest that another user could have made first (or made a link)."""
    tmp = pytester.path / "shared-tmp"
    tmp.mkdir()
    victim = pytester.path / "victim"
    victim.mkdir()
    (tmp / "gpuflame-pytest").symlink_to(victim)
    pytester.makepyfile(
        test_over="""
import pytest, torch

@pytest.mark.limit_gpu_memory("1 MiB")
def test_over():
    x = torch.empty(4 << 20, dtype=torch.uint8)
"""
    )
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # what TMPDIR would give a new process
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    saved = re.search(r"profile: (\S+\.pb\.gz)", result.stdout.str())
    assert saved is not None, result.stdout.str()
    folder = (pytester.path / saved.group(1)).parent
    assert folder.parent == tmp and folder.name.startswith("gpuflame-pytest-profiles-")
    assert folder.stat().st_mode & 0o777 == 0o700 and load(pytester.path / saved.group(1)).totals()
    assert list(victim.iterdir()) == []


def test_each_test_keeps_its_own_profile_whatever_its_id(pytester: pytest.Pytester) -> None:
    """Parameter ids that read alike once made a file name, or too long for one: each test its own file."""
    pytester.makepyfile(
        test_ids="""
import pytest, torch

SIZES = {"data/a.csv": 1 << 20, "data_a.csv": 2 << 20, "x" * 300: 3 << 20, "plain": 4 << 20}

@pytest.fixture
def weights():
    return torch.empty(5 << 20, dtype=torch.uint8)

@pytest.mark.parametrize("name", list(SIZES), ids=str)
def test_named(name, weights):
    x = torch.empty(SIZES[name], dtype=torch.uint8)
"""
    )
    result = pytester.runpytest("--gpuflame-dir", "profiles")
    result.assert_outcomes(passed=4)
    assert "INTERNALERROR" not in result.stdout.str()
    folder = pytester.path / "profiles"
    bodies = sorted(load(p).totals()["peak_space"] for p in folder.glob("*.pb.gz") if ".fixtures." not in p.name)
    assert bodies == [MiB, 2 * MiB, 3 * MiB, 4 * MiB]
    assert [load(path).totals()["peak_space"] for path in folder.glob("*.fixtures.pb.gz")] == [5 * MiB] * 4
    assert (folder / "test_ids.py_test_named_plain.pb.gz").exists()  # a plain id keeps its plain name
    assert max(len(path.name) for path in folder.iterdir()) <= 255


def test_a_profile_that_cannot_be_written_is_a_warning_and_a_folder_that_cannot_be_made_one_line(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_over="""
import pytest, torch

@pytest.mark.limit_gpu_memory("1 MiB")
def test_over():
    x = torch.empty(4 << 20, dtype=torch.uint8)

def test_passes():
    x = torch.empty(1024)
"""
    )
    (pytester.path / "profiles" / "test_over.py_test_over.pb.gz").mkdir(parents=True)  # in the file's place
    result = pytester.runpytest("--gpuflame-dir", "profiles")
    result.assert_outcomes(failed=1, passed=1)  # the run goes on; the test's own outcome is kept
    out = result.stdout.str()
    assert "INTERNALERROR" not in out and "profile: not saved" in out
    assert "gpuflame: the profile of this test is not saved: profiles/test_over.py_test_over.pb.gz: cannot" in out
    assert load(pytester.path / "profiles" / "test_over.py_test_passes.pb.gz").totals()["peak_space"] == 4096
    (pytester.path / "a-file").write_text("")
    result = pytester.runpytest("--gpuflame-dir", "a-file/profiles")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--gpuflame-dir: cannot make a-file/profiles (Not a directory)" in result.stderr.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_a_limit_given_by_its_keyword_counts_and_a_negative_one_is_refused(pytester: pytest.Pytester) -> None:
    """The marker's help reads ``limit_gpu_memory(limit)``: ``limit="1 MiB"`` is that limit, not a usage error."""
    pytester.makepyfile(
        test_kw="""
import pytest, torch

@pytest.mark.limit_gpu_memory(limit="1 MiB")
def test_over_by_keyword():
    x = torch.empty(4 << 20, dtype=torch.uint8)

@pytest.mark.limit_gpu_leaks(limit="8 MiB")
def test_within_by_keyword():
    x = torch.empty(4 << 20, dtype=torch.uint8)

@pytest.mark.limit_gpu_memory(-5)
def test_negative():
    pass
"""
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=2, passed=1)
    out = result.stdout.str()
    assert "gpuflame: peak 4.00 MiB is over the limit of 1.00 MiB (limit_gpu_memory, 3,145,728 bytes over)" in out
    assert "gpuflame: @pytest.mark.limit_gpu_memory: not a size: '-5'" in out


def test_a_test_that_still_holds_memory_is_named_when_its_peak_is_too_small_for_the_table(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_held="""
import torch

CACHE = []

def test_big_and_freed():
    x = torch.empty(8 << 20, dtype=torch.uint8)

def test_leaks_into_a_cache():
    CACHE.append(torch.empty(1 << 20, dtype=torch.uint8))

def test_leaks_less():
    CACHE.append(torch.empty(1 << 10, dtype=torch.uint8))

def test_frees_everything():
    x = torch.empty(2 << 20, dtype=torch.uint8)

def test_fails_holding_its_locals():  # its traceback holds x when the recording stops: no leak
    x = torch.empty(4 << 20, dtype=torch.uint8)
    assert x.numel() == 0
"""
    )
    result = pytester.runpytest("--gpuflame", "--gpuflame-top", "1")
    result.assert_outcomes(passed=4, failed=1)
    out = result.stdout.str()
    assert list(table_rows(out)) == ["test_held.py::test_big_and_freed"]
    assert (
        "still held when the test returned, by tests not in the table: "
        "test_held.py::test_leaks_into_a_cache (1.00 MiB), test_held.py::test_leaks_less (1.00 KiB)\n"
    ) in out


def test_a_module_fixture_is_counted_at_the_first_test_that_uses_it_and_the_table_says_so(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_shared="""
import pytest, torch

@pytest.fixture(scope="module")
def model():
    return torch.empty(2 << 20, dtype=torch.uint8)

@pytest.fixture
def batch():
    return torch.empty(1 << 20, dtype=torch.uint8)

def test_first(model, tmp_path):
    x = torch.empty(3 << 20, dtype=torch.uint8)

def test_second(model, batch, tmp_path):
    x = torch.empty(4 << 20, dtype=torch.uint8)
"""
    )
    result = pytester.runpytest("--gpuflame")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    rows = table_rows(out)
    assert rows["test_shared.py::test_first"][2] == "2.00 MiB*"
    assert rows["test_shared.py::test_second"][2] == "1.00 MiB"  # its own batch; the model was set up before
    # pytest's own session fixture (tmp_path_factory, set up with the first tmp_path) is not named
    assert (
        "* includes fixtures set up once for all the tests that use them, counted at the first: model (module)\n" in out
    )


def test_top_zero_lists_every_test_as_durations_zero_does(pytester: pytest.Pytester) -> None:
    """``--durations=0`` is every test in pytest: ``--gpuflame-top 0`` listed one."""
    pytester.makepyfile(test_growth=GROWING.format(size="4 << 20"))
    result = pytester.runpytest("--gpuflame", "--gpuflame-top", "0")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert "gpuflame: 2 of 2 profiled tests, highest peak first" in out
    assert table_rows(out) == {
        "test_growth.py::test_grows": ["4.00 MiB", "0 B", "-", "allocate"],
        "test_growth.py::test_steady": ["1.00 MiB", "0 B", "-", "test_steady"],
    }


@pytest.mark.subprocess
def test_pytest_run_after_gpuflame_is_imported_gives_no_rewrite_warning(pytester: pytest.Pytester) -> None:
    """``gpuflame run -- pytest`` imports gpuflame before pytest loads the plugin's entry point."""
    import subprocess
    import sys

    pytester.makepyfile(test_plain="def test_nothing():\n    assert 1\n")
    code = "import gpuflame, pytest, sys; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider']))"
    done = subprocess.run([sys.executable, "-c", code], cwd=pytester.path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout and "cannot be rewritten" not in done.stdout + done.stderr


ROUNDED = """
import pytest, torch

KEPT = []

@pytest.mark.limit_gpu_memory({memory})
def test_peak():
    x = torch.empty(4_000_000, dtype=torch.uint8)

@pytest.mark.limit_gpu_leaks({leaks})
def test_keeps():
    KEPT.append(torch.empty(3_000_000, dtype=torch.uint8))
    KEPT.append(torch.empty(1_000_000, dtype=torch.uint8))
"""


def test_a_failure_says_the_limit_that_passes_and_the_bytes_where_sizes_read_alike(pytester: pytest.Pytester) -> None:
    """A limit copied from the printed peak (4,000,000 B reads 3.81 MiB) is below it: the message must say so."""
    pytester.makepyfile(test_rounded=ROUNDED.format(memory='"3.81 MiB"', leaks='"1 MiB"'))
    result = pytester.runpytest()
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    limit = round(3.81 * MiB)
    assert f"peak 3.81 MiB (4,000,000 bytes) is over the limit of 3.81 MiB ({limit:,} bytes)" in out
    assert "to pass: allocate less at the stacks above, or raise the limit to limit_gpu_memory(4000000) or more" in out
    assert "or raise the limit to limit_gpu_leaks(3000000) or more" in out
    # the limits it gives pass
    pytester.makepyfile(test_rounded=ROUNDED.format(memory="4000000", leaks="3000000"))
    pytester.runpytest().assert_outcomes(passed=2)


@pytest.mark.subprocess
def test_a_phase_not_recorded_reads_as_unknown_not_as_zero(pytester: pytest.Pytester) -> None:
    """A test (or its fixtures) that imports torch only inside is not recorded: its row must not say 0 B."""
    pytester.makeconftest(
        """
import pytest

@pytest.fixture
def model():
    import torch  # the framework's first import: this set-up is not recorded
    return torch.empty(1 << 20, dtype=torch.uint8)
"""
    )
    pytester.makepyfile(
        test_late="""
def test_a_imports_late():
    import torch
    x = torch.empty(2 << 20, dtype=torch.uint8)

def test_b_uses_model(model):
    import torch
    y = torch.empty(3 << 20, dtype=torch.uint8)
"""
    )
    late = pytester.runpytest_subprocess("--gpuflame", "-k", "imports_late")  # a new process each: torch not imported
    late.assert_outcomes(passed=1, warnings=1)
    assert table_rows(late.stdout.str())["test_late.py::test_a_imports_late"] == ["?", "?", "-", "?"]
    assert "? not recorded for 1 test (see warnings): test_late.py::test_a_imports_late" in late.stdout.str()
    fixture = pytester.runpytest_subprocess("--gpuflame", "-k", "model")
    fixture.assert_outcomes(passed=1, warnings=1)
    out = fixture.stdout.str()
    assert table_rows(out)["test_late.py::test_b_uses_model"] == ["3.00 MiB", "0 B", "?", "test_b_uses_model"]
    assert "gpuflame: nothing recorded for this test's fixtures: torch or jax was not imported" in out
    assert "? not recorded for 1 test (see warnings): test_late.py::test_b_uses_model" in out


def test_a_run_that_profiles_no_test_prints_no_empty_table(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_growth=GROWING.format(size="4 << 20"))
    collected = pytester.runpytest("--gpuflame", "--collect-only")
    assert collected.ret == pytest.ExitCode.OK and "gpuflame:" not in collected.stdout.str()
    none = pytester.runpytest("--gpuflame", "-k", "no_such_test")
    assert none.ret == pytest.ExitCode.NO_TESTS_COLLECTED  # pytest's own exit code, unchanged
    out = none.stdout.str()
    assert re.search(r"=+ gpuflame: no test was profiled =+", out) and "top function at the peak" not in out


def test_an_indirect_parameters_fixture_is_recorded_in_the_fixtures_column(pytester: pytest.Pytester) -> None:
    """``parametrize(..., indirect=True)`` runs the fixture of that name: its bytes are the set-up's, not lost."""
    pytester.makepyfile(
        test_indirect="""
import pytest, torch

@pytest.fixture
def weights(request):
    return torch.empty(request.param, dtype=torch.uint8)

@pytest.mark.parametrize("weights", [1 << 20, 2 << 20], indirect=True)
def test_indirect(weights):
    y = torch.empty(3 << 20, dtype=torch.uint8)

@pytest.mark.parametrize("n", [1 << 20])
def test_direct(n):
    y = torch.empty(n, dtype=torch.uint8)
"""
    )
    result = pytester.runpytest("--gpuflame")
    result.assert_outcomes(passed=3)
    rows = table_rows(result.stdout.str())
    assert rows["test_indirect.py::test_indirect[1048576]"][:3] == ["3.00 MiB", "0 B", "1.00 MiB"]
    assert rows["test_indirect.py::test_indirect[2097152]"][:3] == ["3.00 MiB", "0 B", "2.00 MiB"]
    assert rows["test_indirect.py::test_direct[1048576]"][:3] == ["1.00 MiB", "0 B", "-"]  # no set-up to record


def test_setup_module_and_set_up_class_are_named_where_they_are_counted(pytester: pytest.Pytester) -> None:
    """pytest runs them through fixtures of its own; they are the suite's set-up, shared as a module fixture is."""
    pytester.makepyfile(
        test_xunit="""
import unittest, torch

HELD = {}

def setup_module(module):
    HELD["data"] = torch.empty(1 << 20, dtype=torch.uint8)

class TestShared(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = torch.empty(2 << 20, dtype=torch.uint8)

    def test_one(self):
        y = torch.empty(3 << 20, dtype=torch.uint8)

    def test_two(self):
        y = torch.empty(3 << 20, dtype=torch.uint8)
"""
    )
    result = pytester.runpytest("--gpuflame")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    rows = table_rows(out)
    assert rows["test_xunit.py::TestShared::test_one"][2] == "3.00 MiB*"  # setup_module's 1 MiB and setUpClass's 2
    assert rows["test_xunit.py::TestShared::test_two"][2] == "0 B"
    said = "counted at the first: TestShared.setUpClass (class), test_xunit.setup_module (module)\n"
    assert said in out


def test_a_test_that_fails_on_its_own_still_says_it_is_over_its_budget(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_both="""
import pytest, torch

@pytest.mark.limit_gpu_memory("1 MiB")
def test_fails_and_is_over():
    x = torch.empty(4 << 20, dtype=torch.uint8)
    assert x.numel() == 0
"""
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "assert 4194304 == 0" in out  # its own failure first, as pytest shows it
    assert re.search(r"-+ gpuflame -+\ngpuflame: peak 4\.00 MiB is over the limit of 1\.00 MiB", out), out


def test_a_unittest_tests_stacks_start_at_its_own_methods(pytester: pytest.Pytester) -> None:
    """pytest runs a TestCase through unittest's TestCase.run: those frames say nothing, as pytest's own do not."""
    pytester.makepyfile(
        test_unit="""
import unittest, pytest, torch

class TestBudget(unittest.TestCase):
    def setUp(self):
        self.weights = torch.empty(1 << 20, dtype=torch.uint8)

    @pytest.mark.limit_gpu_memory("1 MiB")
    def test_over(self):
        y = torch.empty(3 << 20, dtype=torch.uint8)
"""
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert re.search(r"3\.00 MiB \( 75\.0%\)  TestBudget > test_over  \(test_unit\.py:9\)\n", out), out
    assert re.search(r"1\.00 MiB \( 25\.0%\)  TestBudget > setUp  \(test_unit\.py:5\)\n", out), out
    assert "TestCase > " not in out
