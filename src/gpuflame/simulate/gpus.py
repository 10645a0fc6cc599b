"""Device sizes for ``--gpu-memory``: a size, or a GPU's name from a small table."""

from __future__ import annotations

from gpuflame.errors import GpuflameError
from gpuflame.units import parse_size

MiB = 1 << 20
CUDA_CONTEXT = 512 * MiB  # what the CUDA context and its libraries take before the allocator gets any (typical)
MAX_DEVICE = 1 << 40  # no GPU has more memory than this: a larger size is a mistake or a damaged file

# total memory as nvidia-smi reports it (MiB), by the names users write
GPUS = {
    "T4": 15360,
    "V100-16GB": 16384,
    "V100-32GB": 32768,
    "L4": 23034,
    "A10": 23028,
    "A10G": 23028,
    "RTX-3090": 24576,
    "RTX-4090": 24564,
    "L40S": 46068,
    "A100-40GB": 40960,
    "A100-80GB": 81920,
    "H100-80GB": 81559,
    "H100-94GB": 95830,
    "H200": 143771,
    "B200": 183359,
}


def capacity(text: str) -> tuple[int, str]:
    """The bytes the allocator may reserve on *text* (a size or a GPU name), and how that was reached."""
    key = text.strip().upper().replace(" ", "-").replace("_", "-")
    if key in GPUS:
        total = GPUS[key] * MiB
        return total - CUDA_CONTEXT, f"{key}: {GPUS[key]} MiB less {CUDA_CONTEXT // MiB} MiB for the CUDA context"
    if text.strip().startswith("-"):
        raise GpuflameError(f"--gpu-memory: a device's memory cannot be negative: {text!r}")
    try:
        total = parse_size(text)
    except ValueError:
        raise GpuflameError(
            f"--gpu-memory: not a size or a known GPU: {text!r} (a size such as 24GiB, or one of {', '.join(GPUS)})"
        ) from None
    if total > MAX_DEVICE:
        raise GpuflameError(f"--gpu-memory: {text!r} is larger than any GPU (none has more than 1 TiB)")
    if total <= CUDA_CONTEXT:
        raise GpuflameError(f"--gpu-memory: {text!r} is not more than the CUDA context ({CUDA_CONTEXT // MiB} MiB)")
    return total - CUDA_CONTEXT, f"{text.strip()} less {CUDA_CONTEXT // MiB} MiB for the CUDA context"


def that_fit(least: int | None) -> list[str]:
    """The table's GPUs with at least *least* bytes of memory, smallest first (one name per size)."""
    if least is None:
        return []
    seen: set[int] = set()
    out = []
    for name, mib in sorted(GPUS.items(), key=lambda kv: kv[1]):
        if mib * MiB >= least and mib not in seen:
            seen.add(mib)
            out.append(name)
    return out


STEP = 64 << 20  # min_gpu_memory's resolution: the smallest device is searched in these steps


def fits_on(least: int | None) -> str:
    """*least* as a --gpu-memory value and the GPUs of the table it names, in words."""
    if least is None:
        return "no device up to 1 TiB"
    names = that_fit(least)
    gpus = (
        "every GPU of the table"
        if len(names) == len(set(GPUS.values()))
        else ("GPUs that fit: " + ", ".join(names) if names else "none of the table's GPUs")
    )
    return f"{least // MiB} MiB, in steps of {STEP // MiB} MiB (--gpu-memory {least // MiB}MiB); {gpus}"
