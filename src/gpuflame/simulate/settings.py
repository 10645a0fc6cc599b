"""The caching allocator's settings: ``PYTORCH_CUDA_ALLOC_CONF`` parsed as PyTorch parses it.

One owner for the settings the simulation follows (``max_split_size_mb``,
``max_non_split_rounding_mb``, ``roundup_power2_divisions``,
``garbage_collection_threshold``, ``expandable_segments``), read from a
``--alloc-conf`` string, from a snapshot's ``allocator_settings``, or
PyTorch's defaults. Keys PyTorch accepts that do not change where device
blocks go (pinned-memory, lock and graph-capture options) are accepted and
ignored; ``backend:cudaMallocAsync`` (another allocator) and any other key
are refused rather than silently dropped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpuflame.errors import GpuflameError

MB = 1 << 20
SIZE_MAX = (1 << 64) - 1  # PyTorch's "no limit" (std::numeric_limits<size_t>::max())
LARGE_BUFFER = 20 * MB  # kLargeBuffer: also max_non_split_rounding's default
INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: 1 MiB .. 32 GiB, one power of two each
# keys that act on host (pinned) memory, on the allocator's lock, or on CUDA graph capture only: they change
# nothing in where device blocks go (graphs' private pools are not modelled), so they are accepted and ignored
IGNORED_KEYS = frozenset(
    (
        "release_lock_on_cudamalloc",
        "pinned_use_cuda_host_register",
        "pinned_num_register_threads",
        "pinned_use_background_threads",
        "graph_capture_record_stream_reuse",
        "pinned_reserve_segment_size_mb",
    )
)


@dataclass(frozen=True)
class Settings:
    """What decides block placement; the defaults are PyTorch's."""

    max_split_size: int = SIZE_MAX
    max_non_split_rounding: int = LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = (0,) * INTERVALS
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False

    def divisions(self, size: int) -> int:
        """roundup_power2_divisions(size): the interval of *size*'s power of two, from 1 MiB up."""
        index = min(max(size.bit_length() - 1 - 20, 0), INTERVALS - 1)
        return self.roundup_power2_divisions[index]

    def describe(self) -> str:
        """The settings in PYTORCH_CUDA_ALLOC_CONF syntax, only those that differ from the defaults."""
        parts = []
        if self.max_split_size != SIZE_MAX:
            parts.append(f"max_split_size_mb:{self.max_split_size // MB}")
        if self.max_non_split_rounding != LARGE_BUFFER:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding // MB}")
        if any(self.roundup_power2_divisions):
            d = self.roundup_power2_divisions
            if len(set(d)) == 1:
                parts.append(f"roundup_power2_divisions:{d[0]}")
            else:
                parts.append("roundup_power2_divisions:[" + ",".join(f"{1 << i}:{v}" for i, v in enumerate(d)) + "]")
        if self.garbage_collection_threshold:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold:g}")
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        return ",".join(parts) or "PyTorch defaults"


DEFAULTS = Settings()


def parse_alloc_conf(text: str, base: Settings = DEFAULTS) -> Settings:
    """*text* in PYTORCH_CUDA_ALLOC_CONF syntax (``key:value,key:value``) over *base*; bad input raises."""
    out = base
    for key, value in _pairs(text):
        if key in IGNORED_KEYS or (key == "backend" and value == "native"):
            continue
        if key in REFUSED:
            raise GpuflameError(f"--alloc-conf: {key}:{value}: " + REFUSED[key])
        parse = _PARSERS.get(key)
        if parse is None:
            known = ", ".join(sorted(_PARSERS))
            raise GpuflameError(f"--alloc-conf: unknown setting {key!r} (the simulation knows {known})")
        out = replace(out, **{_FIELDS[key]: parse(value)})
    return out


REFUSED = {
    "backend": "a different allocator (CUDA's own cudaMallocAsync pools), which the simulation does not model; "
    "it replays backend:native, PyTorch's caching allocator",
    "per_process_memory_fraction": "give it as --memory-fraction F (with --gpu-memory), "
    "which models the limit and the garbage collector it turns on",
}


def _pairs(text: str) -> list[tuple[str, str]]:
    """Split on commas outside brackets (``roundup_power2_divisions:[256:1,>:4]``)."""
    pairs, depth, start = [], 0, 0
    for i, ch in enumerate(text + ","):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            item = text[start:i].strip()
            start = i + 1
            if not item:
                continue
            key, sep, value = item.partition(":")
            if not sep:
                raise GpuflameError(f"--alloc-conf: expected key:value, got {item!r}")
            pairs.append((key.strip(), value.strip()))
    return pairs


def _mb_above_large_buffer(key: str) -> Any:
    def parse(value: str) -> int:
        mb = _int(key, value)
        if mb <= LARGE_BUFFER // MB:
            raise GpuflameError(f"--alloc-conf: {key} must be more than {LARGE_BUFFER // MB} (PyTorch's rule)")
        return mb * MB

    return parse


def _threshold(value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        v = -1.0
    if not 0.0 < v < 1.0:
        raise GpuflameError(f"--alloc-conf: garbage_collection_threshold must be between 0 and 1, got {value!r}")
    return v


def _bool(value: str) -> bool:
    if value not in ("True", "False", "true", "false"):
        raise GpuflameError(f"--alloc-conf: expandable_segments is True or False, got {value!r}")
    return value.lower() == "true"


def _divisions(value: str) -> tuple[int, ...]:
    """A power of two for every size, or ``[MB:div,...,>:div]`` per interval (MB a power of two)."""
    if not value.startswith("["):
        return (_power_of_two("roundup_power2_divisions", value),) * INTERVALS
    if not value.endswith("]"):
        raise GpuflameError(f"--alloc-conf: roundup_power2_divisions list is not closed: {value!r}")
    out: list[int | None] = [None] * INTERVALS
    last = -1
    for item in filter(None, (s.strip() for s in value[1:-1].split(","))):
        key, _, div = item.partition(":")
        d = _power_of_two("roundup_power2_divisions", div)
        if key.strip() == ">":
            out[last + 1 :] = [d] * (INTERVALS - last - 1)
            continue
        mb = _power_of_two("roundup_power2_divisions", key)
        last = min(max(mb.bit_length() - 1, 0), INTERVALS - 1)
        out[last] = d
    first = next((d for d in out if d is not None), 0)
    filled, prev = [], first
    for given in out:  # an interval without its own value takes the one below it (the first: the first given)
        prev = given if given is not None else prev
        filled.append(prev)
    return tuple(filled)


def _power_of_two(key: str, value: str) -> int:
    n = _int(key, value)
    if n and n & (n - 1):
        raise GpuflameError(f"--alloc-conf: {key} takes powers of two, got {value!r}")
    return n


def _int(key: str, value: str) -> int:
    if not re.fullmatch(r"\d+", value.strip()):
        raise GpuflameError(f"--alloc-conf: {key} takes a whole number, got {value!r}")
    return int(value)


_PARSERS: dict[str, Any] = {
    "max_split_size_mb": _mb_above_large_buffer("max_split_size_mb"),
    "max_non_split_rounding_mb": lambda v: _int("max_non_split_rounding_mb", v) * MB,
    "roundup_power2_divisions": _divisions,
    "garbage_collection_threshold": _threshold,
    "expandable_segments": _bool,
}
_FIELDS = {
    "max_split_size_mb": "max_split_size",
    "max_non_split_rounding_mb": "max_non_split_rounding",
    "roundup_power2_divisions": "roundup_power2_divisions",
    "garbage_collection_threshold": "garbage_collection_threshold",
    "expandable_segments": "expandable_segments",
}


def from_recorded(recorded: Any) -> Settings | None:
    """A snapshot's ``allocator_settings`` (None when absent or unreadable: the caller falls back)."""
    if not isinstance(recorded, Mapping):
        return None
    out = DEFAULTS
    split = recorded.get("max_split_size")
    if type(split) is int and split > 0:
        out = replace(out, max_split_size=split)
    rounding = recorded.get("max_non_split_rounding_size")
    if type(rounding) is int and rounding > 0:
        out = replace(out, max_non_split_rounding=rounding)
    gc = recorded.get("garbage_collection_threshold")
    if isinstance(gc, (int, float)) and 0.0 < gc < 1.0:
        out = replace(out, garbage_collection_threshold=float(gc))
    if recorded.get("expandable_segments") is True:
        out = replace(out, expandable_segments=True)
    divs = recorded.get("roundup_power2_divisions")
    if isinstance(divs, Mapping):
        table = [0] * INTERVALS
        for key, value in divs.items():
            if isinstance(key, str) and key.isdigit() and type(value) is int and value >= 0:
                table[min(max(int(key).bit_length() - 1, 0), INTERVALS - 1)] = value
        out = replace(out, roundup_power2_divisions=tuple(table))
    return out
