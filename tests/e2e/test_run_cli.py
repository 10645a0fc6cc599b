"""``gpuflame run`` end to end: real Python processes, real torch (CPU) recording.

Every test starts ``python -m gpuflame run`` as a user would and reads the
profile it leaves behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuflame.formats import load
from gpuflame.model import Profile
from tests.helpers.run_cli import ALLOCATE, KIB, bytes_by_function, gpuflame_run, write


def test_exit_code_output_and_next_command(tmp_path: Path) -> None:
    script = write(
        tmp_path / "job.py",
        ALLOCATE,
        """
    kept = Holder().make(64)
    print("done", flush=True)
    sys.exit(3)
    """,
    )
    result = gpuflame_run("-o", "out.pb.gz", script.name, cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert result.stdout == "done\n"  # the program's output, untouched
    assert "gpuflame: next: gpuflame report out.pb.gz" in result.stderr
    profile = load(tmp_path / "out.pb.gz")
    assert bytes_by_function(profile)["Holder > make"] == 64 * KIB
    # one process: one output beside -o. Its own profile is the merged one, and the run's bookkeeping (the
    # shared peak table, the roll call) goes with the run, whatever the program's exit code: no folder stays
    assert len(profile.label_values("pid")) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.py", "out.pb.gz"]
    assert "processes" not in result.stderr


def test_a_script_whose_path_is_not_utf8_keeps_its_profile(tmp_path: Path) -> None:
    """Python names such a file with surrogateescape: writing its frames as UTF-8 failed and the profile was lost."""
    folder = tmp_path / os.fsdecode(b"job\xff")
    folder.mkdir()
    script = write(folder / "job.py", ALLOCATE, "kept = Holder().make(64)")
    result = gpuflame_run("-o", "out.pb.gz", str(script.relative_to(tmp_path)), cwd=tmp_path)
    assert result.returncode == 0 and "lost" not in result.stderr, result.stderr
    profile = load(tmp_path / "out.pb.gz")
    assert bytes_by_function(profile)["Holder > make"] == 64 * KIB
    assert any(f.file.endswith("job\ufffd/job.py") for f in profile.frames)


def test_module_and_command_forms(tmp_path: Path) -> None:
    write(tmp_path / "jobmod.py", ALLOCATE, "\nkept = Holder().make(8)\n")
    as_module = gpuflame_run("-o", "m.pb.gz", "-m", "jobmod", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert as_module.returncode == 0, as_module.stderr
    assert bytes_by_function(load(tmp_path / "m.pb.gz"))["Holder > make"] == 8 * KIB
    as_command = gpuflame_run("-o", "c.pb.gz", "--", sys.executable, "jobmod.py", cwd=tmp_path)
    assert as_command.returncode == 0, as_command.stderr
    assert bytes_by_function(load(tmp_path / "c.pb.gz"))["Holder > make"] == 8 * KIB


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_multiprocessing_children_are_profiled_with_their_pid(tmp_path: Path, method: str) -> None:
    write(tmp_path / "jobmp.py", ALLOCATE)
    script = write(
        tmp_path / "parent.py",
        f"""
    import multiprocessing as mp, os, torch
    from jobmp import Holder, child_work

    if __name__ == "__main__":
        ctx = mp.get_context({method!r})
        parent_keep = Holder().make(16)
        p = ctx.Process(target=child_work, args=(32,))
        p.start()
        p.join()
        print(f"parent {{os.getpid()}} child {{p.pid}}", flush=True)
    """,
    )
    result = gpuflame_run("-o", "mp.pb.gz", script.name, cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    parent_pid, child_pid = (int(w) for w in result.stdout.strip().splitlines()[-1].split()[1::2])
    profile = load(tmp_path / "mp.pb.gz")
    assert bytes_by_function(profile, "alloc_space", pid=parent_pid).get("Holder > make") == 16 * KIB
    assert bytes_by_function(profile, "alloc_space", pid=child_pid).get("Holder > make") == 32 * KIB
    kept = {p.name for p in (tmp_path / "mp.pb.gz.processes").glob("proc-*.pb.gz")}
    assert {f"proc-{parent_pid}.pb.gz", f"proc-{child_pid}.pb.gz"} <= kept  # several: each one's own stays
    assert "gpuflame: each process's own profile is in mp.pb.gz.processes/" in result.stderr


def test_subprocess_children_are_followed_unless_no_follow(tmp_path: Path) -> None:
    write(tmp_path / "kid.py", ALLOCATE, "\nkeep = child_work(24)\n")
    script = write(
        tmp_path / "boss.py",
        """
    import subprocess, sys
    subprocess.run([sys.executable, "kid.py"], check=True)
    """,
    )
    followed = gpuflame_run("-o", "f.pb.gz", script.name, cwd=tmp_path)
    assert followed.returncode == 0, followed.stderr
    kid_pid = int(followed.stdout.split()[1])
    assert bytes_by_function(load(tmp_path / "f.pb.gz"), pid=kid_pid)["Holder > make"] == 24 * KIB
    alone = gpuflame_run("-o", "n.pb.gz", "--no-follow", script.name, cwd=tmp_path)
    assert alone.returncode == 0
    # the parent never imported torch and the child was not followed: nothing to write
    assert "no profile was written" in alone.stderr
    assert not (tmp_path / "n.pb.gz").exists()


def test_an_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    write(site / "sitecustomize.py", "import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = 'yes'\n")
    script = write(
        tmp_path / "check.py",
        ALLOCATE,
        """
    kept = Holder().make(4)
    print(os.environ.get("USER_SITECUSTOMIZE_RAN"))
    """,
    )
    result = gpuflame_run("-o", "s.pb.gz", script.name, cwd=tmp_path, env={"PYTHONPATH": str(site)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "yes"
    assert bytes_by_function(load(tmp_path / "s.pb.gz"))["Holder > make"] == 4 * KIB


def test_a_lost_profile_never_changes_the_workload(tmp_path: Path) -> None:
    """The program removes gpuflame's folder: the write fails, the program's exit code stays."""
    script = write(
        tmp_path / "vandal.py",
        ALLOCATE,
        """
    import shutil
    kept = Holder().make(4)
    shutil.rmtree("v.pb.gz.processes")
    print("still here", flush=True)
    sys.exit(7)
    """,
    )
    result = gpuflame_run("-o", "v.pb.gz", script.name, cwd=tmp_path)
    assert result.returncode == 7
    assert result.stdout == "still here\n"
    assert "could not write the profile" in result.stderr
    assert "Traceback" not in result.stderr


def test_runs_without_output_go_to_the_store_with_metadata(tmp_path: Path) -> None:
    script = write(tmp_path / "stored.py", ALLOCATE, "\nkept = Holder().make(12)\nprint('the program says 12')\n")
    result = gpuflame_run("--json", script.name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()  # --json's help: the program's output, then the summary's one line
    assert lines[0] == "the program says 12" and len(lines) == 2
    summary = json.loads(lines[-1])
    folder = Path(summary["profile"]).parent
    assert folder.parent == tmp_path / "store" and folder.name.endswith("-stored.py")
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["exit_code"] == 0 and meta["totals"]["alloc_space"] >= 12 * KIB
    assert meta["processes"] == summary["processes"] and len(meta["processes"]) == 1
    assert not (folder / "processes").exists()  # one process: its profile is the merged one
    assert bytes_by_function(load(folder / "profile.pb.gz"))["Holder > make"] == 12 * KIB


def test_sigterm_is_passed_on_and_the_profile_is_still_written(tmp_path: Path) -> None:
    script = write(
        tmp_path / "server.py",
        ALLOCATE,
        """
    import time
    kept = Holder().make(20)
    print("serving", flush=True)
    time.sleep(60)
    """,
    )
    env = dict(os.environ, GPUFLAME_STORE=str(tmp_path / "store"))
    env.pop("PYTHONPATH", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuflame", "run", "-o", "t.pb.gz", script.name],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "serving"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM  # the program's death, as a parent sees it
    assert bytes_by_function(load(tmp_path / "t.pb.gz"))["Holder > make"] == 20 * KIB


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "nothing to run"),
        (("missing.py",), "missing.py: no such script"),
        (("--", "no-such-command-xyz"), "no-such-command-xyz: command not found"),
        (("--backend", "cobol", "x.py"), "invalid choice"),
        (("--interval", "soon", "x.py"), "not a duration"),
    ],
)
def test_bad_invocations_get_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    result = gpuflame_run(*args, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_a_script_after_the_double_dash_is_told_how_to_run_it(tmp_path: Path) -> None:
    """``gpuflame run -- train.py``: the file is here but is not a command; say so, not "command not found"."""
    (tmp_path / "train.py").write_text("print('never run')\n")
    result = gpuflame_run("--", "train.py", "--epochs", "1", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert "train.py: not a command (after --, write: gpuflame run -- python train.py; or leave out --)" in line


def test_a_command_on_path_runs_without_the_double_dash(tmp_path: Path) -> None:
    """``gpuflame run python script.py``: what users type first; a command on PATH, not a file here, is run."""
    write(tmp_path / "alloc.py", ALLOCATE, "keep = Holder().make(16)\n")
    bin_dir = Path(sys.executable).parent
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = gpuflame_run("--json", "-o", "cmd.pb.gz", Path(sys.executable).name, "alloc.py", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert bytes_by_function(load(tmp_path / "cmd.pb.gz"))["Holder > make"] == 16 * KIB


def test_a_backend_that_cannot_start_is_reported_and_the_program_runs(tmp_path: Path) -> None:
    """A broken framework install (a ``jax`` without ``jax.profiler``): one line, normal exit."""
    fake = tmp_path / "fakes" / "jax"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("VERSION = 'broken'\n")
    script = write(
        tmp_path / "usesjax.py",
        """
    import sys, jax
    print("ran with", jax.VERSION, flush=True)
    sys.exit(4)
    """,
    )
    result = gpuflame_run(
        "-o", "j.pb.gz", "--backend", "jax", script.name, cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "fakes")}
    )
    assert result.returncode == 4
    assert result.stdout == "ran with broken\n"
    assert "Traceback" not in result.stderr
    assert "gpuflame: jax backend: could not start recording" in result.stderr
    assert "the profile is empty (see what was lost above)" in result.stderr


JAX_SCRIPT = """
import jax.numpy as jnp

class Model:
    def make(self):
        return jnp.ones((256, 256), dtype=jnp.float32)

kept = Model().make()
kept.block_until_ready()
"""


def test_jax_runs_name_the_method_and_prune_jax_unless_asked(tmp_path: Path) -> None:
    script = write(tmp_path / "jaxjob.py", JAX_SCRIPT)
    env = {"JAX_PLATFORMS": "cpu"}

    def jax_frames_per_stack(profile: Profile) -> int:
        return max(sum("/jax/" in profile.frames[f].file for f in s.stack) for s in profile.samples)

    pruned = gpuflame_run("-o", "p.pb.gz", "--backend", "jax", script.name, cwd=tmp_path, env=env)
    assert pruned.returncode == 0, pruned.stderr
    profile = load(tmp_path / "p.pb.gz")
    idx = profile.type_index("inuse_space")
    (sample,) = [s for s in profile.samples if s.values[idx]]
    names = [profile.frames[f].name for f in sample.stack]
    # the jax function the user called stays as the leaf; jax's insides are gone
    assert names[1] == "Model > make" and sample.values[idx] == 256 * 256 * 4
    assert jax_frames_per_stack(profile) == 1
    # a JAX peak is not one moment that happened: the run says what it is, and how to sharpen it
    assert "the JAX peak is the largest of" in pruned.stderr and "--interval" in pruned.stderr
    kept = gpuflame_run("-o", "k.pb.gz", "--backend", "jax", "--keep-framework", script.name, cwd=tmp_path, env=env)
    assert kept.returncode == 0, kept.stderr
    assert jax_frames_per_stack(load(tmp_path / "k.pb.gz")) > 1
    often = gpuflame_run("-o", "o.pb.gz", "--backend", "jax", "--interval", "100ms", script.name, cwd=tmp_path, env=env)
    (note,) = [line for line in often.stderr.splitlines() if "the JAX peak is the largest of" in line]
    assert "--interval" not in note and "gpuflame.phase" in note  # already the shortest interval


MADE_AND_FREED_BETWEEN_SAMPLES = """
import jax.numpy as jnp

def step():
    a = jnp.ones((1 << 22,), dtype=jnp.float32).block_until_ready()  # 16 MiB, freed before exit
    return float(a[0])

print(step())
"""


def test_a_jax_run_whose_samples_saw_nothing_does_not_say_nothing_was_allocated(tmp_path: Path) -> None:
    """JAX is sampled at the start and at exit: 16 MiB made and freed between them was said to be
    'the profile is empty (nothing was allocated while recording)'. It says the samples saw no live buffers."""
    script = write(tmp_path / "between.py", MADE_AND_FREED_BETWEEN_SAMPLES)
    result = gpuflame_run("-o", "b.pb.gz", "--backend", "jax", script.name, cwd=tmp_path, env={"JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "1.0\n"
    (said,) = [line for line in result.stderr.splitlines() if "the profile is empty" in line]
    assert "nothing was allocated" not in said
    assert "no live buffers at any sample" in said and "--interval 100ms or gpuflame.phase" in said
    assert not any(load(tmp_path / "b.pb.gz").totals().values())


TWO_JAX_CHILDREN = """
import subprocess, sys
child = '''
import os, time, jax.numpy as jnp
keep = jnp.ones((N << 18,), dtype=jnp.float32).block_until_ready()  # N MiB, kept to the end
open(f"ready-N", "w").close()
while not all(os.path.exists(f"ready-{n}") for n in (1, 2)):  # both hold their arrays at once
    time.sleep(0.01)
'''
children = [subprocess.Popen([sys.executable, "-c", child.replace("N", str(n))]) for n in (1, 2)]
assert [c.wait() for c in children] == [0, 0]
"""


def test_processes_of_a_run_without_a_joint_peak_are_not_said_at_the_joint_peak(tmp_path: Path) -> None:
    """JAX processes have no joint peak (the run's peak is each one's own, summed), yet each line of the
    run said '... at the joint peak', where report says 'at the peak'."""
    script = write(tmp_path / "two.py", TWO_JAX_CHILDREN)
    result = gpuflame_run("-o", "t.pb.gz", script.name, cwd=tmp_path, env={"JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if ": own peak " in line]
    assert len(lines) == 2 and "sum of each process's own peak" in result.stderr
    assert not [line for line in lines if "joint" in line]
    assert sorted(line.split(", ")[1].split(": ")[0] for line in lines) == [
        "1.00 MiB at the peak",
        "2.00 MiB at the peak",
    ]


def test_a_second_run_to_the_same_output_does_not_merge_the_first(tmp_path: Path) -> None:
    script = write(tmp_path / "again.py", ALLOCATE, "\nkept = Holder().make(8)\n")
    for _ in range(2):
        result = gpuflame_run("-o", "a.pb.gz", script.name, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    profile = load(tmp_path / "a.pb.gz")
    assert len(profile.label_values("pid")) == 1
    assert bytes_by_function(profile)["Holder > make"] == 8 * KIB


def test_an_unwritable_output_keeps_the_programs_exit_code(tmp_path: Path) -> None:
    # the program itself puts a folder where the profile should go (a folder there
    # before the run is refused up front: tests/e2e/test_output_paths.py)
    taken = "\nimport os\nos.makedirs('taken/out.pb.gz')\nkept = Holder().make(4)\nsys.exit(6)\n"
    script = write(tmp_path / "ok.py", ALLOCATE, taken)
    result = gpuflame_run("-o", "taken/out.pb.gz", script.name, cwd=tmp_path)
    assert result.returncode == 6
    assert "the merged profile could not be written" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("closed", "flags"), [(2, ()), (1, ("--json",))], ids=["stderr", "stdout-json"])
def test_a_closed_output_stream_keeps_the_programs_exit_code(
    tmp_path: Path, closed: int, flags: tuple[str, ...]
) -> None:
    """``2>&-`` (or ``>&-`` with --json): the end-of-run message had nowhere to go and the launcher exited 1."""
    script = write(tmp_path / "quiet.py", ALLOCATE, "kept = Holder().make(8)\nsys.exit(4)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_") and k != "PYTHONPATH"}
    launcher = [sys.executable, "-m", "gpuflame", "run", *flags, "-o", "q.pb.gz", script.name]
    streams = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    streams["stderr" if closed == 2 else "stdout"] = None  # inherited, then closed in the child below
    bare = subprocess.run(
        [sys.executable, script.name], cwd=tmp_path, env=env, timeout=60, **streams, preexec_fn=lambda: os.close(closed)
    )
    result = subprocess.run(
        launcher, cwd=tmp_path, env=env, timeout=180, **streams, preexec_fn=lambda: os.close(closed)
    )
    assert bare.returncode == 4
    assert result.returncode == 4
    assert bytes_by_function(load(tmp_path / "q.pb.gz"))["Holder > make"] == 8 * KIB
