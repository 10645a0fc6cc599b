"""The launcher's EndWatch: its watch thread and the launcher's own looks (settle) never look at once."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gpuflame.launch import roll_call


def test_settle_does_not_look_while_the_watch_thread_looks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch thread is held inside a look; settle() must wait for it, never look beside it (two looks at
    once changed the pid table under each other's loops: "dictionary changed size during iteration")."""
    (tmp_path / f"started-{os.getpid()}").touch()
    inside, overlapped, held = [0], [False], threading.Event()
    watch_thread_in = threading.Event()
    real = roll_call.unfinished

    def unfinished(folder: int) -> list[int]:
        inside[0] += 1
        overlapped[0] |= inside[0] > 1
        if threading.current_thread().name == "gpuflame-end-watch" and not held.is_set():
            held.set()
            watch_thread_in.set()
            threading.Event().wait(0.5)  # a look that takes a while; settle() comes meanwhile
        inside[0] -= 1
        return real(folder)

    monkeypatch.setattr(roll_call, "unfinished", unfinished)
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        watch = roll_call.EndWatch(folder).start()
        assert watch_thread_in.wait(30)
        assert watch.settle(0) == 1  # this process is registered and runs
        endings = watch.stop()
    finally:
        os.close(folder)
    assert not overlapped[0], "settle() looked while the watch thread was looking"
    assert endings == {os.getpid(): roll_call.Ending(None, seen_running=True)}
