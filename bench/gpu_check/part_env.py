"""The machine: nvidia-smi, the kernel, the versions of Python and every package the check uses, and what is missing."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys

from .common import ROOT, Context, checkout_version, cuda_available, run, write_status

NAME = "env"
FILE = "env.txt"
TITLE = "The machine: nvidia-smi and versions"
LIMIT_S = 20.0
PACKAGES = ("torch", "numpy", "rich", "pytest", "transformers", "jax", "jaxlib", "triton", "nvidia-ml-py", "pynvml")
COMMANDS = (
    ["nvidia-smi"],
    ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap,pci.bus_id", "--format=csv"],
    ["nvcc", "--version"],
)


def versions() -> list[str]:
    lines = [f"python {platform.python_version()} ({os.path.realpath(sys.executable)})"]
    for name in PACKAGES:
        try:
            lines.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            lines.append(f"{name} MISSING")
    return lines


def torch_lines() -> list[str]:
    try:
        import torch
    except Exception as exc:
        return [f"torch: cannot import ({exc})"]
    lines = [f"torch.version.cuda {torch.version.cuda}", f"cuda available: {torch.cuda.is_available()}"]
    if cuda_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            lines.append(f"cuda:{i} {p.name}, {p.total_memory} bytes, compute {p.major}.{p.minor}")
        lines.append(f"allocator backend: {torch.cuda.get_allocator_backend()}")
    return lines


def machine_lines() -> list[str]:
    ldconfig = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True) if shutil.which("ldconfig") else None
    libcuda = [
        ln.split("=>")[-1].strip() for ln in (ldconfig.stdout if ldconfig else "").splitlines() if "libcuda.so" in ln
    ]
    return [
        f"checkout: {checkout_version()}",
        f"kernel {platform.release()} ({platform.machine()}), root: {os.geteuid() == 0}",
        f"BTF: {os.path.exists('/sys/kernel/btf/vmlinux')}",
        f"libcuda.so: {', '.join(libcuda) or 'not in ldconfig'}",
        "tools: " + ", ".join(f"{t} {'yes' if shutil.which(t) else 'MISSING'}" for t in ("clang", "bpftool", "nvcc")),
        f"agent BPF object built: {(ROOT / 'src/gpuflame/agent/bpf/agent.bpf.o').exists()}",
    ]


def main(ctx: Context) -> None:
    status = "ok" if cuda_available() else "ok (no CUDA here: the CPU machine's versions)"
    sections = [("versions", versions()), ("torch", torch_lines()), ("machine", machine_lines())]
    body = "\n\n".join(f"## {title}\n\n" + "\n".join(lines) for title, lines in sections)
    for argv in COMMANDS:
        if shutil.which(argv[0]) is None:
            body += f"\n\n## {' '.join(argv)}\n\nnot installed"
            continue
        done = run(argv, 10)
        body += f"\n\n## {' '.join(argv)}\n\n{done.stdout.strip() or done.why()}"
    write_status(ctx.out / FILE, TITLE, status, body)
