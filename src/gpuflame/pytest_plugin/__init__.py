"""The pytest plugin: GPU memory per test, budgets that fail a test, and a report.

Registered through the ``pytest11`` entry point and off unless asked:
``--gpuflame`` (or ``--gpuflame-dir``, ``--gpuflame-fail-on-increase``)
profiles every test; the markers ``limit_gpu_memory`` and ``limit_gpu_leaks``
profile the tests that carry them. The test body and its fixtures' set-up are
recorded separately (``gpuflame.start``/``stop`` around each), so a budget is
the body's and a model loaded by a fixture does not count against it. A
phase's profile is built only where it is read (a check that fails, a kept
profile, a peak that may reach the table); the others' peaks come from the
recorder's totals where it has them (:meth:`GpuflamePlugin._wants_profile`).

Results travel on the test reports (``report.gpuflame``), which pytest-xdist
sends from its workers to the controller: the summary table and the stored
peaks are the whole run's, however it was split.

Only pytest is imported here until a test is to be profiled.
"""

from __future__ import annotations

import bisect
import hashlib
import re
import shutil
import sys
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

MARKERS = {
    "limit_gpu_memory": "limit_gpu_memory(limit): fail when the test body's peak GPU memory is over limit "
    '("2 GiB", "512MiB", or bytes); gpuflame names the top stacks at the peak',
    "limit_gpu_leaks": "limit_gpu_leaks(limit): fail when a stack still holds more than limit, allocated "
    "during the test body, when the test returns; gpuflame lists those stacks",
}
CACHE_KEY = "gpuflame/peaks"  # test id -> peak of the test body in the last run (pytest's cache)
PROFILES_CACHE_DIR = "gpuflame"  # failing tests' profiles, in pytest's cache, without --gpuflame-dir
DEFAULT_TOLERANCE = "5%"
NAME_CHARS = 200  # a profile's file name before .fixtures.pb.gz: 255 bytes is the usual bound, the temporary adds 15
BODY = pytest.StashKey[Any]()
FIXTURES = pytest.StashKey[Any]()
SHARED = pytest.StashKey[list[str]]()  # fixtures of a wider scope set up in a test's set-up: "block (module)"
PYTEST_FIXTURES = ("_pytest.", "xdist.")  # the fixtures pytest and xdist define (tmp_path_factory, worker_id)
# pytest's fixtures that run the suite's own set-up: setup_module, setup_class, unittest's setUpClass
XUNIT = re.compile(r"_(?:xunit|unittest)_(setup_module|setup_class|setUpClass)_fixture_(.+)")


def pytest_addoption(parser: pytest.Parser) -> None:
    from gpuflame.boundary.backends import AUTO, BACKENDS, spoken

    group = parser.getgroup("gpuflame", "GPU memory per test (gpuflame)")
    group.addoption(
        "--gpuflame",
        action="store_true",
        help="profile every test's GPU memory (body and fixtures separately); "
        "print the tests with the highest peak at the end",
    )
    group.addoption(
        "--gpuflame-dir",
        metavar="DIR",
        help="keep each test's profile in DIR (TEST.pb.gz, TEST.fixtures.pb.gz); implies --gpuflame",
    )
    group.addoption(
        "--gpuflame-fail-on-increase",
        action="store_true",
        help="fail a test whose peak grew since the last --gpuflame run by more than the "
        "tolerance (peaks are kept in pytest's cache); implies --gpuflame",
    )
    group.addoption(
        "--gpuflame-tolerance",
        default=DEFAULT_TOLERANCE,
        metavar="T",
        help="growth allowed by --gpuflame-fail-on-increase: a share (5%%) or bytes (1MiB); default 5%%",
    )
    group.addoption(
        "--gpuflame-backend",
        default=AUTO,
        metavar="NAME",
        help=f"{AUTO} (default), {spoken(BACKENDS[1:])}, as gpuflame run --backend",
    )
    group.addoption(
        "--gpuflame-categories",
        action="store_true",
        help="class each test's memory by what it is (parameter, gradient, optimizer_state, ...) "
        "from the object graph: a walk of every object per test, tens of ms each; "
        "without it they come from the allocating stacks and each optimizer.step()",
    )
    group.addoption(
        "--gpuflame-top",
        type=int,
        default=10,
        metavar="N",
        help="tests listed in the summary table (default 10; 0 lists every test, as --durations=0)",
    )


def pytest_configure(config: pytest.Config) -> None:
    for text in MARKERS.values():
        config.addinivalue_line("markers", text)
    config.pluginmanager.register(GpuflamePlugin(config), "gpuflame-plugin")


def baseline_note(has_cache: bool, without_baseline: list[str], not_kept: Collection[str] = ()) -> str | None:
    """What ``--gpuflame-fail-on-increase`` could not compare: a check with no baseline must not read as passed."""
    if not has_cache:
        return (
            "gpuflame: --gpuflame-fail-on-increase compared nothing: pytest's cache is off "
            "(-p no:cacheprovider), so no earlier peak was read and none is kept"
        )
    if not without_baseline:
        return None
    count = len(without_baseline)
    note = (
        f"gpuflame: --gpuflame-fail-on-increase: {count} test{'s' if count != 1 else ''} had no peak "
        "from an earlier run to compare with; this run's peaks are kept for the next"
    )
    unkept = [nodeid for nodeid in without_baseline if nodeid in not_kept]
    if unkept:  # a failing test's peak is not stored: it would not be checked next time either
        from gpuflame.pytest_plugin.table import first_names

        note += f", but not those of the {len(unkept)} that failed (a peak is kept once its test passes): "
        note += first_names(unkept)
    return note


def _baseline(stored: object) -> dict[str, int]:
    """The cached peaks that are peaks: pytest's cache is a file, damaged or edited by hand ('["a"]' was an
    INTERNALERROR, a peak of '"big"' or 1e999 failed the test with a TypeError); anything else has no baseline."""
    if not isinstance(stored, dict):
        return {}
    return {k: v for k, v in stored.items() if isinstance(k, str) and type(v) is int and 0 <= v < 1 << 63}


def _tolerance(text: str) -> Any:
    from gpuflame.pytest_plugin.budget import Tolerance  # only now: a run that never profiles imports nothing

    try:
        return Tolerance.parse(text)
    except ValueError as exc:
        raise pytest.UsageError(f"--gpuflame-tolerance: {exc}") from None


def _top(count: int) -> int:
    """The table's rows: 0 is every test, as pytest's ``--durations=0``; a negative count is refused."""
    if count < 0:
        raise pytest.UsageError(f"--gpuflame-top must be 0 (every test) or more, not {count}")
    return count or sys.maxsize


def _check_backend(name: str) -> None:
    from gpuflame.boundary.backends import BACKENDS

    if name not in BACKENDS:
        raise pytest.UsageError(f"--gpuflame-backend must be one of {', '.join(BACKENDS)}, not {name!r}")


def _profiles_folder(name: str) -> Path:
    """``--gpuflame-dir``, made now: a folder that cannot be made is one line before any test runs."""
    folder = Path(name)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise pytest.UsageError(f"--gpuflame-dir: cannot make {name} ({exc.strerror or exc})") from None
    return folder


def _fixtures(item: pytest.Item) -> set[str]:
    """The fixtures whose set-up runs for *item*: not ``request``, not the values of a direct ``parametrize``.

    An indirect one (``indirect=True``) names a fixture that runs with the value: its set-up is
    recorded. pytest gives a direct value a stand-in fixture, which returns ``request.param``.
    """
    callspec = getattr(item, "callspec", None)
    params = set(callspec.params) if callspec is not None else set()
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    direct = {name for name in params if all(_stand_in(d) for d in defs.get(name, ()))}
    return set(getattr(item, "fixturenames", ())) - {"request"} - direct


def _stand_in(fixturedef: Any) -> bool:
    """Whether *fixturedef* is pytest's stand-in for a direct parameter's value, not a fixture of the suite."""
    return getattr(fixturedef.func, "__name__", "") == "get_direct_param_fixture_func"


def _shared_name(fixturedef: pytest.FixtureDef[Any]) -> str | None:
    """How the table names a fixture of wider scope: ``model (module)``, ``TestX.setUpClass (class)``;
    None for pytest's and xdist's own (``tmp_path_factory``), which are no part of the suite."""
    xunit = XUNIT.fullmatch(fixturedef.argname)
    if xunit:
        return f"{xunit.group(2)}.{xunit.group(1)} ({fixturedef.scope})"
    if (getattr(fixturedef.func, "__module__", "") or "").startswith(PYTEST_FIXTURES):
        return None
    return f"{fixturedef.argname} ({fixturedef.scope})"


def profile_name(nodeid: str) -> str:
    """A test's profile file name, one per test: ``tests_test_x.py_test_y_8`` for ``tests/test_x.py::test_y[8]``.

    A parameter id that the name cannot keep as it is (``data/a.csv``, next to a
    ``data_a.csv``), or a name too long for the file system, gets a hash of the
    whole id: each test its own file, the same name in every run and xdist worker.
    """
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")
    _, bracket, param = nodeid.partition("[")
    if (not bracket or re.fullmatch(r"[A-Za-z0-9_.-]*\]", param)) and len(name) <= NAME_CHARS:
        return name
    digest = hashlib.sha256(nodeid.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return f"{name[: NAME_CHARS - len(digest) - 1]}-{digest}"


def _kept(result: dict[str, Any]) -> bool:
    """Whether a test's peak is stored for the next run: a test that failed (over budget, grown, broken)
    keeps its previous one, so that a regression fails again until it is fixed or the cache is cleared."""
    return bool(result["passed"]) and not result["error"]


class GpuflamePlugin:
    """The run's options, the stored peaks, and every profiled test's numbers."""

    def __init__(self, config: pytest.Config) -> None:
        option = config.option
        self.config = config
        self.dir = _profiles_folder(option.gpuflame_dir) if option.gpuflame_dir else None
        self._fallback: Path | None = None  # where a failing check's profile goes without pytest's cache
        self.fail_on_increase = option.gpuflame_fail_on_increase
        self.everything = bool(option.gpuflame or self.dir or self.fail_on_increase)
        self.top = _top(option.gpuflame_top)
        self.backend = option.gpuflame_backend
        given = option.gpuflame_tolerance != DEFAULT_TOLERANCE
        self.tolerance = _tolerance(option.gpuflame_tolerance) if given or self.fail_on_increase else None
        if self.backend != "auto":
            _check_backend(self.backend)
        self.worker = hasattr(config, "workerinput")  # a pytest-xdist worker: the controller reports
        cache = getattr(config, "cache", None)
        self.baseline = _baseline(cache.get(CACHE_KEY, {})) if cache and self.everything else {}
        self.has_cache = cache is not None
        self.results: dict[str, dict[str, Any]] = {}
        self._scratch: Path | None = None
        self.walk = bool(option.gpuflame_categories)  # the object graph walked, for a profile that is kept
        self._frozen = False  # the objects there were at the first walk, frozen (categories.freeze_for_walks)
        self._leaders: list[tuple[int, str]] = []  # (-peak, test id) of this process's highest peaks so far
        self._setting_up: pytest.Item | None = None  # the test whose fixtures' set-up is being recorded

    # -- recording ----------------------------------------------------------------

    def wanted(self, item: pytest.Item) -> bool:
        return self.everything or any(item.get_closest_marker(name) for name in MARKERS)

    def _recorder(self) -> Any:
        from gpuflame.pytest_plugin.record import PhaseRecorder, scratch_folder

        if self._scratch is None:  # the first profiled phase: what is paid once per session
            self._scratch = scratch_folder()
        return PhaseRecorder(self._scratch, self.backend)

    def _wants_profile(self, item: pytest.Item, key: Any, peak: int | None) -> bool:
        """Whether this phase's profile is built: kept or read by a check, or its top function may be shown.

        A profile is kept (--gpuflame-dir) or read by a failing check: built as asked, categories
        from the object graph with --gpuflame-categories. A body among this process's highest
        peaks so far may reach the table, which names its top function: built, without the walk
        (categories are not shown there). Any other phase's numbers are all that is read of it.
        *peak* None: the recorder cannot say it without the profile, which is built and may be kept.
        """
        from gpuflame.capture.books import categories

        kept = peak is None or self.dir is not None or (key is BODY and self._checked(item, peak))
        categories.set_graph_walk(self.walk and kept)  # before the recorder stops: it may walk then
        if self.walk and kept and not self._frozen:  # each later walk reads what was made since, not torch's
            self._frozen = True
            categories.freeze_for_walks()
        return kept or (key is BODY and peak is not None and self._leads(item.nodeid, peak))

    def _checked(self, item: pytest.Item, peak: int) -> bool:
        """Whether a check reads this body's profile: a marker's, or a peak grown past the tolerance."""
        return any(item.get_closest_marker(name) for name in MARKERS) or self._grown_from(item.nodeid, peak) is not None

    def _grown_from(self, nodeid: str, peak: int) -> int | None:
        """The stored peak this one grew from past the tolerance (--gpuflame-fail-on-increase); None if it did not."""
        before, tolerance = self.baseline.get(nodeid), self.tolerance  # set with fail_on_increase
        if not self.fail_on_increase or before is None or tolerance is None or tolerance.allows(before, peak):
            return None
        return before

    def _leads(self, nodeid: str, peak: int) -> bool:
        """Whether this body is among the highest peaks of this process so far, as the table ranks them.

        The run's table (on the controller under xdist) shows the highest of all; each was among
        the highest of its own process when it ran.
        """
        entry, leaders = (-peak, nodeid), self._leaders
        if len(leaders) >= self.top and entry >= leaders[-1]:
            return False
        bisect.insort(leaders, entry)
        del leaders[self.top :]
        return True

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Any:
        if self.wanted(item) and _fixtures(item):
            self._setting_up = item
            try:
                yield from self._recording(item, FIXTURES)
            finally:
                self._setting_up = None
        else:
            yield

    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any]) -> None:
        """A fixture of module, class, package or session scope set up now: counted in this test's set-up
        alone, once for every test that shares it; the table says so. Called only when it is set up, not reused."""
        item = self._setting_up
        name = _shared_name(fixturedef) if item is not None and fixturedef.scope != "function" else None
        if item is not None and name is not None:
            item.stash.setdefault(SHARED, []).append(name)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        if self.wanted(item):
            yield from self._recording(item, BODY)
        else:
            yield

    def _recording(self, item: pytest.Item, key: Any) -> Any:
        """One phase (fixtures' set-up, or the body) under its own recorder; its numbers go to *key*."""
        recorder = self._recorder()
        recorder.start()
        try:
            yield
        finally:
            phase = recorder.stop(lambda peak: self._wants_profile(item, key, peak))
            item.stash[key] = (phase, recorder.error)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        outcome = yield
        if call.when != "call" or BODY not in item.stash:
            return
        report = outcome.get_result()
        body, error = item.stash[BODY]
        fixtures, fixtures_error = item.stash.get(FIXTURES, (None, ""))
        shared = item.stash.get(SHARED, []) if fixtures and fixtures.peak else []
        del item.stash[BODY]  # the profiles are written now or never: an item lives as long as the run
        for key in (FIXTURES, SHARED):
            if key in item.stash:
                del item.stash[key]
        if error:
            item.warn(pytest.PytestWarning(f"gpuflame: nothing recorded for this test: {error}"))
        if fixtures_error and fixtures_error != error:  # one warning where both phases failed alike
            item.warn(pytest.PytestWarning(f"gpuflame: nothing recorded for this test's fixtures: {fixtures_error}"))
        failures = self._check(item, body, fixtures)
        report.gpuflame = {
            "body": body.to_dict(),
            "fixtures": fixtures.to_dict() if fixtures else None,
            "error": error,
            "fixtures_error": fixtures_error,
            "grew": bool(failures.get("grew")),
            "shared": shared,
        }
        if failures and report.passed:
            report.outcome = "failed"
            report.longrepr = "\n\n".join(failures.values())
        elif failures and report.failed:  # failed on its own too: the budget's message beside its traceback
            report.sections.append(("gpuflame", "\n\n".join(failures.values())))

    def _check(self, item: pytest.Item, body: Any, fixtures: Any) -> dict[str, str]:
        """The failure messages of this test, by check; saves the profiles asked for or needed."""
        from gpuflame.pytest_plugin import budget

        failed: dict[str, Any] = {}  # check -> message, given where the profile was saved
        try:
            limits = {
                m: budget.limit_of(marker.args, m, marker.kwargs)
                for m in MARKERS
                if (marker := item.get_closest_marker(m))
            }
        except ValueError as exc:
            return {"marker": f"gpuflame: {exc}"}
        if body.profile is not None:
            profile, peak = body.profile, body.peak
            if "limit_gpu_memory" in limits and peak > limits["limit_gpu_memory"]:
                failed["memory"] = lambda saved: budget.over_limit(profile, peak, limits["limit_gpu_memory"], saved)
            if "limit_gpu_leaks" in limits and (stacks := budget.leaks(profile, limits["limit_gpu_leaks"])):
                failed["leaks"] = lambda saved: budget.leaking(stacks, limits["limit_gpu_leaks"], saved)
            before, tolerance = self._grown_from(item.nodeid, peak), self.tolerance
            if before is not None and tolerance is not None:
                failed["grew"] = lambda saved: budget.grew(profile, before, peak, tolerance, saved)
        saved = self._save(item, body, fixtures, keep=bool(failed))
        return {name: make(saved) for name, make in failed.items()}

    def _save(self, item: pytest.Item, body: Any, fixtures: Any, keep: bool) -> str:
        """Where the body's profile was written: --gpuflame-dir, else pytest's cache for a check that fails.

        A profile that cannot be written (a full disk, a folder made read-only) is a warning, not the run's end.
        """
        from gpuflame.errors import GpuflameError

        try:
            return self._write(item.nodeid, body, fixtures, keep)
        except (GpuflameError, OSError) as exc:
            item.warn(pytest.PytestWarning(f"gpuflame: the profile of this test is not saved: {exc}"))
            return ""

    def _write(self, nodeid: str, body: Any, fixtures: Any, keep: bool) -> str:
        from gpuflame.formats import save

        folder = self.dir
        if folder is None and keep and body.profile is not None:
            cache = getattr(self.config, "cache", None)
            folder = cache.mkdir(PROFILES_CACHE_DIR) if cache else self._private_folder()
        if folder is None or body.profile is None:
            return ""
        folder.mkdir(parents=True, exist_ok=True)
        name = profile_name(nodeid)
        path = folder / f"{name}.pb.gz"
        save(body.profile, path)
        if fixtures is not None and fixtures.profile is not None and self.dir is not None:
            save(fixtures.profile, folder / f"{name}.fixtures.pb.gz")
        return str(path)

    def _private_folder(self) -> Path:
        """Without pytest's cache: a new 0700 folder of this session in the temporary folder.

        A fixed name there (``/tmp/gpuflame-pytest``) could be made first by another user.
        """
        if self._fallback is None:
            self._fallback = Path(tempfile.mkdtemp(prefix="gpuflame-pytest-profiles-"))
        return self._fallback

    # -- the whole run (on the controller under xdist) ------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = getattr(report, "gpuflame", None)
        if report.when == "call" and data is not None:
            self.results[report.nodeid] = {**data, "passed": report.passed}

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.worker or not self.everything or self.config.option.collectonly:
            return
        from gpuflame.pytest_plugin.table import summary_lines

        if self.results:
            title, lines = summary_lines(self.results, self.top, self.dir)
            terminalreporter.write_sep("=", title)
            for line in lines:
                terminalreporter.write_line(line)
        else:  # every test deselected or skipped: no empty table
            terminalreporter.write_sep("=", "gpuflame: no test was profiled")
        if self.fail_on_increase:
            without = [nodeid for nodeid in self.results if nodeid not in self.baseline]
            note = baseline_note(self.has_cache, without, {n for n, r in self.results.items() if not _kept(r)})
            if note:
                terminalreporter.write_line(note, yellow=True)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            from gpuflame.capture.books import categories

            categories.set_graph_walk(True)  # the process's own default again (pytester runs in-process)
            categories.thaw_walks()
        cache = getattr(self.config, "cache", None)
        if self.worker or not self.everything or cache is None:
            return
        peaks = _baseline(cache.get(CACHE_KEY, {}))  # a damaged entry is dropped as it is rewritten
        peaks.update({nodeid: r["body"]["peak"] for nodeid, r in self.results.items() if _kept(r)})
        cache.set(CACHE_KEY, peaks)
