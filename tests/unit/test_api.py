"""The Python API: ``with gpuflame.profile(path)``, ``gpuflame.start()`` / ``stop()``."""

from __future__ import annotations

import atexit
import gc
import signal
import weakref
from pathlib import Path

import pytest
import torch

import gpuflame
from gpuflame.formats import load


class Buffers:
    def allocate(self, n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.uint8)


def leaf_bytes(path: Path, name: str, type_name: str = "alloc_space") -> int:
    p = load(path)
    idx = p.type_index(type_name)
    return sum(s.values[idx] for s in p.samples if s.stack and p.frames[s.stack[0]].name == name)


def test_profile_block_writes_the_file(tmp_path: Path) -> None:
    before = Buffers().allocate(1 << 20)  # made before profiling: not counted
    out = tmp_path / "block.pb.gz"
    with gpuflame.profile(out, backend="torch"):
        kept = Buffers().allocate(4096)
        before.add_(1)
    assert leaf_bytes(out, "Buffers > allocate") == 4096
    # touching the old tensor in place holds nothing (its scalar is wrapped in a
    # few bytes that are freed at once, which the CPU allocator hook does see)
    assert load(out).totals()["inuse_space"] == 4096
    del kept


def test_the_file_is_written_when_the_block_raises(tmp_path: Path) -> None:
    out = tmp_path / "raised.pb.gz"
    with pytest.raises(ZeroDivisionError):
        with gpuflame.profile(out, backend="torch"):
            kept = Buffers().allocate(2048)  # noqa: F841
            raise ZeroDivisionError("inside the block")
    assert leaf_bytes(out, "Buffers > allocate") == 2048


def test_a_second_start_is_nested_and_each_stop_gets_its_own_answer(tmp_path: Path) -> None:
    """A start() inside a running recording shares it (with a warning); the first stop() ends the inner one,
    writing what the recording held then, and the outer one goes on to its own stop()."""
    out, inner = tmp_path / "ss.pb.gz", tmp_path / "other.pb.gz"
    first = gpuflame.start(out, backend="torch")
    try:
        kept = Buffers().allocate(512)  # noqa: F841
        with pytest.warns(RuntimeWarning, match="already profiling this process into .*ss.pb.gz.*shares"):
            again = gpuflame.start(inner)
        assert again is not first and again.nested and first.running
        more = Buffers().allocate(1024)  # noqa: F841
        assert gpuflame.stop() == inner.resolve()  # the innermost first
        later = Buffers().allocate(2048)  # noqa: F841
    finally:
        assert gpuflame.stop() == out.resolve()
    assert gpuflame.stop() is None
    assert leaf_bytes(inner, "Buffers > allocate") == 512 + 1024
    assert any("recorded inside another recording" in c for c in load(inner).comments)
    assert leaf_bytes(out, "Buffers > allocate") == 512 + 1024 + 2048


def test_a_nested_block_writes_its_file_and_does_not_end_the_outer_one(tmp_path: Path) -> None:
    out = tmp_path / "outer.pb.gz"
    with gpuflame.profile(out, backend="torch"):
        with pytest.warns(RuntimeWarning, match="already profiling"):
            with gpuflame.profile(tmp_path / "inner.pb.gz", backend="torch"):
                inner = Buffers().allocate(1000)  # noqa: F841
        assert not out.exists()  # the inner block's end did not stop the outer profile
        outer = Buffers().allocate(3000)  # noqa: F841
    assert leaf_bytes(out, "Buffers > allocate") == 4000
    assert leaf_bytes(tmp_path / "inner.pb.gz", "Buffers > allocate") == 1000


def test_the_nesting_warning_points_at_the_users_line_for_start_and_for_a_with_block(tmp_path: Path) -> None:
    """A nested ``with gpuflame.profile()`` was blamed on contextlib's ``__enter__`` (contextlib.py:137),
    a line the reader cannot change; both ways in must name the caller's own file."""
    with gpuflame.profile(tmp_path / "outer.pb.gz", backend="torch"):
        with pytest.warns(RuntimeWarning, match="already profiling") as by_block:
            with gpuflame.profile(tmp_path / "block.pb.gz"):
                pass
        with pytest.warns(RuntimeWarning, match="already profiling") as by_start:
            gpuflame.start(tmp_path / "start.pb.gz")
        gpuflame.stop()
    assert [w.filename for w in by_block] == [__file__] and [w.filename for w in by_start] == [__file__]
    assert "this profile() block shares that recording" in str(by_block[0].message)
    assert "its end writes" in str(by_block[0].message)
    assert "this start() shares that recording" in str(by_start[0].message)
    assert "its stop() writes" in str(by_start[0].message)


def test_the_outer_recording_stopped_first_says_what_its_nested_one_lost(tmp_path: Path) -> None:
    outer = gpuflame.start(tmp_path / "outer.pb.gz", backend="torch")
    with pytest.warns(RuntimeWarning):
        gpuflame.start(tmp_path / "inner.pb.gz")
    Buffers().allocate(100)
    assert outer.stop() == (tmp_path / "outer.pb.gz").resolve()
    assert not (tmp_path / "inner.pb.gz").exists()
    assert any("was never stopped" in c and "inner.pb.gz" in c for c in load(tmp_path / "outer.pb.gz").comments)


@pytest.mark.slow
def test_profile_cycles_leave_no_session_handler_or_note_behind(tmp_path: Path, monkeypatch) -> None:
    """Six blocks: one SIGTERM handler and one atexit entry in all, no session kept, no lost-PID.txt."""
    registered: list[object] = []  # atexit cannot list its entries: keep a shadow list of ours
    real_register, real_unregister = atexit.register, atexit.unregister
    monkeypatch.setattr(atexit, "register", lambda f, *a: (registered.append(f), real_register(f, *a))[1])
    monkeypatch.setattr(
        atexit, "unregister", lambda f: (registered.remove(f) if f in registered else None, real_unregister(f))[1]
    )
    refs = []
    for i in range(6):
        with gpuflame.profile(tmp_path / f"c{i}.pb.gz") as recording:  # auto: also waits for jax
            session = recording._session  # the internal session: its notes and its life are what is tested
            session.report("a note for the profile, not a file beside it", say=False)
            kept = Buffers().allocate(100 + i)  # noqa: F841
        refs += [weakref.ref(session), *(weakref.ref(r) for r in session.recorders)]
        del session, recording
        if i == 0:
            handler, callbacks = signal.getsignal(signal.SIGTERM), len(registered)
        assert signal.getsignal(signal.SIGTERM) is handler
        assert len(registered) == callbacks <= 1
    gc.collect()
    assert len(refs) >= 12 and [r() for r in refs] == [None] * len(refs)  # sessions and their recorders
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"c{i}.pb.gz" for i in range(6))
    assert leaf_bytes(tmp_path / "c5.pb.gz", "Buffers > allocate") == 105
    assert any("a note for the profile" in c for c in load(tmp_path / "c5.pb.gz").comments)


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        gpuflame.start(backend="cobol")


@pytest.mark.parametrize("kind", ["folder", "foreign file", "unwritable folder"])
def test_an_output_that_cannot_take_the_profile_is_refused_at_start(tmp_path: Path, kind: str) -> None:
    """As ``run -o`` checks at once: a profile must not be lost (or a file overwritten) at stop."""
    target = {"folder": tmp_path, "foreign file": tmp_path / "notes.txt", "unwritable folder": Path("/proc/x.pb.gz")}
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="cannot write|refusing to overwrite"):
        gpuflame.start(target[kind], backend="torch")
    assert gpuflame.stop() is None  # nothing was started
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_missing_folder_of_the_output_is_made_at_start(tmp_path: Path) -> None:
    out = tmp_path / "new" / "deeper" / "p.pb.gz"
    gpuflame.start(out, backend="torch")
    Buffers().allocate(1000)
    assert gpuflame.stop() == out.resolve() and out.exists()


def test_stop_without_writing_hands_back_the_profile_the_file_would_hold(tmp_path: Path) -> None:
    """``stop(write=False)``: no file, the same numbers, frames and notes as ``stop()`` writes."""
    written, kept = tmp_path / "written.pb.gz", tmp_path / "kept.pb.gz"
    profiles = []
    for out, write in ((written, True), (kept, False)):
        recording = gpuflame.start(out, backend="torch")
        recording._session.report("a note of what was lost", say=False)
        held = Buffers().allocate(3000)  # noqa: F841
        Buffers().allocate(5000)  # freed at once: in the peak and alloc, not in use
        profiles.append(gpuflame.stop(write=write))
    assert profiles[0] == written.resolve()
    assert not kept.exists()
    profile = profiles[1]
    assert isinstance(profile, gpuflame.Profile)
    on_disk = load(written)
    assert profile.totals() == on_disk.totals()
    assert profile.totals()["inuse_space"] == 3000 and profile.totals()["alloc_space"] == 8000
    names = {profile.frames[s.stack[0]].name for s in profile.samples if s.stack}
    assert names == {load(written).frames[s.stack[0]].name for s in on_disk.samples if s.stack}
    assert "Buffers > allocate" in names
    assert any("a note of what was lost" in c for c in profile.comments)
    assert gpuflame.stop(write=False) is None  # nothing running


def test_a_bare_stop_leaves_a_hosts_recording_running(tmp_path: Path) -> None:
    """A ``gpuflame.stop()`` in a ``%%gpuflame`` cell (or a test under ``pytest --gpuflame``) that started
    nothing of its own stopped the host's recording: the cell then said it saw no allocation, though 1 MiB
    was made. It is a warning now, and the host's numbers are whole."""
    from gpuflame import hosted

    host = hosted.start(tmp_path / "cell.pb.gz", "torch", "a %%gpuflame cell")
    try:
        held = Buffers().allocate(3000)  # noqa: F841
        with pytest.warns(RuntimeWarning, match="the recording running is a %%gpuflame cell's"):
            assert gpuflame.stop() is None
        assert host.recording.running
        Buffers().allocate(5000)
    finally:
        profile = hosted.stop(host, ())
    assert profile is not None
    assert profile.totals()["inuse_space"] == 3000 and profile.totals()["alloc_space"] == 8000
    assert gpuflame.stop() is None  # nothing running, no warning
