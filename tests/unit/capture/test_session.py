"""The session of one profiled process: writing, failures, signals, post-import hooks.

The recorders here are small stand-ins written for these tests, so the
session's own logic (what it writes, when, and what it does when a recorder
or the disk fails) is checked apart from any backend; the backends have
their own tests against real torch and JAX.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuflame.boundary.settings import Settings
from gpuflame.capture import post_import
from gpuflame.capture.post_import import when_imported
from gpuflame.capture.session import Session
from gpuflame.formats import load
from gpuflame.model import Profile
from tests.helpers.paths import REPO
from tests.helpers.standin_recorder import StandInRecorder


def session(tmp_path: Path, **kw: object) -> Session:
    return Session(Settings(session_dir=str(tmp_path), **kw))  # type: ignore[arg-type]


def test_finish_writes_the_profile_with_the_pid_label_once(tmp_path: Path) -> None:
    s = session(tmp_path)
    rec = StandInRecorder()
    s.add(rec)
    s.finish()
    s.finish()
    p = load(s.path)
    assert p.totals()["peak_space"] == 4096
    assert p.label_values("pid") == [str(os.getpid())]
    assert rec.stopped
    assert not s.lost


def test_finish_stops_a_recorder_that_hands_its_books_over_before_the_final_profile(tmp_path: Path) -> None:
    """The CPU hook's recorder (final_after_stop) is stopped first, then snapshotted: its history is handed
    over instead of copied; the others are snapshotted while they still record, then stopped, as before."""
    order: list[str] = []

    class Told(StandInRecorder):
        def __init__(self, name: str, first: bool) -> None:
            super().__init__()
            self.name, self.final_after_stop = name, first

        def stop(self) -> None:
            order.append(f"stop {self.name}")

        def snapshot(self) -> Profile:
            order.append(f"snapshot {self.name}")
            return super().snapshot()

    s = session(tmp_path)
    s.add(Told("hook", True))
    s.add(Told("other", False))
    s.finish()
    assert order == ["stop hook", "snapshot hook", "snapshot other", "stop other"]
    assert load(s.path).totals()["peak_space"] == 2 * 4096


@pytest.mark.parametrize("step", ["start", "snapshot", "stop"])
def test_a_failing_recorder_is_reported_once_and_never_raises(tmp_path: Path, step: str, capsys) -> None:
    s = session(tmp_path)
    s.add(StandInRecorder(fail_on=step))
    s.write()
    s.finish()
    err = capsys.readouterr().err
    assert err.count("gpuflame:") == 1 and f"boom at {step}" in err
    notes = (tmp_path / f"lost-{os.getpid()}.txt").read_text()
    assert f"boom at {step}" in notes


def test_an_unwritable_folder_loses_the_profile_but_not_the_program(tmp_path: Path, capsys) -> None:
    s = Session(Settings(session_dir=str(tmp_path / "missing" / "dir")))
    s.add(StandInRecorder())
    assert s.write() is False
    assert "profile is lost" in capsys.readouterr().err


def test_a_full_disk_is_reported(tmp_path: Path, capsys) -> None:
    def full(profile: Profile, path: Path) -> None:
        raise OSError(28, "No space left on device")

    s = Session(Settings(session_dir=str(tmp_path)), write=full)
    s.add(StandInRecorder())
    s.finish()
    assert "No space left on device" in capsys.readouterr().err


def test_when_imported_runs_after_the_module_body(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "gpuflame_probe_mod.py").write_text("VALUE = 41\nVALUE += 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("gpuflame_probe_mod", lambda m: seen.append(m.VALUE))
    assert seen == []
    import gpuflame_probe_mod  # noqa: F401

    assert seen == [42]
    when_imported("gpuflame_probe_mod", lambda m: seen.append("again"))
    assert seen == [42, "again"]  # already imported: called at once


def test_a_watch_set_after_meta_path_was_restored_still_fires(tmp_path: Path, monkeypatch) -> None:
    """pytester (the pytest plugin's tests) restores ``sys.meta_path``, dropping the finder."""
    (tmp_path / "gpuflame_probe_mod3.py").write_text("VALUE = 3\n")
    (tmp_path / "gpuflame_probe_mod4.py").write_text("VALUE = 4\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("gpuflame_probe_mod3", lambda m: seen.append(m.VALUE))
    import gpuflame_probe_mod3  # noqa: F401  (the finder is on sys.meta_path; no watch is left waiting)

    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if type(f).__name__ != "_PostImportFinder"])
    when_imported("gpuflame_probe_mod4", lambda m: seen.append(m.VALUE))
    import gpuflame_probe_mod4  # noqa: F401

    assert seen == [3, 4]


def test_a_module_imported_while_the_finder_was_off_is_reported_at_rearm(tmp_path: Path, monkeypatch) -> None:
    """A watch set, then the finder taken off before the import: nothing fires until ``rearm``, then once."""
    (tmp_path / "gpuflame_probe_mod5.py").write_text("VALUE = 5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("gpuflame_probe_mod5", lambda m: seen.append(m.VALUE))
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if type(f).__name__ != "_PostImportFinder"])
    import gpuflame_probe_mod5  # noqa: F401

    assert seen == []
    post_import.rearm()
    post_import.rearm()
    assert seen == [5]
    assert any(type(f).__name__ == "_PostImportFinder" for f in sys.meta_path)  # back for the watches still waiting


def test_a_failing_callback_does_not_break_the_import(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "gpuflame_probe_mod2.py").write_text("OK = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def bad(_m: object) -> None:
        raise RuntimeError("callback failed")

    when_imported("gpuflame_probe_mod2", bad)
    import gpuflame_probe_mod2

    assert gpuflame_probe_mod2.OK
    assert "callback failed" in capsys.readouterr().err


def test_settings_round_trip_through_the_environment() -> None:
    s = Settings(session_dir="/x", backend="jax", interval=2.5, follow=False, native=True, root_pid=7)
    assert Settings.from_env(s.to_env()) == s
    assert Settings.from_env({"GPUFLAME_INTERVAL": "soon", "GPUFLAME_BACKEND": "bogus"}) == Settings()


def test_profiling_is_switched_on_by_its_own_flag_not_by_the_folder() -> None:
    on = Settings(enabled=True, session_dir="/x")
    assert Settings.from_env(on.to_env()).enabled and on.to_env()["GPUFLAME_ENABLED"] == "1"
    assert not Settings.from_env({**on.to_env(), "GPUFLAME_ENABLED": "0"}).enabled  # a folder alone is not a switch
    assert Settings.from_env({"GPUFLAME_ENABLED": "1"}).enabled
    assert not Settings.from_env({}).enabled
    # a pod injected by a webhook that sets only the folder (before the switch) is still profiled
    assert Settings.from_env({"GPUFLAME_SESSION_DIR": "/gpuflame/sessions/main"}).enabled


@pytest.mark.subprocess
def test_sigterm_writes_the_profile_and_the_process_still_dies_of_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "victim.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from tests.helpers.standin_recorder import StandInRecorder
        from gpuflame.capture.session import Session
        from gpuflame.boundary.settings import Settings
        s = Session(Settings(session_dir={str(tmp_path)!r}))
        s.install_exit_hooks()
        s.add(StandInRecorder())
        print("ready", flush=True)
        time.sleep(30)
    """)
    )
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=20) == -signal.SIGTERM
    assert load(tmp_path / f"proc-{child.pid}.pb.gz").totals()["inuse_space"] == 1024


HELD_SCRIPT = """
import os, signal, sys, threading, time
sys.path.insert(0, {tests!r})
from tests.helpers.standin_recorder import StandInRecorder
from gpuflame.capture.session import Session, _save
from gpuflame.boundary.settings import Settings

sleeper = threading.Thread(target=time.sleep, args=(30,), daemon=True)
sleeper.start()

def slow_write(profile, path):
    # the signal arrives in the middle of the exit write, as a pool's terminate() sends it
    target = threading.main_thread().ident if {to_main!r} else sleeper.ident
    signal.pthread_kill(target, signal.{signal})
    time.sleep(0.1)
    _save(profile, path)
    print("written", flush=True)

s = Session(Settings(session_dir={folder!r}), write=slow_write)
s.install_exit_hooks()
s.add(StandInRecorder())
print("ending", flush=True)
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("to_main", [True, False], ids=["to-main-thread", "to-another-thread"])
def test_a_sigterm_during_the_exit_write_waits_for_the_file_then_kills(tmp_path: Path, to_main: bool) -> None:
    script = tmp_path / "ending.py"
    script.write_text(HELD_SCRIPT.format(tests=str(REPO), to_main=to_main, signal="SIGTERM", folder=str(tmp_path)))
    child = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGTERM, child.stderr  # the status the signal makes
    assert child.stdout == "ending\nwritten\n"
    (written,) = tmp_path.glob("proc-*.pb.gz")
    assert load(written).totals()["inuse_space"] == 1024
    assert not list(tmp_path.glob("started-*"))  # the process ended its roll call: nothing lost
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_roll_call_names_recording_processes_until_their_final_write(tmp_path: Path) -> None:
    s = session(tmp_path)
    assert not list(tmp_path.glob("started-*"))  # nothing recorded yet: nothing to lose
    s.add(StandInRecorder())
    assert [p.name for p in tmp_path.glob("started-*")] == [f"started-{os.getpid()}"]
    s.finish()
    assert not list(tmp_path.glob("started-*"))
    assert (tmp_path / f"proc-{os.getpid()}.pb.gz").exists()


@pytest.mark.subprocess
def test_a_fork_resets_each_torch_recorder_once_and_registers_the_child(tmp_path: Path) -> None:
    """The recorder modules hook the fork themselves; the session must not do it a second time."""
    torch = pytest.importorskip("torch")
    from gpuflame.capture.autostart import watch

    s = session(tmp_path, backend="torch", torch_hook="dispatch")
    s.install_exit_hooks()
    watch(s, "torch")
    (recorder,) = s.recorders
    calls = []
    real = recorder.after_fork
    recorder.after_fork = lambda: (calls.append(1), real())  # type: ignore[method-assign]
    read, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        os.write(write_end, str(len(calls)).encode())
        os._exit(0)
    os.close(write_end)
    in_child = os.read(read, 10).decode()
    os.waitpid(pid, 0)
    s.finish()
    assert in_child == "1"
    # the child registered itself and, leaving by os._exit, never wrote: the launcher can tell
    assert (tmp_path / f"started-{pid}").exists() and not (tmp_path / f"proc-{pid}.pb.gz").exists()
    del torch


@pytest.mark.subprocess
def test_a_program_that_ignores_sigterm_keeps_being_recorded(tmp_path: Path) -> None:
    """SIGTERM set to SIG_IGN before gpuflame started: a snapshot is written, the session goes on."""
    script = tmp_path / "stubborn.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        from tests.helpers.standin_recorder import StandInRecorder
        from gpuflame.capture.session import Session
        from gpuflame.boundary.settings import Settings
        s = Session(Settings(session_dir={str(tmp_path)!r}))
        s.install_exit_hooks()
        s.add(StandInRecorder())
        signal.raise_signal(signal.SIGTERM)
        print("snapshot", os.path.exists(s.path), "finished", s.finished, flush=True)
    """)
    )
    child = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    assert child.stdout == "snapshot True finished False\n"
    assert not list(tmp_path.glob("started-*"))  # and the final write came at exit


def test_finish_without_writing_keeps_the_profile_and_writes_no_file(tmp_path: Path) -> None:
    s = session(tmp_path)
    s.add(StandInRecorder())
    s.report("a note of what was lost", say=False)
    s.finish(write=False)
    assert not s.path.exists()
    assert s.result is not None and s.result.totals()["peak_space"] == 4096
    assert s.result.label_values("pid") == [str(os.getpid())]  # the stand-in has no pid label: merged in
    assert any("a note of what was lost" in c for c in s.result.comments)


@pytest.mark.slow
def test_a_profile_that_has_the_pid_already_is_the_one_a_merge_would_give(tmp_path: Path) -> None:
    """The torch recorder labels its samples and timeline with the pid: taken as is, equal to merging it."""
    import torch

    from gpuflame.capture import recorders
    from gpuflame.model import merge

    s = Session(Settings(backend="torch", follow=False), path=tmp_path / "p.pb.gz")
    recorder = recorders.create("torch", s)
    s.add(recorder)
    kept = torch.nn.Linear(8, 8)(torch.randn(2, 8))  # noqa: F841
    recorder.stop()
    taken = s.profile()
    assert taken is not None and taken.samples and taken.timeline is not None
    merged = merge([recorder.snapshot()], labels=[{"pid": os.getpid()}])
    assert [p.pid for p in taken.processes] == [str(os.getpid())]  # the session describes its process too
    merged.processes = taken.processes
    assert taken == merged
    s.finish(write=False)
