"""Build the agent's BPF object: ``python -m gpuflame.agent.build`` (``make bpf``).

CO-RE: the object is compiled once, against a ``vmlinux.h`` dumped from the
build machine's kernel BTF, and libbpf relocates its field accesses to the
running kernel's layout at load time. So it is built when the package is built
(the wheel and the container image carry ``agent.bpf.o``), never on a
production node; a source checkout builds it with this module (the tests do,
once, when it is missing or older than its sources). Needs clang and bpftool.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

BPF_DIR = Path(__file__).resolve().parent / "bpf"
SOURCE = BPF_DIR / "agent.bpf.c"
HEADER = BPF_DIR / "agent.h"
OBJECT = BPF_DIR / "agent.bpf.o"
KERNEL_BTF = "/sys/kernel/btf/vmlinux"
ENV_OBJECT = "GPUFLAME_AGENT_BPF"  # use this object instead of the packaged one


class BuildError(RuntimeError):
    """The toolchain is missing or refused the source; the message says which."""


def object_path() -> Path:
    """Where the agent loads its BPF object from."""
    return Path(os.environ.get(ENV_OBJECT) or OBJECT)


def up_to_date(obj: Path = OBJECT) -> bool:
    return obj.exists() and obj.stat().st_mtime >= max(SOURCE.stat().st_mtime, HEADER.stat().st_mtime)


def toolchain_missing() -> str | None:
    """Why the object cannot be built here, or None."""
    for tool in ("clang", "bpftool"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"{tool} is not installed (Debian: apt-get install clang bpftool libbpf-dev)"
    if not os.path.exists("/usr/include/bpf/bpf_helpers.h"):
        return "libbpf's headers are not installed (Debian: apt-get install libbpf-dev)"
    if not os.path.exists(KERNEL_BTF):
        return f"this kernel has no BTF ({KERNEL_BTF}) to generate vmlinux.h from"
    return None


def build(out: Path = OBJECT) -> Path:
    """Compile agent.bpf.c to *out*; raises :class:`BuildError`."""
    missing = toolchain_missing()
    if missing:
        raise BuildError(missing)
    bpftool = shutil.which("bpftool") or "/usr/sbin/bpftool"
    with tempfile.TemporaryDirectory(prefix="gpuflame-bpf-") as tmp:
        vmlinux = Path(tmp) / "vmlinux.h"
        with open(vmlinux, "w") as f:
            _run([bpftool, "btf", "dump", "file", KERNEL_BTF, "format", "c"], stdout=f)
        partial = Path(tmp) / "agent.bpf.o"
        _run(
            [
                "clang",
                "-O2",
                "-g",
                "-target",
                "bpf",
                "-D__TARGET_ARCH_x86",
                "-Wall",
                "-Wno-unused-value",
                f"-I{tmp}",
                f"-I{BPF_DIR}",
                "-c",
                str(SOURCE),
                "-o",
                str(partial),
            ]
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(partial), str(out))
    return out


def source_checkout() -> bool:
    """Running from a git checkout (where sources change), not from an installed package."""
    return (BPF_DIR.parents[3] / ".git").exists()


def ensure() -> Path:
    """The object; built first when missing, or when stale in a source checkout.

    An installed package's object is used as it is: its files' times say
    nothing (installers write them in any order), and a node must not compile.
    """
    path = object_path()
    if os.environ.get(ENV_OBJECT) or up_to_date(path) or (path.exists() and not source_checkout()):
        return path
    return build(path)


def _run(cmd: list[str], stdout: IO[str] | None = None) -> None:
    try:
        result = subprocess.run(cmd, stdout=stdout or subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        raise BuildError(f"cannot run {cmd[0]}: {exc}") from exc
    if result.returncode != 0:
        raise BuildError(f"{' '.join(cmd[:3])} failed:\n{result.stderr.strip()[-3000:]}")


def main() -> int:
    try:
        path = build()
    except BuildError as exc:
        sys.stderr.write(f"gpuflame agent build: {exc}\n")
        return 2
    sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
