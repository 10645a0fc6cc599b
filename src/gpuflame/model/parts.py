"""What a profile is made of: frames, sample types, samples and their labels.

The lowest floor of the model: the profile (``profile.py``), its columns
(``columns.py``) and its event history (``history.py``) all build on these, so
none of them needs another to say what a frame or a sample is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from gpuflame.symbols.kinds import PYTHON


class Frame(NamedTuple):
    """One function in a stack, named per the AKS guide's table (``Foo > bar``).

    ``line`` is the line running in this frame (where it called on, or
    allocated: pprof's ``Line.line``); ``start_line`` is where the function
    is defined (its ``def``, decorators included, as ``co_firstlineno``:
    pprof's ``Function.start_line``), 0 when unknown.
    """

    name: str
    file: str = ""
    line: int = 0
    kind: str = PYTHON
    start_line: int = 0

    def location(self) -> str:
        """``file:line`` for tooltips and reports; empty when unknown."""
        if not self.file:
            return ""
        return f"{self.file}:{self.line}" if self.line else self.file


class SampleType(NamedTuple):
    """A pprof sample type such as ``peak_space/bytes``."""

    type: str
    unit: str

    def __str__(self) -> str:
        return f"{self.type}/{self.unit}"


Labels = tuple[tuple[str, str], ...]


class LabelSetTotal(NamedTuple):
    """One distinct label set of a profile: each sample type's sum over its samples, and which are not all 0."""

    labels: Labels
    totals: tuple[int, ...]
    nonzero: tuple[bool, ...]


class Sample:
    """Stack (frame ids, leaf first), one value per sample type, labels."""

    __slots__ = ("stack", "values", "labels")

    def __init__(self, stack: tuple[int, ...], values: tuple[int, ...], labels: Labels = ()) -> None:
        self.stack = stack
        self.values = values
        self.labels = labels

    def label(self, key: str, default: str | None = None) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return default

    def __repr__(self) -> str:
        return f"Sample(stack={self.stack!r}, values={self.values!r}, labels={self.labels!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sample):
            return NotImplemented
        return (self.stack, self.values, self.labels) == (other.stack, other.values, other.labels)

    __hash__ = None  # type: ignore[assignment]


def make_labels(labels: Mapping[str, object] | Iterable[tuple[str, object]] | None) -> Labels:
    """Canonical label tuple: string values, sorted by key, so equal sets compare equal."""
    if not labels:
        return ()
    items = labels.items() if isinstance(labels, Mapping) else labels
    return tuple(sorted((str(k), str(v)) for k, v in items))
