"""The checks a test can fail: over its memory limit, leaking, or grown since the last run.

Each failure message says the limit, what was measured, and the stacks
responsible, in the flame graph's names (``LlamaMLP > forward``), read
bottom-up from the test function, so the reader knows where to look before
opening the profile.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from gpuflame.analysis.summary import Stack, top_stacks
from gpuflame.analysis.tree import build_tree
from gpuflame.model import Profile
from gpuflame.units import format_bytes, parse_size

STACKS_SHOWN = 3  # stacks listed in a failure
FRAMES_SHOWN = 6  # frames of a stack, the leaf end; deeper callers are elided


@dataclass(frozen=True)
class Tolerance:
    """How much a peak may grow: a share of the previous peak, or bytes."""

    share: float = 0.0
    bytes: int = 0

    @classmethod
    def parse(cls, text: str) -> Tolerance:
        """``5%`` or a size such as ``1MiB``; anything else is one ValueError that shows both forms."""
        text = text.strip()
        try:
            if text.endswith("%"):
                value = float(text[:-1])
                if not 0 <= value < float("inf"):
                    raise ValueError
                return cls(share=value / 100)
            return cls(bytes=parse_size(text))
        except ValueError:
            raise ValueError(f"not a tolerance: {text!r} (examples: 5%, 0%, 1MiB)") from None

    def allows(self, before: int, now: int) -> bool:
        return now <= before + max(self.bytes, int(before * self.share))

    def __str__(self) -> str:
        return f"{self.share * 100:g}%" if self.bytes == 0 else format_bytes(self.bytes)


def limit_of(marker_args: tuple, name: str, marker_kwargs: Mapping[str, object] | None = None) -> int:
    """The byte limit given to a ``limit_gpu_*`` marker: ``"2 GiB"`` or a number of bytes, or ``limit="2 GiB"``.

    The keyword is the name the marker's help gives (``limit_gpu_memory(limit)``).
    """
    kwargs = dict(marker_kwargs or {})
    if len(marker_args) + len(kwargs) != 1 or set(kwargs) - {"limit"}:
        raise ValueError(f'@pytest.mark.{name} takes one limit, such as "2 GiB" or limit="2 GiB"')
    value = marker_args[0] if marker_args else kwargs["limit"]
    try:
        return parse_size(str(value))  # an int too: a negative one is refused as "-5" is
    except ValueError as exc:
        raise ValueError(f"@pytest.mark.{name}: {exc}") from None


def stack_line(stack: Stack) -> str:
    """``4.00 MiB (100.0%)  test_x -> ... -> LlamaMLP > forward  (modeling_llama.py:164)``: the root, the leaf end."""
    from gpuflame.render.terminal import short_path  # rich: only for a test that fails

    names = [f.name for f in stack.frames]
    if len(names) > FRAMES_SHOWN:
        names = names[:1] + ["..."] + names[-(FRAMES_SHOWN - 1) :]
    where = short_path(shown(stack.where()))
    return f"  {format_bytes(stack.value):>10} ({stack.percent:5.1f}%)  {' -> '.join(names)}" + (
        f"  ({where})" if where else ""
    )


def stacks_at(profile: Profile, type_name: str, limit: int = STACKS_SHOWN) -> list[Stack]:
    """The widest stacks, one per allocating line: a failure names the line to change, and two lines of one
    function (4 MiB on one, 512 KiB on the next) must not read as 4.50 MiB on the first."""
    return top_stacks(build_tree(profile, profile.type_index(type_name), lines=True), limit)


def apart(first: int, second: int) -> tuple[str, str]:
    """Two sizes as the message shows them, with their bytes where they read the same.

    A peak of 4,000,000 B reads 3.81 MiB: a limit copied from it ("3.81 MiB",
    3,995,075 B) is still below it, and "peak 3.81 MiB is over the limit of 3.81 MiB" explains nothing.
    """
    one, two = format_bytes(first), format_bytes(second)
    if one != two:
        return one, two
    return f"{one} ({first:,} bytes)", f"{two} ({second:,} bytes)"


def over_limit(profile: Profile, peak: int, limit: int, saved: str) -> str:
    shown_peak, shown_limit = apart(peak, limit)
    lines = [
        f"gpuflame: peak {shown_peak} is over the limit of {shown_limit} "
        f"(limit_gpu_memory, {peak - limit:,} bytes over); fixtures not counted",
        "top stacks at the peak (test first, allocating function last):",
    ]
    lines += [stack_line(s) for s in stacks_at(profile, "peak_space")]
    lines += [
        _saved(saved),
        f"to pass: allocate less at the stacks above, or raise the limit to limit_gpu_memory({peak}) or more",
    ]
    return "\n".join(lines)


def leaks(profile: Profile, limit: int) -> list[Stack]:
    """The stacks that still hold more than *limit* at the end of the test, widest first."""
    return [s for s in stacks_at(profile, "inuse_space", limit=1_000) if s.value > limit]


def leaking(stacks: list[Stack], limit: int, saved: str) -> str:
    held = sum(s.value for s in stacks)
    lines = [
        f"gpuflame: {len(stacks)} stack{'s still hold' if len(stacks) > 1 else ' still holds'} "
        f"{format_bytes(held)} allocated during the test, each over the limit of "
        f"{format_bytes(limit)} per stack (limit_gpu_leaks):"
    ]
    lines += [stack_line(s) for s in stacks[:10]]
    if len(stacks) > 10:
        lines.append(f"  ... and {len(stacks) - 10} more")
    widest = max(s.value for s in stacks)
    lines += [
        _saved(saved),
        f"to pass: free what these stacks hold before the test returns, or raise the limit to "
        f"limit_gpu_leaks({widest}) or more",
    ]
    return "\n".join(lines)


def grew(profile: Profile, before: int, now: int, tolerance: Tolerance, saved: str) -> str:
    change = f"+{100 * (now - before) / before:.1f}%" if before else "from nothing"
    shown_before, shown_now = apart(before, now)
    lines = [
        f"gpuflame: peak grew from {shown_before} to {shown_now} ({change}, "
        f"{now - before:+,} bytes) since the last run; tolerance {tolerance} (--gpuflame-fail-on-increase)",
        "top stacks at the peak now:",
    ]
    lines += [stack_line(s) for s in stacks_at(profile, "peak_space")]
    return "\n".join(lines + [_saved(saved)])


def shown(path: str) -> str:
    """A path under the current folder relative to it, as pytest shows test files."""
    here = os.getcwd() + os.sep
    return path[len(here) :] if path.startswith(here) else path


def _saved(path: str) -> str:
    if not path:
        return "profile: not saved"
    return f"profile: {shown(path)}  (gpuflame view {shown(path)})"
