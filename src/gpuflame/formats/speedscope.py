"""speedscope's JSON file format (https://www.speedscope.app/file-format-schema.json).

One sample type is written per file. The layout:

- ``shared.frames``: each frame the written samples use, once, with ``name``
  and, where known, ``file`` and ``line``.
- ``profiles``: one ``sampled`` profile per process (the ``pid`` label) when
  samples carry one, named ``pid 1234``, plus ``no pid`` for samples without
  it; otherwise a single profile named after the sample type. Samples with
  equal stacks are summed, zero sums are left out, stacks are root first.
- ``unit`` is ``bytes`` for byte types, speedscope's own name for time units,
  and ``none`` for counts.

speedscope sums weights into widths and cannot show a negative one, so a
diff profile with values below zero is refused with a plain error rather
than drawn wrongly.
"""

from __future__ import annotations

import json

from gpuflame import __version__
from gpuflame.errors import GpuflameError
from gpuflame.model.functions import function_frames
from gpuflame.model.profile import Frame, Profile

SCHEMA = "https://www.speedscope.app/file-format-schema.json"
PID_LABEL = "pid"

# speedscope's ValueUnit names; everything else (count, objects ...) is "none"
_UNITS = {
    "bytes": "bytes",
    "nanoseconds": "nanoseconds",
    "microseconds": "microseconds",
    "milliseconds": "milliseconds",
    "seconds": "seconds",
}


def unit_of(unit: str) -> str:
    """speedscope's unit for a pprof unit."""
    return _UNITS.get(unit, "none")


def encode(profile: Profile, type_index: int, name: str | None = None) -> str:
    """A speedscope JSON document of one sample type."""
    st = profile.sample_types[type_index]
    groups = _group_by_process(profile, type_index)
    shared = _SharedFrames(function_frames(profile.frames))
    index = shared.__getitem__
    profiles = []
    for title, stacks in groups:
        samples = [list(map(index, reversed(stack))) for stack in stacks]
        weights = list(stacks.values())
        profiles.append(
            {
                "type": "sampled",
                "name": title or str(st),
                "unit": unit_of(st.unit),
                "startValue": 0,
                "endValue": sum(weights),
                "samples": samples,
                "weights": weights,
            }
        )
    doc = {
        "$schema": SCHEMA,
        "name": name or f"gpuflame {st}",
        "exporter": f"gpuflame {__version__}",
        "activeProfileIndex": 0,
        "shared": {"frames": shared.entries},
        "profiles": profiles,
    }
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n"


def _group_by_process(profile: Profile, type_index: int) -> list[tuple[str, dict[tuple[int, ...], int]]]:
    """``(profile name, {stack: summed value})`` per pid label, or one group without a name."""
    groups: dict[str | None, dict[tuple[int, ...], int]] = {}
    for s in profile.samples:
        value = s.values[type_index]
        if value < 0:
            raise GpuflameError(
                "speedscope cannot show negative values (this looks like a diff); "
                "export it as pprof or folded instead"
            )
        pid = s.label(PID_LABEL)
        stacks = groups.setdefault(pid, {})
        stacks[s.stack] = stacks.get(s.stack, 0) + value
    keyed = [(pid, {k: v for k, v in stacks.items() if v}) for pid, stacks in groups.items()]
    keyed.sort(key=lambda item: _pid_order(item[0]))
    if len(keyed) == 1 and keyed[0][0] is None:
        return [("", keyed[0][1])]
    if not keyed:
        return [("", {})]
    return [(f"pid {pid}" if pid is not None else "no pid", stacks) for pid, stacks in keyed]


def _pid_order(pid: str | None) -> tuple[int, int, str]:
    """Numeric pids in numeric order, then other text, then samples without a pid."""
    if pid is None:
        return (2, 0, "")
    if pid.isdigit() and pid.isascii():
        return (0, int(pid), pid)
    return (1, 0, pid)


class _SharedFrames(dict):  # type: ignore[type-arg]
    """``model frame id -> index in shared.frames``, adding each function on first use.

    A speedscope frame is a function, as a flame-graph bar is: its line is
    where the function is defined (:func:`gpuflame.model.functions.function_frames`).
    """

    def __init__(self, table: list[Frame]) -> None:
        super().__init__()
        self._table = table
        self._index: dict[Frame, int] = {}
        self.entries: list[dict[str, object]] = []

    def __missing__(self, fid: int) -> int:
        frame = self._table[fid]
        idx = self._index.get(frame)
        if idx is not None:
            self[fid] = idx
            return idx
        idx = self[fid] = self._index[frame] = len(self.entries)
        entry: dict[str, object] = {"name": frame.name}
        if frame.file:
            entry["file"] = frame.file
        if frame.line > 0:
            entry["line"] = frame.line
        self.entries.append(entry)
        return idx
