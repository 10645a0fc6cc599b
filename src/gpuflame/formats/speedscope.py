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

Reading (:func:`decode`) takes any file of the schema, ``sampled`` and
``evented`` profiles alike, and checks every value (the file is untrusted):

- one sample type per unit (``bytes`` -> ``space/bytes``, time units ->
  ``cpu/nanoseconds``, ``none`` -> ``samples/count``); what gpuflame wrote
  gets its own type back from the document's name (``gpuflame inuse_space/bytes``).
- a profile named ``pid N`` gives its samples the ``pid`` label; with
  several profiles, any other name is the ``profile`` label.
- a ``sampled`` profile: each stack (root first) with its weight; an
  ``evented`` one: the time between events, summed per open stack (frames
  must close in the order they opened).
- a frame's line is where its function is defined (what the writer puts
  there), so it is both the frame's line and its definition line.
- weights and times become whole numbers (time in nanoseconds), as pprof stores them.
- the counts of :mod:`gpuflame.limits` (samples, frames, stack depth) hold;
  JSON nested past the interpreter's recursion guard is refused.
"""

from __future__ import annotations

import json
import math
from typing import Any

from gpuflame import limits
from gpuflame.errors import GpuflameError, ProfileFormatError
from gpuflame.formats.safe_pickle import one_line
from gpuflame.model.functions import function_frames
from gpuflame.model.profile import Frame, Profile, Sample, SampleType
from gpuflame.printable import encodable
from gpuflame.symbols.kinds import guess_kind
from gpuflame.version import __version__

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
                "speedscope cannot show negative values (this looks like a diff); export it as pprof or folded instead"
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


class _SharedFrames(dict):
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


# -- reading -------------------------------------------------------------------

_TIME_NS = {"nanoseconds": 1, "microseconds": 1_000, "milliseconds": 1_000_000, "seconds": 1_000_000_000}
_INT64_MAX = (1 << 63) - 1
_WRITER_NAME = "gpuflame "


def is_speedscope(doc: object) -> bool:
    """Whether a parsed JSON document is a speedscope file (rather than, say, a flame tree)."""
    return isinstance(doc, dict) and (doc.get("$schema") == SCHEMA or ("shared" in doc and "profiles" in doc))


def decode(data: bytes | str) -> Profile:
    """Read a speedscope JSON file (see the module docstring)."""
    try:
        doc = json.loads(data)
    except RecursionError:
        raise ProfileFormatError("speedscope: the JSON nests too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProfileFormatError(f"speedscope: not valid JSON ({_short(exc)})") from None
    if not is_speedscope(doc):
        raise ProfileFormatError(
            "this is a JSON file but not a speedscope profile (a flame tree?); gpuflame reads "
            "speedscope JSON, gzip pprof, folded stacks and PyTorch snapshots"
        )
    return _Reader(doc).run()


def _short(exc: BaseException) -> str:
    text = str(exc).replace("\n", " ")
    return text if len(text) <= 100 else text[:97] + "..."


def _bad(what: str) -> ProfileFormatError:
    return ProfileFormatError(f"speedscope: {what}")


class _Reader:
    """One pass over a parsed document, every value checked; the limits kept as counters."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.max_depth = limits.STACK_DEPTH.value()
        self.max_samples = limits.SAMPLES.value()
        self.frames_left = limits.STACK_FRAMES.value()
        shared = doc.get("shared")
        frames = shared.get("frames") if isinstance(shared, dict) else None
        if not isinstance(frames, list):
            raise _bad("'shared.frames' is not a list")
        if len(frames) > limits.FRAMES.value():
            raise limits.FRAMES.exceeded("speedscope: the frame table")
        self.raw_frames = frames
        self.profile = Profile(sample_types=[])
        self.frame_ids: list[int] = [-1] * len(frames)
        self.types: dict[SampleType, int] = {}
        self.rows: list[tuple[tuple[int, ...], int, float, tuple[tuple[str, str], ...]]] = []

    def run(self) -> Profile:
        profiles = self.doc.get("profiles")
        if not isinstance(profiles, list):
            raise _bad("'profiles' is not a list")
        for n, entry in enumerate(profiles):
            if not isinstance(entry, dict):
                raise _bad(f"profile {n} is not an object")
            labels = self._labels(entry, len(profiles))
            kind = entry.get("type")
            unit = entry.get("unit")
            if not isinstance(unit, str) or (unit not in _UNITS and unit != "none"):
                raise _bad(f"profile {n} has unknown unit {_shown(unit)}")
            type_index = self._type_index(unit)
            scale = _TIME_NS.get(unit, 1)
            if kind == "sampled":
                stacks = self._sampled(entry, n)
            elif kind == "evented":
                stacks = self._evented(entry, n)
            else:
                raise _bad(f"profile {n} has unknown type {_shown(kind)} (expected 'sampled' or 'evented')")
            self.rows += [(stack, type_index, weight * scale, labels) for stack, weight in stacks.items()]
        return self._profile()

    def _labels(self, entry: dict[str, Any], count: int) -> tuple[tuple[str, str], ...]:
        name = entry.get("name", "")
        if not isinstance(name, str):
            raise _bad("a profile's name is not a string")
        name = encodable(name)
        if name.startswith("pid ") and name[4:].isdigit() and name[4:].isascii():
            return ((PID_LABEL, name[4:]),)
        return (("profile", name),) if count > 1 and name and name != "no pid" else ()

    def _type_index(self, unit: str) -> int:
        name = self.doc.get("name")
        if isinstance(name, str) and name.startswith(_WRITER_NAME) and name.endswith("/" + unit):
            kind = name[len(_WRITER_NAME) : -len(unit) - 1]
            st = SampleType(kind, unit)
        elif unit == "bytes":
            st = SampleType("space", "bytes")
        elif unit in _TIME_NS:
            st = SampleType("cpu", "nanoseconds")
        else:
            st = SampleType("samples", "count")
        index = self.types.get(st)
        if index is None:
            index = self.types[st] = len(self.types)
        return index

    def _stack(self, indices: object) -> tuple[int, ...]:
        """Frame ids, leaf first, of a root-first list of frame indices."""
        if not isinstance(indices, list):
            raise _bad("a sample is not a list of frame indices")
        if len(indices) > self.max_depth:
            raise limits.STACK_DEPTH.exceeded("speedscope: a stack")
        self.frames_left -= len(indices)
        if self.frames_left < 0:
            raise limits.STACK_FRAMES.exceeded("speedscope: the count of frames in all the samples' stacks")
        return tuple(self._frame(i) for i in reversed(indices))

    def _frame(self, index: object) -> int:
        if type(index) is float and index.is_integer():
            index = int(index)
        if type(index) is not int or not 0 <= index < len(self.frame_ids):
            raise _bad(f"a frame index {_shown(index)} is not in shared.frames")
        fid = self.frame_ids[index]
        if fid < 0:
            fid = self.frame_ids[index] = self.profile.frame_id(_read_frame(self.raw_frames[index]))
        return fid

    def _sampled(self, entry: dict[str, Any], n: int) -> dict[tuple[int, ...], float]:
        samples, weights = entry.get("samples"), entry.get("weights")
        if not isinstance(samples, list) or (weights is not None and not isinstance(weights, list)):
            raise _bad(f"profile {n}: 'samples' or 'weights' is not a list")
        if weights is not None and len(weights) != len(samples):
            raise _bad(f"profile {n} has {len(samples)} samples but {len(weights)} weights")
        self._count(len(samples))
        out: dict[tuple[int, ...], float] = {}
        for k, indices in enumerate(samples):
            stack = self._stack(indices)
            out[stack] = out.get(stack, 0) + (_number(weights[k], "a weight") if weights is not None else 1)
        return out

    def _evented(self, entry: dict[str, Any], n: int) -> dict[tuple[int, ...], float]:
        """Time per open stack. Stacks are nodes of a trie (one dict lookup per event, whatever the
        depth); only the nodes that held time become tuples, against the frames limit, since a few
        events deep inside a deep stack could otherwise ask for stacks quadratic in the file."""
        events = entry.get("events")
        if not isinstance(events, list):
            raise _bad(f"profile {n}: 'events' is not a list")
        self._count(len(events))
        children: dict[tuple[int, int], int] = {}
        parents: list[tuple[int, int]] = [(-1, -1)]  # node -> (parent node, frame id); node 0 is the root
        weight: dict[int, float] = {}
        path: list[int] = [0]  # the open nodes, root first
        last = _number(entry.get("startValue", 0), "startValue")
        for event in events:
            if not isinstance(event, dict):
                raise _bad(f"profile {n}: an event is not an object")
            at = _number(event.get("at"), "an event's time")
            if at < last:
                raise _bad(f"profile {n}: events go back in time ({at} after {last})")
            node = path[-1]
            if node:
                weight[node] = weight.get(node, 0) + (at - last)
            last = at
            fid = self._frame(event.get("frame"))
            kind = event.get("type")
            if kind == "O":
                if len(path) > self.max_depth:
                    raise limits.STACK_DEPTH.exceeded("speedscope: a stack")
                child = children.get((node, fid))
                if child is None:
                    child = children[(node, fid)] = len(parents)
                    parents.append((node, fid))
                path.append(child)
            elif kind == "C":
                if len(path) == 1 or parents[node][1] != fid:
                    raise _bad(f"profile {n}: a frame closes that is not the innermost open one")
                path.pop()
            else:
                raise _bad(f"profile {n}: an event's type is not 'O' or 'C'")
        if len(path) > 1:
            raise _bad(f"profile {n}: {len(path) - 1} frames are still open at the end")
        return self._stacks_of(weight, parents)

    def _stacks_of(self, weight: dict[int, float], parents: list[tuple[int, int]]) -> dict[tuple[int, ...], float]:
        room = limits.FRAMES.value()
        out: dict[tuple[int, ...], float] = {}
        for node, value in weight.items():
            stack = []
            while node:
                node, fid = parents[node]
                stack.append(fid)
            room -= len(stack)
            if room < 0:
                raise limits.FRAMES.exceeded("speedscope: the frames of an evented profile's stacks")
            out[tuple(stack)] = value
        return out

    def _count(self, added: int) -> None:
        self.max_samples -= added
        if self.max_samples < 0:
            raise limits.SAMPLES.exceeded("speedscope: the samples")

    def _profile(self) -> Profile:
        p = self.profile
        p.sample_types = list(self.types)
        width = len(p.sample_types)
        for stack, index, weight, labels in self.rows:
            value = round(weight)
            if not 0 <= value <= _INT64_MAX:
                raise _bad(f"a weight ({weight:g}) is negative or does not fit in 64 bits")
            if value:
                values = [0] * width
                values[index] = value
                p.samples.append(Sample(stack, tuple(values), labels))
        return p


def _read_frame(raw: object) -> Frame:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise _bad("a frame in shared.frames has no name")
    name, file, line = encodable(raw["name"]), raw.get("file", ""), raw.get("line", 0)
    if not isinstance(file, str):
        raise _bad(f"frame {_shown(name)}'s file is not a string")
    file = encodable(file)
    line = _number(line, "a frame's line")
    if isinstance(line, float) and not line.is_integer():
        raise _bad(f"frame {_shown(name)}'s line is not a whole number")
    line = int(line)
    if line < 0:
        raise _bad(f"frame {_shown(name)}'s line is out of range")
    # a speedscope frame is a function (as the writer makes it): its line is where it is defined
    return Frame(name, file, line, guess_kind(name, file), line)


def _number(value: object, what: str) -> float:
    if type(value) is int:  # any size in JSON: 10**400 is past float (math.isfinite and :g would overflow)
        if abs(value) > _INT64_MAX:
            shown = f"{value:g}" if value.bit_length() < 1000 else f"about 2**{value.bit_length()}"
            raise _bad(f"{what} ({shown}) does not fit in 64 bits")
        return value
    if type(value) is not float or not math.isfinite(value):
        raise _bad(f"{what} is not a finite number")
    if abs(value) > _INT64_MAX:
        raise _bad(f"{what} ({value:g}) does not fit in 64 bits")
    return value


def _shown(value: object) -> str:
    return one_line(repr(value), 40)
