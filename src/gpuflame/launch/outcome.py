"""What a run says at its end: every loss, then where the profile is and what to do next (or ``--json``)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from gpuflame.boundary.backends import AUTO, frameworks
from gpuflame.defaults import MIN_INTERVAL_S
from gpuflame.errors import GpuflameError
from gpuflame.launch.store import RunMeta
from gpuflame.model import Profile
from gpuflame.model.process_table import process_rows, spread_word, uneven
from gpuflame.printable import printable
from gpuflame.units import format_bytes


def write_meta(meta: RunMeta, run_dir: Path) -> None:
    """``meta.json`` in the store; when it cannot be written, that is one more loss (said with the others)."""
    try:
        meta.write(run_dir)
    except GpuflameError as exc:
        meta.lost.append(f"the run's metadata could not be written ({exc}): gpuflame serve will not list it")


MAX_PROCESS_LINES = 16  # a run of 64 ranks and their loader workers: the rest is report's


def note_processes(meta: RunMeta, merged: Profile) -> None:
    """Each process of a run of several (or of a ranked one) and how uneven they were, into *meta*."""
    rows = process_rows(merged)
    if len(rows) < 2 and not any(r.info.rank for r in rows):
        return
    meta.per_process = [r.to_dict() for r in rows]
    spread = uneven(rows)
    meta.uneven = spread.to_dict() if spread else None


def say_where(
    output: Path, meta: RunMeta, idle: dict[int, str], peak_note: str, as_json: bool = False, joint: bool = True
) -> None:
    """Every loss on stderr, then the profile's place and size and the next command (or one JSON line on stdout).

    *joint*: the processes' shares are of one moment (``report``'s "at the joint peak"); else each one's
    share is its own peak, as ``report`` says "at the peak".
    """
    for message in meta.lost:
        say(sys.stderr, f"gpuflame: lost: {printable(message)}\n")  # written by the program's process: untrusted
    for partial in meta.partial_processes:
        say(sys.stderr, f"gpuflame: {printable(str(partial['why']))}\n")
    if as_json:
        summary = {**asdict(meta), "profile": str(output.resolve()) if meta.processes else None}
        say(sys.stdout, json.dumps(summary) + "\n")
        return
    if not meta.processes:
        why = "see what was lost above" if meta.lost else _why_nothing(meta.backend, idle)
        say(sys.stderr, f"gpuflame: no profile was written: {why}\n")
        return
    if not any(meta.totals.values()):
        why = "see what was lost above" if meta.lost else _why_empty(meta)
        say(sys.stderr, f"gpuflame: the profile is empty ({why}): {output}\n")
        return
    shown = next((t for t in ("peak_space", "inuse_space", "alloc_space") if t in meta.totals), None)
    size = f", {shown.split('_')[0]} {format_bytes(meta.totals[shown])}" if shown else ""
    say(sys.stderr, f"gpuflame: profile of {_processes_phrase(meta)}{size}: {printable(str(output))}\n")
    for line in _process_lines(meta, joint):
        say(sys.stderr, f"gpuflame: {line}\n")
    if peak_note:  # the peak is not one moment that happened (JAX samples, a bound): say what it is
        say(sys.stderr, f"gpuflame: {peak_note}\n")
    say(sys.stderr, f"gpuflame: next: gpuflame report {shlex.quote(str(output))}\n")


def _process_lines(meta: RunMeta, joint: bool = True) -> list[str]:
    """A line per process (rank, pid, own peak and when, share of the joint peak, command), then how uneven."""
    lines = []
    for p in map(_fields, meta.per_process[:MAX_PROCESS_LINES]):
        when = f" at {p['peak_s']:.3f} s" if p.get("peak_s") is not None else ""
        own = f"own peak {format_bytes(p['peak'])}{when}, " if p.get("peak") else ""
        words = [str(w) for w in p.get("command") or []]
        command = f": {' '.join([os.path.basename(words[0]), *words[1:]])}" if words else ""  # the program by name
        at = "at the joint peak" if joint else "at the peak"
        lines.append(printable(f"{_who(p)}: {own}{format_bytes(p['at_joint_peak'])} {at}{command}"))
    if len(meta.per_process) > MAX_PROCESS_LINES:
        lines.append(f"... {len(meta.per_process) - MAX_PROCESS_LINES} more processes: see gpuflame report")
    lines += _held_nothing(meta)
    if meta.uneven:
        u = _fields(meta.uneven)
        big, small = _fields(u["largest"]), _fields(u["smallest"])
        lines.append(
            f"{u['of']} {spread_word(float(u['ratio']))}: {_who(big)} peaked at {format_bytes(big['peak'])}, "
            f"{_who(small)} at {format_bytes(small['peak'])}: the largest peak is {u['ratio']:.2f}x the smallest"
        )
    return lines


def _held_nothing(meta: RunMeta) -> list[str]:
    """The processes counted in the run but shown in no line: they recorded, and held no memory at any moment.

    torchrun's own launcher imports torch and allocates nothing: 'profile of 3 processes' above two
    rank lines left the third unexplained.
    """
    if not meta.per_process:
        return []
    shown = {str(_fields(p).get("pid")) for p in meta.per_process}
    idle = [pid for pid in meta.processes if str(pid) not in shown]
    if not idle:
        return []
    pids = ", ".join(f"pid {pid}" for pid in idle[:5]) + (f" and {len(idle) - 5} more" if len(idle) > 5 else "")
    if _sampled_only(meta):
        return [f"{pids}: recorded, but no live buffers at any sample ({SAMPLED_BLIND})"]
    return [f"{pids}: recorded, but held no memory at any moment (a launcher, a worker given no task)"]


# what JAX's sampled recording cannot see (backend jax: live buffers only, at each sample)
SAMPLED_BLIND = (
    "JAX's live buffers are sampled at the start, at exit, at each gpuflame.phase change and every --interval: "
    f"arrays made and freed between samples are not seen; --interval {MIN_INTERVAL_S * 1000:g}ms or gpuflame.phase "
    "samples more often"
)


def _sampled_only(meta: RunMeta) -> bool:
    """In-use totals and no allocation totals: only JAX's sampled live buffers were recorded (every torch
    recorder counts allocations; JAX lists live buffers only)."""
    return "inuse_space" in meta.totals and "alloc_space" not in meta.totals


def _why_empty(meta: RunMeta) -> str:
    """Why a profile holds nothing: nothing allocated, or (JAX) nothing live when it was sampled.

    A JAX worker that made and freed 24 MiB between its samples at start and at exit was said to have
    allocated nothing while recording.
    """
    if _sampled_only(meta):
        return f"no live buffers at any sample: {SAMPLED_BLIND}"
    return "nothing was allocated while recording"


def _fields(entry: object) -> dict[str, Any]:
    """A row of meta.json (written by :func:`note_processes`) as the mapping it is."""
    return entry if isinstance(entry, dict) else {}


def _who(p: dict[str, Any]) -> str:
    return f"rank {p['rank']} (pid {p['pid']})" if p.get("rank") is not None else f"pid {p['pid']}"


def say(stream: TextIO | None, text: str) -> None:
    """Write *text* if the stream takes it: a closed one (``2>&-``, ``>&-``) must not cost the program's exit code.

    Every line the launcher writes while the program runs or after it ends goes through here.
    """
    if stream is None:  # Python's stand-in for a descriptor closed at start
        return
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):  # a reader that went away, a stream closed under us
        pass


def _processes_phrase(meta: RunMeta) -> str:
    """``3 processes``; ``2 of 3 processes (1 lost: see above)``; never a count that hides a loss."""
    done, lost, partial = len(meta.processes), len(meta.lost_processes), len(meta.partial_processes)
    total = done + lost
    noun = "process" if total == 1 else "processes"
    counted = f"{done} of {total} {noun}" if lost else f"{done} {noun}"
    notes = [f"{lost} lost"] * bool(lost) + [f"{partial} partial"] * bool(partial)
    return counted + (f" ({', '.join(notes)}: see above)" if notes else "")


def _why_nothing(backend: str, idle: dict[int, str]) -> str:
    """What really happened when no process recorded: which framework never came, and what did."""
    never = " or ".join(frameworks(backend))
    head = f"{never} was never imported" if backend != AUTO else f"no process imported {never}"
    seen = "; ".join(f"pid {pid} {note}" for pid, note in sorted(idle.items()))
    return f"{head} (--backend {backend})" + (f"; {seen}" if seen else "")
