"""Helpers for the agent's tests: what is needed to run them, target processes, waiting."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agent.agent_expected import replay, rows
from tests.helpers.pythons import VERSIONS, python_for  # noqa: F401  (the agent's tests take them from here)

HERE = Path(__file__).resolve().parent
TARGET = HERE / "target.py"


def why_not() -> str | None:
    """The one reason these tests cannot run here, or None."""
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return "the agent supports x86-64 Linux"
    if os.geteuid() != 0:
        return "the agent needs root (BPF and uprobes)"
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        return "the kernel has no BTF"
    from gpuflame.agent import build

    if not build.up_to_date(build.object_path()):
        missing = build.toolchain_missing()
        if missing:
            return f"the BPF object cannot be built: {missing}"
    if shutil.which("gcc") is None:
        return "gcc is not installed (it builds the stand-in libcuda)"
    if cuda_include() is None:
        return "no cuda.h (the CUDA toolkit's headers give the stand-in its real signatures)"
    return None


STANDIN_FLAGS = ("-O2", "-fno-omit-frame-pointer", "-fno-inline", "-fno-ipa-icf")  # the benches' stand-in


def build_standin(out: Path, flags: tuple[str, ...] = STANDIN_FLAGS) -> str:
    """The stand-in libcuda.so.1 (tests/agent/standin_cuda.c) built at *out* with gcc *flags*, from cuda.h's
    real signatures; stand-in only: the real driver cannot run without a GPU."""
    source = HERE / "standin_cuda.c"
    command = ["gcc", "-shared", "-fPIC", *flags, f"-I{cuda_include()}", "-Wl,-soname,libcuda.so.1"]
    subprocess.run([*command, str(source), "-o", str(out), "-lpthread"], check=True, capture_output=True)
    return str(out)


def cuda_include() -> Path | None:
    candidates = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = Path(nvcc).resolve()
        candidates.append(str(real.parent.parent))
        try:  # a wrapper script that execs the real nvcc
            text = real.read_text(errors="replace")
            candidates += [w.rsplit("/bin/", 1)[0] for w in text.split() if w.endswith("/bin/nvcc")]
        except (OSError, UnicodeError):
            pass
    candidates += sorted(str(p) for p in Path("/usr/local").glob("cuda-*"))
    for c in candidates:
        if c and (Path(c) / "include" / "cuda.h").exists():
            return Path(c) / "include"
    return None


class Target:
    """tests/agent/target.py in a child process: commands in, JSON records out."""

    def __init__(self, python: str, libcuda: str, *extra: str, prefix: tuple[str, ...] = ()) -> None:
        self.proc = subprocess.Popen(
            [*prefix, python, str(TARGET), libcuda, *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.records: list[dict] = []
        self.pid = self.proc.pid

    def read_until(self, op: str) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            record = json.loads(line)
            self.records.append(record)
            if record["op"] == op:
                return record
        raise AssertionError(f"target ended before {op!r} (exit {self.proc.wait()})")

    def ready(self) -> int:
        """Wait until it has loaded the driver; its own pid (the namespaced one under unshare)."""
        return self.read_until("ready")["pid"]

    def run(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        self.read_until("done")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("exit\n")
                self.proc.stdin.close()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


class NativeCaller:
    """A C program linked against the stand-in libcuda: it prints ``ready``, allocates on ``go``, prints ``done``.

    The agent is started between the two (a process that is already running when it attaches).
    """

    def __init__(self, code: str, libcuda: str, folder: Path, prefix: tuple[str, ...] = ()) -> None:
        source, exe = folder / "caller.c", folder / "caller"
        source.write_text(code)
        lib_dir = os.path.dirname(libcuda)
        subprocess.run(
            [
                "gcc",
                "-O0",
                "-fno-omit-frame-pointer",
                "-rdynamic",
                str(source),
                "-o",
                str(exe),
                f"-L{lib_dir}",
                "-l:libcuda.so.1",
                f"-Wl,-rpath,{lib_dir}",
            ],
            check=True,
        )
        self.proc = subprocess.Popen([*prefix, str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        assert self._line() == "ready"

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        assert self._line() == "done"

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()


def wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    """Poll *condition* until true (the agent books events on its own thread; a loaded CI machine may take seconds)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


CHROOTED = "import os, sys; os.chroot(sys.argv[1]); os.chdir('/'); print('ready', flush=True); sys.stdin.read()"
CGROUP_ROOTS = ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified", "/sys/fs/cgroup")


class StandinContainer:
    """A stand-in for a pod's container (NOT a container runtime's): a child chrooted into *root*, in a cgroup
    named as the kubelet names a container's (``kubepods/pod<UID>/<CID>``), so the agent takes it for one."""

    def __init__(self, root: Path, cid: str, pod_uid: str) -> None:
        self.cgroup = self._cgroup(cid, pod_uid)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHROOTED, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.pid = self.proc.pid
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"
        (self.cgroup / "cgroup.procs").write_text(str(self.pid))

    @staticmethod
    def _cgroup(cid: str, pod_uid: str) -> Path:
        for base in CGROUP_ROOTS:
            folder = Path(base) / "kubepods" / f"pod{pod_uid}" / cid
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError:
                continue
            if (folder / "cgroup.procs").exists():
                return folder

        pytest.skip("no writable cgroup hierarchy to place a stand-in container in")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for folder in (self.cgroup, self.cgroup.parent, self.cgroup.parent.parent):
            try:
                folder.rmdir()
            except OSError:
                pass


def agent_cli(*args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()) -> subprocess.Popen:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLAME_")}
    full.update(env or {})
    return subprocess.Popen(
        [*prefix, sys.executable, "-m", "gpuflame", "agent", *args],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def watching(proc: subprocess.Popen) -> str:
    line = proc.stderr.readline()
    assert line.startswith("gpuflame agent: watching"), line + proc.stderr.read()
    return line


def booked(agent, records) -> bool:  # noqa: ANN001
    """The agent has every allocation the target logged."""
    want = sum(1 for r in records if r["op"] == "alloc")
    return agent.snapshot().totals()["alloc_objects"] >= want


def own_rows(agent, pids) -> dict:  # noqa: ANN001
    """The agent's rows of these processes (an every-process agent also sees other jobs' processes)."""
    return {k: v for k, v in rows(agent.snapshot()).items() if k[0] in pids}


def check_exact(agent, target, pid_of=None) -> dict:  # noqa: ANN001
    """The agent's profile equals the target's log (allocations and frees alike, once all are booked)."""
    expected = replay(target.records, pid_of)
    pids = {k[0] for k in expected}
    wait_for(lambda: own_rows(agent, pids) == expected)
    got = own_rows(agent, pids)
    assert got == expected
    return got


NATIVE_CALLER = r"""
#include <stdio.h>
typedef unsigned long long CUdeviceptr;
int cuInit(unsigned int);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
__attribute__((noinline)) void allocate_weights(void) {
    for (int i = 0; i < 3; i++) { CUdeviceptr p; cuMemAlloc_v2(&p, 4096); }
}
int main(void) {
    char line[8];
    cuInit(0);
    printf("ready\n"); fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 1;
    allocate_weights();
    printf("done\n"); fflush(stdout);
    fgets(line, sizeof line, stdin);
    return 0;
}
"""


# Threads allocating and freeing until the process ends; "done" once they have made FLOOD_PAIRS pairs between
# them, so the agent has been flooded a while when it is stopped (tests/agent/test_agent_stop.py,
# bench/bench_agent_stop.py).
FLOOD_PAIRS = 200_000
FLOOD = r"""
#include <stdio.h>
#include <pthread.h>
typedef unsigned long long CUdeviceptr;
int cuInit(unsigned int);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
int cuMemFree_v2(CUdeviceptr);
static volatile long pairs;
static void *churn(void *arg) {
    for (;;) {
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, 4096) == 0) cuMemFree_v2(p);
        __atomic_add_fetch(&pairs, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}
int main(void) {
    char line[8];
    cuInit(0);
    printf("ready\n"); fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 1;
    for (int i = 0; i < 4; i++) { pthread_t t; pthread_create(&t, NULL, churn, NULL); }
    while (__atomic_load_n(&pairs, __ATOMIC_RELAXED) < PAIRS) ;
    printf("done\n"); fflush(stdout);
    fgets(line, sizeof line, stdin);
    return 0;
}
""".replace("PAIRS", str(FLOOD_PAIRS))


class NoEpoll:
    """Stands for the events ring's epoll on a fake ring (a memory file cannot be polled; never waited on)."""

    def register(self, fd: int, events: int) -> None:
        pass

    def close(self) -> None:
        pass


def fake_ring(records: list[bytes], size: int = 0, start: int = 0) -> tuple[int, int]:
    """A memory file laid out as the kernel lays the events ring out (consumer page, producer page, the data
    twice in a row as the kernel maps it) holding *records* from position *start* on, each an
    ``(header word, data)`` pair or plain data (its length as the header word): its fd and data size."""
    import mmap
    import struct

    page = mmap.PAGESIZE
    framed = [r if isinstance(r, tuple) else (len(r), r) for r in records]
    used = sum(8 + ((len(data) + 7) & ~7) for _, data in framed)
    size = size or 1 << max(used - 1, page).bit_length()
    data = bytearray(size)
    at = start
    for word, rec in framed:
        chunk = struct.pack("<I4x", word) + rec + bytes(-len(rec) % 8)
        first = min(len(chunk), size - at % size)  # a record wrapping the end goes on at the start
        data[at % size : at % size + first] = chunk[:first]
        data[: len(chunk) - first] = chunk[first:]
        at += len(chunk)
    fd = os.memfd_create("ring")
    os.ftruncate(fd, 2 * page + 2 * size)
    with mmap.mmap(fd, 2 * page + 2 * size) as m:
        struct.pack_into("<Q", m, 0, start)  # the consumer position
        struct.pack_into("<Q", m, page, at)  # the producer position
        m[2 * page : 2 * page + size] = data
        m[2 * page + size :] = data  # the kernel maps the data pages twice
    return fd, size


def ring_for(fd: int, size: int, reader: Callable, limit: int = 1 << 20) -> object:
    """The agent's RingBuffer over a fake ring (:func:`fake_ring`)."""
    from gpuflame.agent import libbpf

    epoll = libbpf.select.epoll
    libbpf.select.epoll = NoEpoll  # type: ignore[misc,assignment]
    try:
        return libbpf.RingBuffer(fd, size, reader, limit)
    finally:
        libbpf.select.epoll = epoll  # type: ignore[misc]
