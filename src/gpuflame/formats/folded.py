"""Folded stacks, as ``flamegraph.pl --countname bytes`` and speedscope read them.

One line per distinct stack, root first, frames joined by ``;``, then a space
and the summed value of one sample type::

    <module>;main;LlamaMLP > forward 12345

Writing (:func:`encode`):

- stacks with equal frame names are summed; stacks that sum to zero are
  left out; lines are sorted, as the ``stackcollapse`` scripts sort them.
- a ``;`` in a name becomes ``,`` and a line break a space, so every line
  stays one stack; an empty name becomes ``<unknown>``. flamegraph.pl splits
  the count off at the last whitespace, so other spaces in names are fine.
- with ``locations=True`` each frame is written py-spy style,
  ``name (file:line)``, when its file is known.
- values can be negative only in a diff profile (``gpuflame.model.diff``).
  flamegraph.pl skips such lines; gpuflame reads them back only when told
  (``allow_negative=True``): a negative size in a file handed to the CLI
  is damage, not a diff.

Reading (:func:`decode`):

- blank lines and trailing whitespace (``\\r`` included) are ignored; the
  count is the text after the last whitespace and must be a whole number,
  negative only with ``allow_negative=True`` (a diff).
- text whose first line ends in a word with no digit (``import torch``) is
  not folded stacks at all: "not a profile", not a complaint about a count.
- a frame written py-spy style, ``name (file.py:12)``, keeps its file and
  line; the kind comes from :func:`gpuflame.symbols.kinds.guess_kind`.
  Names are kept as written (py-spy's ``Model.forward`` is not respelled
  ``Model > forward``; search finds either spelling).
- every line becomes one sample of one sample type: the one gpuflame's
  first line names (``# gpuflame folded stacks: inuse_space (bytes)``),
  else ``samples/count`` (perf's and py-spy's folded stacks count
  samples, not bytes), unless told otherwise; lines and frames per line are bounded by
  :mod:`gpuflame.limits` (the time is linear in the text).
"""

from __future__ import annotations

import re

from gpuflame import limits
from gpuflame.errors import ProfileFormatError
from gpuflame.model.profile import Frame, Profile, Sample, SampleType
from gpuflame.symbols.kinds import guess_kind
from gpuflame.symbols.names import UNKNOWN

# A folded file says nothing of what its numbers are: perf's and py-spy's count samples. gpuflame's own
# files name their sample type on a first line that flamegraph.pl and speedscope skip (no count at its end).
DEFAULT_SAMPLE_TYPE = SampleType("samples", "count")
HEADER = "# gpuflame folded stacks: {type} ({unit})"
_HEADER = re.compile(r"# gpuflame folded stacks: ([A-Za-z0-9_./-]{1,64}) \(([A-Za-z0-9_]{1,32})\)")

# counts are stored as pprof int64 values
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

_UNSAFE = str.maketrans({";": ",", "\n": " ", "\r": " "})
_LINE = re.compile(r"(.*)\s(-?[0-9]+)")
_PYSPY = re.compile(r"(.*) \(([^()]*):([0-9]+)\)")


def frame_label(frame: Frame, locations: bool = False) -> str:
    """One frame as folded text: its name, made safe, plus ``(file:line)`` if asked."""
    name = frame.name.translate(_UNSAFE) or UNKNOWN
    if locations and frame.file:
        return f"{name} ({frame.file.translate(_UNSAFE)}:{frame.line})"
    return name


def encode(profile: Profile, type_index: int, locations: bool = False, header: bool = True) -> str:
    """Folded stacks of one sample type, one line per distinct stack, root first, after a :data:`HEADER`."""
    label = [frame_label(f, locations) for f in profile.frames].__getitem__
    by_ids: dict[tuple[int, ...], int] = {}
    for s in profile.samples:
        by_ids[s.stack] = by_ids.get(s.stack, 0) + s.values[type_index]
    # two frames can share a label (same name, other file), so sum again by text
    by_text: dict[str, int] = {}
    join = ";".join
    for stack, value in by_ids.items():
        text = join(map(label, reversed(stack)))
        by_text[text] = by_text.get(text, 0) + value
    lines = [f"{text} {value}\n" for text, value in sorted(by_text.items()) if value]
    if header:
        kind = profile.sample_types[type_index]
        lines.insert(0, HEADER.format(type=kind.type, unit=kind.unit) + "\n")
    return "".join(lines)


class _FrameIds(dict):
    """``folded frame text -> frame id`` in *profile*, parsing each distinct text once."""

    def __init__(self, profile: Profile) -> None:
        super().__init__()
        self._profile = profile
        self._room = limits.FRAMES.value()

    def __missing__(self, text: str) -> int:
        self._room -= 1
        if self._room < 0:
            raise limits.FRAMES.exceeded("folded stacks: the distinct frames")
        m = _PYSPY.fullmatch(text)
        if m:
            name, file, line = m.group(1), m.group(2), int(m.group(3))
        else:
            name, file, line = text, "", 0
        fid = self[text] = self._profile.frame_id(Frame(name, file, line, guess_kind(name, file)))
        return fid


def decode(
    text: str,
    sample_type: SampleType | tuple[str, str] | str | None = None,
    allow_negative: bool = False,
) -> Profile:
    """Read folded stacks; each line becomes one sample of *sample_type* (``type/unit``), else of the type the
    file's gpuflame header names, else of :data:`DEFAULT_SAMPLE_TYPE` (a count: another tool's samples)."""
    named = _HEADER.fullmatch(text[: text.find("\n")].rstrip() if "\n" in text else text.rstrip())
    if named:
        text = text[text.find("\n") + 1 :] if "\n" in text else ""
    chosen = sample_type or (SampleType(*named.groups()) if named else DEFAULT_SAMPLE_TYPE)
    profile = Profile(sample_types=[_sample_type(chosen)])
    frame_ids = _FrameIds(profile)
    lookup = frame_ids.__getitem__
    samples = profile.samples
    max_depth, max_samples = limits.STACK_DEPTH.value(), limits.SAMPLES.value()
    frames_left = limits.STACK_FRAMES.value()
    for number, raw in enumerate(text.split("\n"), start=2 if named else 1):
        line = raw.rstrip()
        if not line or line.startswith("# gpuflame folded stacks:") and _HEADER.fullmatch(line):
            continue  # blank, or the header of a second file appended to this one (cat a.folded b.folded)
        m = _LINE.fullmatch(line)
        if m is None:
            if not samples and not any(c.isdigit() for c in line.rsplit(None, 1)[-1]) and " " in line.strip():
                raise ProfileFormatError(_not_folded(number, line))
            raise ProfileFormatError(_bad_count(number, line))
        stack_text, count_text = m.groups()
        # int() refuses digit strings over 4300 long (ValueError), leading zeros
        # included; no int64 has over 19 significant digits
        digits = count_text.lstrip("-").lstrip("0")
        count = 1 << 64 if len(digits) > 19 else int(digits or "0")
        if count_text[0] == "-":
            count = -count
        if count < 0 and not allow_negative:
            raise ProfileFormatError(
                f"folded stacks, line {number}: the count {count} is negative "
                "(a size cannot be; to compare two profiles, use gpuflame diff)"
            )
        if not _INT64_MIN <= count <= _INT64_MAX:
            shown = count_text if len(count_text) <= 40 else count_text[:37] + "..."
            raise ProfileFormatError(f"folded stacks, line {number}: the count {shown} is too large")
        names = stack_text.split(";") if stack_text else []
        if len(names) > max_depth:
            raise limits.STACK_DEPTH.exceeded(f"folded stacks, line {number}: the stack")
        if len(samples) >= max_samples:
            raise limits.SAMPLES.exceeded("folded stacks: the lines")
        frames_left -= len(names)
        if frames_left < 0:
            raise limits.STACK_FRAMES.exceeded("folded stacks: the count of frames in all the stacks")
        names.reverse()
        samples.append(Sample(tuple(map(lookup, names)), (count,)))
    return profile


def _sample_type(spec: SampleType | tuple[str, str] | str) -> SampleType:
    if isinstance(spec, str):
        kind, _, unit = spec.partition("/")
        return SampleType(kind, unit or "count")
    return SampleType(*spec)


def _not_folded(number: int, line: str) -> str:
    shown = line if len(line) <= 40 else line[:37] + "..."
    return (
        f"not a profile: text that is not folded stacks (line {number}, {shown!r}, is not "
        "'frame;frame;... COUNT'); gpuflame reads gzip pprof, folded stacks and PyTorch snapshots"
    )


def _bad_count(number: int, line: str) -> str:
    last = line.rsplit(None, 1)[-1]
    shown = last if len(last) <= 40 else last[:37] + "..."
    if len(line.split(None, 1)) < 2 and not line[:1].isspace():
        return f"folded stacks, line {number}: missing count (expected 'frame;frame;... COUNT')"
    return f"folded stacks, line {number}: the count {shown!r} is not a whole number"
