"""The process-wide hooks object owns the fork step: one os.register_at_fork, each module's reset run once."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, os
    registered = []
    real = os.register_at_fork
    os.register_at_fork = lambda **kw: (registered.append(kw), real(**kw))[1]
    from gpuflame.capture.books import joint_peak
    from gpuflame.capture.recorders import allocator as torch_allocator
    from gpuflame.capture.recorders import dispatch as torch_tensors
    from gpuflame.capture.exit_hooks import HOOKS

    class StandInSession:  # only what the hooks call
        finished = False
        def after_fork(self, to_exec=False):
            steps.append("session")
        def finish(self, write=True):
            pass

    steps = []
    HOOKS.at_fork_child(lambda: 1 / 0)  # a reset that fails must not stop the others
    HOOKS.at_fork_child(lambda: steps.append("reset"))
    HOOKS.attach(StandInSession())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, json.dumps(steps).encode())
        os._exit(0)
    os.close(write)
    child = json.loads(os.read(read, 1000))
    os.waitpid(pid, 0)
    modules = [f.__module__ for f in HOOKS._fork_resets[:3]]
    ours = [f for kw in registered for f in kw.values() if getattr(f, "__module__", "").startswith("gpuflame")]
    print(json.dumps({"registered": len(ours), "child": child, "modules": modules}))
""")


@pytest.mark.subprocess
def test_one_fork_hook_runs_the_sessions_then_each_modules_reset_once() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen["registered"] == 1  # joint_peak, both torch recorders and the sessions share the one hook
    assert seen["modules"] == [
        "gpuflame.capture.books.joint_peak",
        "gpuflame.capture.recorders.allocator",
        "gpuflame.capture.recorders.dispatch.recorder",
    ]
    assert seen["child"] == ["session", "reset"]


SIGINT_DURING_THE_EXIT_WRITE = textwrap.dedent("""
    import os, signal
    from gpuflame.capture.exit_hooks import HOOKS, signals_held

    class WritesSlowly:  # a session whose final write is hit by a SIGINT (sent to the whole group)
        def finish(self, write=True):
            with signals_held():
                os.kill(os.getpid(), signal.SIGINT)
        def after_fork(self, to_exec=False):
            pass

    try:  # before the exit: a SIGINT held during a write still interrupts the program afterwards
        with signals_held():
            os.kill(os.getpid(), signal.SIGINT)
        print("not interrupted")
    except KeyboardInterrupt:
        print("interrupted")
    HOOKS.attach(WritesSlowly())
""")


@pytest.mark.subprocess
def test_a_sigint_during_the_final_write_prints_no_traceback_from_the_exit_hook() -> None:
    """A SIGINT to the whole group reaches the program and, from the launcher, again: at exit, the second
    one must not end as a KeyboardInterrupt traceback from gpuflame's atexit hook."""
    result = subprocess.run([sys.executable, "-c", SIGINT_DURING_THE_EXIT_WRITE], capture_output=True, text=True)
    assert result.stdout.split() == ["interrupted"]
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr, result.stderr
    assert result.returncode == 0
