"""The BPF object loads and works on a kernel older than this machine's (issue 19 item 7).

An installed older kernel (Debian bookworm's 6.1: ``apt-get install linux-image-amd64``; a 5.15 image
where one is installed) boots under QEMU with KVM. A tiny initramfs (busybox, the virtio and 9p
modules of that kernel) mounts this machine's root read-only over 9p, chroots into it and runs some
of this folder's agent tests there (the stand-in libcuda, real Python targets, real uprobes on the
guest's kernel), then prints their exit status on the serial console, which this test checks.
Skips with one reason where QEMU, KVM, busybox or an older kernel image is missing (without KVM,
GPUFLAME_TEST_EMULATED_VM=1 runs it under QEMU's emulation: tens of minutes on a small machine).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.agent_helpers import HERE

REPO = HERE.parents[1]
# boot, the guest's tests over 9p and power-off: about 2 minutes with KVM; emulated (TCG), far longer
BOOT_SECONDS = {"kvm": 480, "tcg": 1800}
MODULES = ("virtio_pci", "9pnet_virtio", "9p")  # with what modules.dep says they need
# Tests run inside the guest: exact bytes per Python stack, a deep stack (the bounded walk's end), native frames.
GUEST_TESTS = ("tests/agent/test_agent_stacks.py", "-k", "(exact_bytes and 3.11) or deep_stack or native_frames_under")
EMULATE = "GPUFLAME_TEST_EMULATED_VM"  # without a usable KVM, run the guest under QEMU's emulation anyway
RC_LINE = re.compile(r"GPUFLAME-GUEST-RC=(\d+)")


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", release)[:3])


def older_kernel() -> tuple[Path, Path] | None:
    """The oldest installed kernel image older than the running one, with its modules folder."""
    running = _release_key(os.uname().release)
    found = []
    for image in Path("/boot").glob("vmlinuz-*"):
        release = image.name[len("vmlinuz-") :]
        modules = Path("/lib/modules") / release
        if _release_key(release) < running and (modules / "kernel/fs/9p/9p.ko").exists():
            found.append((_release_key(release), image, modules))
    return min(found)[1:] if found else None


def why_no_vm() -> str | None:
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 is not installed (Debian: apt-get install qemu-system-x86)"
    if not Path("/bin/busybox").exists() or "static" not in _file_kind("/bin/busybox"):
        return "no static busybox for the guest's init (Debian: apt-get install busybox-static)"
    if older_kernel() is None:
        return "no kernel older than this one installed (Debian: apt-get install linux-image-amd64)"
    if accelerator() == "tcg" and not os.environ.get(EMULATE):
        return f"no KVM that boots a stock kernel here (none, or PVM); {EMULATE}=1 runs it emulated (~20-30 min)"
    return None


def accelerator() -> str:
    """kvm, unless /dev/kvm is PVM (a paravirtual KVM, as inside some cloud sandboxes), which boots only
    kernels built as PVM guests: there QEMU emulates the CPU (tcg; the guest's tests then take minutes)."""
    if Path("/sys/module/kvm_pvm").exists() or not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    return "kvm"


ACCEL_ARGS = {"kvm": ["-enable-kvm", "-cpu", "host"], "tcg": ["-accel", "tcg,thread=multi", "-cpu", "max"]}


def _file_kind(path: str) -> str:
    """'static' when the ELF file has no interpreter (what busybox-static installs)."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    return "dynamic" if b"ld-linux" in head else "static"


def _cpio(files: dict[str, tuple[int, bytes]]) -> bytes:
    """A newc cpio archive (what the kernel unpacks as its initramfs): name -> (mode, content)."""
    out = bytearray()
    for ino, (name, (mode, data)) in enumerate([*files.items(), ("TRAILER!!!", (0, b""))], start=1):
        raw = name.encode() + b"\0"
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(raw), 0]
        out += b"070701" + b"".join(b"%08x" % v for v in fields) + raw
        out += b"\0" * (-len(out) % 4)
        out += data
        out += b"\0" * (-len(out) % 4)
    return bytes(out)


INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /host
mount -t proc proc /proc && mount -t sysfs sys /sys && mount -t devtmpfs dev /dev
for m in {modules}; do insmod /modules/$m.ko || echo "guest: insmod $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro host /host || echo "guest: no 9p root"
mount -t proc proc /host/proc && mount -t sysfs sys /host/sys && mount -t devtmpfs dev /host/dev
mkdir -p /host/dev/shm && mount -t tmpfs shm /host/dev/shm
mount -t tmpfs tmp /host/tmp && mount -t tmpfs run /host/run
cp /guest.sh /host/tmp/guest.sh
echo "guest: Linux $(uname -r)"
chroot /host /bin/sh /tmp/guest.sh
echo "GPUFLAME-GUEST-RC=$?"
sync
poweroff -f
"""

GUEST = """cd {repo}
export HOME={home} PATH={path} PYTHONDONTWRITEBYTECODE=1 TMPDIR=/tmp
exec {python} -m pytest -v -x -p no:cacheprovider {tests} 2>&1
"""


def load_order(modules: Path) -> list[str]:
    """MODULES and what they need, each after its needs (modules.dep); those built in are not there."""
    deps: dict[str, list[str]] = {}
    for line in (modules / "modules.dep").read_text().splitlines():
        name, _, needs = line.partition(":")
        deps[name] = needs.split()
    by_name = {Path(k).name[:-3]: k for k in deps}
    order: list[str] = []

    def add(path: str) -> None:
        for need in reversed(deps.get(path, [])):
            add(need)
        if path not in order:
            order.append(path)

    for m in MODULES:
        if m in by_name:
            add(by_name[m])
    return order


def initramfs(modules: Path) -> bytes:
    """busybox as /init's shell, the modules 9p over virtio needs, and the script the guest runs."""
    files: dict[str, tuple[int, bytes]] = {"bin": (0o40755, b""), "modules": (0o40755, b"")}
    files["bin/busybox"] = (0o100755, Path("/bin/busybox").read_bytes())
    present = load_order(modules)
    for m in present:
        files[f"modules/{Path(m).name}"] = (0o100644, (modules / m).read_bytes())
    present = [Path(m).name[:-3] for m in present]
    files["init"] = (0o100755, INIT.format(modules=" ".join(present)).encode())
    tests = " ".join(f"'{t}'" for t in GUEST_TESTS)
    guest = GUEST.format(
        repo=REPO,
        home=os.environ.get("HOME", "/root"),
        path=os.environ.get("PATH", ""),
        python=sys.executable,
        tests=tests,
    )
    files["guest.sh"] = (0o100755, guest.encode())
    return _cpio(files)


def test_the_agent_loads_and_works_on_an_older_kernel(bpf_object, tmp_path):
    """Booted on an older kernel, the agent's own tests pass there (the object is the one built here)."""
    reason = why_no_vm()
    if reason:
        pytest.skip(reason)
    image, modules = older_kernel()  # type: ignore[misc]
    initrd = tmp_path / "initrd.cpio"
    initrd.write_bytes(initramfs(modules))
    accel = accelerator()
    cmd = [
        "qemu-system-x86_64",
        *ACCEL_ARGS[accel],
        "-m",
        "2048",
        "-smp",
        "2",
        "-nographic",
        "-no-reboot",
        "-kernel",
        str(image),
        "-initrd",
        str(initrd),
        "-append",
        "console=ttyS0 quiet loglevel=3 panic=-1",
        "-virtfs",
        "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
    ]
    log = tmp_path / "console.txt"  # the guest's serial console, written as it runs (for a slow guest's progress)
    with (
        open(log, "w") as out,
        subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT) as vm,
    ):
        try:
            vm.wait(timeout=BOOT_SECONDS[accel])
        except subprocess.TimeoutExpired:
            vm.kill()
            pytest.fail(
                f"the guest did not finish in {BOOT_SECONDS[accel]} s ({accel}):\n"
                f"{log.read_text(errors='replace')[-4000:]}"
            )
    console = log.read_text(errors="replace")
    assert f"guest: Linux {modules.name}" in console, console[-4000:]
    rc = RC_LINE.search(console)
    assert rc and rc.group(1) == "0", console[-4000:]
    assert re.search(r"\d+ passed", console) and "skipped" not in console, console[-4000:]
