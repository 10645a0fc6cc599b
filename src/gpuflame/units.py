"""Byte counts for humans (binary units, as nvidia-smi and PyTorch use)."""

from __future__ import annotations

import math
import re

from gpuflame.defaults import MAX_INTERVAL_S, MIN_INTERVAL_S

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: int | float, signed: bool = False) -> str:
    """``1536 -> '1.5 KiB'``; with *signed*, positive values get a ``+``."""
    sign = "-" if n < 0 else ("+" if signed and n > 0 else "")
    value = float(abs(n))
    unit = 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{sign}{int(value)} B"
    return f"{sign}{_fixed(value, 2 if value < 10 else 1)} {_UNITS[unit]}"


def _fixed(value: float, digits: int) -> str:
    """*value* with *digits* decimals, a tie rounded up as JavaScript's ``toFixed`` does.

    The viewer formats with ``toFixed``; Python's format rounds a tie to
    even (4.125 -> 4.12 where the viewer shows 4.13). One number must read
    the same in the terminal and in the browser.
    """
    num, den = value.as_integer_ratio()  # the float's exact value: the tie is decided as toFixed decides it
    scaled, rest = divmod(num * 10**digits, den)
    whole, part = divmod(scaled + (2 * rest >= den), 10**digits)
    return f"{whole}.{part:0{digits}d}"


def format_count(n: int, unit: str) -> str:
    """Format a sample value in its pprof unit (bytes get binary units)."""
    if unit == "bytes":
        return format_bytes(n)
    return f"{n:,}"


def percent(part: int | float, whole: int | float) -> float:
    """Share of *whole* in percent; 0 when there is nothing to share."""
    return 100.0 * part / whole if whole else 0.0


_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmgtp])(i)?)?(b)?\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_size(text: str) -> int:
    """``'10MiB'``, ``'1.5G'``, ``'4096'`` -> bytes.

    Units are binary (``1K`` = ``1KiB`` = 1024 bytes) with or without ``i``
    and ``B``, because every size gpuflame prints is binary and a user
    copies them back.
    """
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 4096, 512KiB, 10MiB, 1.5G)")
    number, unit = float(m.group(1)), (m.group(2) or "").lower()
    return int(round(number * 1024 ** _POWERS[unit]))


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(ms|s|m|h)?\s*$")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """``15s``, ``500ms``, ``2m``, ``1h``, ``1.5`` (seconds) -> seconds.

    One spelling for ``gpuflame run --interval`` and the webhook's
    ``gpuflame.io/interval`` annotation, so a value copied from one works in
    the other.
    """
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"not a duration: {text!r} (examples: 15s, 500ms, 2m)")
    return float(m.group(1)) * _SECONDS[m.group(2) or "s"]


def interval_seconds(value: str | float, allow_off: bool = True) -> float:
    """An interval between snapshots in seconds: 0 ("only at exit", where *allow_off*) or within the bounds.

    The one check of ``--interval``, the API's ``interval``,
    ``GPUFLAME_INTERVAL`` and the webhook's ``gpuflame.io/interval``
    (bounds and why: ``defaults.MIN_INTERVAL_S``). ValueError with one line
    that says what is allowed.
    """
    if isinstance(value, str):
        if value.strip().startswith("-"):
            raise ValueError(f"an interval cannot be negative: {value!r} (examples: 15s, 500ms, 2m)")
        seconds = parse_duration(value)
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"not a duration: {value!r} (seconds, or a text such as 15s, 500ms, 2m)")
    else:
        seconds = float(value)
    if seconds < 0:
        raise ValueError(f"an interval cannot be negative: {value!r} (examples: 15s, 500ms, 2m)")
    if seconds == 0 and allow_off:
        return 0.0
    if not (math.isfinite(seconds) and MIN_INTERVAL_S <= seconds <= MAX_INTERVAL_S):
        off = ", or 0 for only at exit" if allow_off else ""
        raise ValueError(
            f"interval {value!r} is out of range: from {MIN_INTERVAL_S * 1000:g}ms to {MAX_INTERVAL_S / 3600:g}h{off}"
        )
    return seconds
