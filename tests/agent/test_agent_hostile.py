"""The agent against hostile containers and processes: nothing they control leads it out of them.

A container's files are read inside its root (no absolute link reaches the
host's files, no FIFO blocks), probes go only where the agent has verified a
call into the driver, and what it keeps or reads for a target is bounded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from gpuflame.agent.kube import SERVICE_ACCOUNT_NAMESPACE, Placement
from tests.agent.agent_helpers import NativeCaller, StandinContainer, agent_cli, wait_for

CID = "9c1d2e3f" * 8
POD_UID = "0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6"
SECRET = "root:$6$host-shadow-secret:19000:0:99999:7:::"


def container_root(tmp_path: Path, hostname: str | None = "vllm-7d9f8b6c4-x2k9q", fifo: bool = False) -> Path:
    """A container's files as a projected service-account volume lays them out (``..data`` links), and
    ``/var/run`` an absolute link to ``/run`` as in many images; *hostname* None: a link to a host secret;
    *fifo*: a FIFO at the service-account path (in a plain ``/var/run``)."""
    root = tmp_path / "rootfs"
    account = root / ("var/" if fifo else "") / "run/secrets/kubernetes.io/serviceaccount"
    (account / "..2025_01_01").mkdir(parents=True)
    if not fifo:
        (root / "var").mkdir()
        (root / "var/run").symlink_to("/run")
    (root / "etc").mkdir()
    if fifo:
        os.mkfifo(account / "namespace")
    else:
        (account / "..2025_01_01" / "namespace").write_text("serving")
        (account / "..data").symlink_to("..2025_01_01")
        (account / "namespace").symlink_to("..data/namespace")
    if hostname is None:
        secret = tmp_path / "host-shadow"
        secret.write_text(SECRET)
        (root / "etc/hostname").symlink_to(secret)  # absolute: the host's file, seen from the host's root
    else:
        (root / "etc/hostname").write_text(hostname + "\n")
    return root


@pytest.fixture
def container(tmp_path):  # noqa: ANN001, ANN201
    if os.geteuid() != 0:
        pytest.skip("a stand-in container needs root (chroot, cgroups)")
    made: list[StandinContainer] = []

    def make(**kwargs: object) -> StandinContainer:
        c = StandinContainer(container_root(tmp_path, **kwargs), CID, POD_UID)  # type: ignore[arg-type]
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def labels_of(pid: int) -> dict[str, str]:
    """Placement labels, read on a thread: a read that blocks fails the test instead of hanging it."""
    got: dict[str, str] = {}
    reader = threading.Thread(target=lambda: got.update(Placement("/", "n1").labels(pid)), daemon=True)
    reader.start()
    reader.join(60)
    assert not reader.is_alive(), "reading the container's files blocked"
    return got


def test_a_container_is_read_inside_its_root(container):
    """Relative and absolute links inside the container resolve inside it (the kubelet's ``..data`` links)."""
    c = container()
    assert labels_of(c.pid) == {"node": "n1", "namespace": "serving", "pod": "vllm-7d9f8b6c4-x2k9q"}


def test_an_absolute_link_does_not_reach_the_host(container):
    """/etc/hostname -> a host secret: resolved inside the container (where it does not exist): no pod label."""
    c = container(hostname=None)
    labels = labels_of(c.pid)
    assert labels == {"node": "n1", "namespace": "serving"}
    assert "secret" not in repr(labels)


def test_a_fifo_does_not_block_and_the_duration_holds(container, libcuda, tmp_path):
    """A FIFO at the service-account path: not opened for reading; the agent watches the container's process,
    stops at --duration and writes its profile."""
    c = container(fifo=True)
    fifo = f"/proc/{c.pid}/root/{SERVICE_ACCOUNT_NAMESPACE}"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert labels_of(c.pid) == {"node": "n1", "pod": "vllm-7d9f8b6c4-x2k9q"}
    out = tmp_path / "node.pb.gz"
    proc = agent_cli("--pid", str(c.pid), "--libcuda", libcuda, "--duration", "1s", "-o", str(out))
    try:
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            with contextlib.suppress(OSError):  # let a blocked reader go
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            proc.wait()
    assert proc.returncode == 0, stderr
    assert "watching pid" in stderr and out.exists()


HOSTILE_CALLER = r"""
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
typedef unsigned long long CUdeviceptr;
int cuInit(unsigned int);
int cuMemAlloc_v2(CUdeviceptr *, size_t);
CUdeviceptr slot;
static sigjmp_buf back;

static void on_fault(int sig) { (void)sig; siglongjmp(back, 1); }

/* Each enters the driver with a return address it made up, where the driver then returns. */
__attribute__((noinline)) void after_a_jump(void) {  /* no call there */
    __asm__ volatile("lea slot(%%rip), %%rdi\n\tmov $4096, %%esi\n\tlea 1f(%%rip), %%rax\n\tpush %%rax\n\t"
                     "jmp cuMemAlloc_v2@PLT\n1:\n\t" ::: "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10",
                     "r11", "memory", "cc");
}
__attribute__((noinline)) void inside_an_instruction(void) {  /* after bytes ff d0 (call *%rax) of a mov */
    __asm__ volatile("lea slot(%%rip), %%rdi\n\tmov $4096, %%esi\n\tlea 1f+3(%%rip), %%rax\n\tpush %%rax\n\t"
                     "jmp cuMemAlloc_v2@PLT\n1:\n\tmov $0x9090d0ff, %%eax\n\t" ::: "rax", "rcx", "rdx", "rsi",
                     "rdi", "r8", "r9", "r10", "r11", "memory", "cc");
}
__attribute__((noinline)) void after_another_call(void) {  /* right after a call to getpid */
    __asm__ volatile("lea slot(%%rip), %%rdi\n\tmov $4096, %%esi\n\tlea 1f(%%rip), %%rax\n\tpush %%rax\n\t"
                     "jmp cuMemAlloc_v2@PLT\n\tcall getpid@PLT\n1:\n\t" ::: "rax", "rcx", "rdx", "rsi", "rdi",
                     "r8", "r9", "r10", "r11", "memory", "cc");
}
__attribute__((noinline)) void into_data(void *where) {  /* a file mapped without execute: it faults there */
    __asm__ volatile("lea slot(%%rip), %%rdi\n\tmov $4096, %%esi\n\tpush %0\n\tjmp cuMemAlloc_v2@PLT\n\t"
                     :: "r"(where) : "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "memory", "cc");
}
__attribute__((noinline)) void genuine(void) { cuMemAlloc_v2(&slot, 8192); }

int main(int argc, char **argv) {
    char line[8];
    (void)argc;
    int fd = open(argv[0], O_RDONLY);
    char *data = mmap(NULL, 8192, PROT_READ, MAP_PRIVATE, fd, 0);
    signal(SIGSEGV, on_fault);
    cuInit(0);
    printf("ready\n"); fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 1;
    after_a_jump();
    inside_an_instruction();
    after_another_call();
    if (!sigsetjmp(back, 1)) into_data(data + 4096 + 16);
    genuine();
    printf("done\n"); fflush(stdout);
    fgets(line, sizeof line, stdin);
    return 0;
}
"""


@pytest.mark.parametrize("map_files", [True, False])
def test_return_addresses_made_up_by_a_process_are_not_probed(map_files, libcuda, agent_for, tmp_path, monkeypatch):
    """A process enters the driver with return addresses it made up (after a jump, inside an instruction that
    reads as a call, after a call to another function, in a file mapped without execute): none is probed; the
    genuine call's site (after a call to the driver's PLT stub) is. Without /proc/PID/map_files (the DaemonSet
    has no CAP_SYS_ADMIN), the file is found by its path and checked to be the one mapped."""
    from gpuflame.agent import procs

    if not map_files:
        monkeypatch.setattr(procs, "MAP_FILES", "/nonexistent/{pid}/{start:x}-{end:x}")
    caller = NativeCaller(HOSTILE_CALLER, libcuda, tmp_path)
    try:
        agent = agent_for(caller.pid, probes="entry")
        caller.go()
        assert wait_for(lambda: agent.stats()["sites_unverified"] >= 4 and agent.return_sites)
        assert agent.stats()["sites_unverified"] == 4
        assert list(agent.return_sites.values()) == [str(tmp_path / "caller")]
        assert any("4 return addresses were not probed" in c for c in agent.snapshot().comments)
    finally:
        caller.close()


def named_310(root: Path, file: str, line: int, co_name: str) -> str:
    """How the agent names a 3.10 frame of a process whose root is *root* (its code object as the kernel copies
    it); on a thread, so that a read that blocks fails the test."""
    from gpuflame.agent.events import CodeRecord
    from gpuflame.agent.py_offsets import OFFSETS
    from gpuflame.agent.pyremote import CodeReader, Memory

    reader = CodeReader(Memory(os.getpid()), "3.10", OFFSETS["3.10"], root=str(root))
    ascii_state = 1 << 6
    record = CodeRecord(
        os.getpid(),
        0x1000,
        line,
        ascii_state,
        ascii_state,
        len(co_name),
        len(file),
        0,
        co_name.encode(),
        file.encode(),
        b"",
    )
    got: list[str] = []
    naming = threading.Thread(
        target=lambda: (reader.remember(record), got.append(reader.code(0x1000).name)), daemon=True
    )
    naming.start()
    naming.join(60)
    reader.memory.close()
    assert not naming.is_alive(), "reading the process's source blocked"
    return got[0]


def test_a_310_source_is_read_inside_the_process_root(tmp_path):
    """3.10 has no co_qualname: the class is read from the source the code object names, inside the process's
    root only: a link out of it (to a host file) or a FIFO gives the bare function name."""
    source = "class Model:\n    def forward(self):\n        pass\n"
    host = tmp_path / "host.py"
    host.write_text(source.replace("Model", "HostSecret"))
    root = tmp_path / "rootfs"
    (root / "app").mkdir(parents=True)
    (root / "app/model.py").write_text(source)
    (root / "app/linked.py").symlink_to(host)
    os.mkfifo(root / "app/fifo.py")
    assert named_310(root, "/app/model.py", 2, "forward") == "Model > forward"
    assert named_310(root, "/app/linked.py", 2, "forward") == "forward"
    assert named_310(root, "/app/fifo.py", 2, "forward") == "forward"


def test_native_frames_are_named_from_the_file_mapped(libcuda, agent_for, tmp_path):
    """A process in its own mount namespace mounts another file over its executable's path: its native frames
    are named from the file it maps (/proc/PID/map_files), not from what its path now leads to."""
    from tests.agent.agent_helpers import NATIVE_CALLER

    if shutil.which("nsenter") is None:
        pytest.skip("no nsenter")
    folder = tmp_path / "bin"
    folder.mkdir()
    caller = NativeCaller(NATIVE_CALLER, libcuda, folder, prefix=("unshare", "--mount", "--propagation", "private"))
    try:
        decoy = tmp_path / "decoy"
        decoy.mkdir()
        shutil.copy("/bin/true", decoy / "caller")
        subprocess.run(["nsenter", "-t", str(caller.pid), "-m", "mount", "--bind", str(decoy), str(folder)], check=True)
        assert "allocate_weights" not in Path(f"/proc/{caller.pid}/root{folder}/caller").read_bytes().decode("latin-1")
        agent = agent_for(caller.pid)
        caller.go()
        assert wait_for(lambda: agent.snapshot().totals()["alloc_space"] == 3 * 4096)
        profile = agent.snapshot().compact()
        (sample,) = profile.samples
        assert [f.name for f in profile.stack_frames(sample)][:2] == ["allocate_weights", "main"]
    finally:
        caller.close()


def test_without_map_files_mapped_files_are_read_inside_the_root(container, monkeypatch):
    """Without /proc/PID/map_files (no CAP_SYS_ADMIN), a mapped file is opened by its path inside the process's
    root: a container whose paths link to the host's files gets nothing read from the host."""
    from gpuflame.agent import procs

    c = container()
    root = Path(f"/proc/{c.pid}/root").resolve()
    for path in {m.path for m in procs.maps(c.pid)}:  # each file it maps: a link to the host's copy
        link = root / path.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(path)
    assert procs.interpreter(c.pid) is not None  # the very files mapped, through map_files
    monkeypatch.setattr(procs, "MAP_FILES", "/nonexistent/{pid}/{start:x}-{end:x}")
    assert procs.interpreter(c.pid) is None  # the links lead nowhere inside the container
