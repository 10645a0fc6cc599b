"""The one flow of every command that reads a profile: load, then select (moment, filters).

A front end says what it wants as one frozen :class:`Request` (the files, the
:class:`~gpuflame.analysis.selection.Selection`, how a PyTorch snapshot is
read) and gets an :class:`Opened` back: the profile at its moment with the
filters applied, the words that say what is shown, and the notes of filters
that matched nothing. The command then renders it and writes the result
(:func:`gpuflame.files.write_output`: standard output or an atomic file).
The CLI builds the request from argparse (``cli/common.py``); ``serve``, the
notebook magic and the pytest plugin hold their profile already and take the
select stage alone (:func:`select`). Nothing here knows of a command line, and
nothing here prints.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuflame.analysis.selection import Selection, View
from gpuflame.defaults import source_index_dir
from gpuflame.formats import load
from gpuflame.gcpause import kept_to_the_end
from gpuflame.malloc_reuse import reuse_freed_memory
from gpuflame.model import merge
from gpuflame.model.functions import missing_def_lines_note
from gpuflame.model.profile import Profile
from gpuflame.symbols.qualnames import Resolver
from gpuflame.symbols.source_paths import SourceMap


@dataclass(frozen=True)
class Request:
    """What a command asks to read: the files (several are merged), the view of them, how snapshots are read."""

    paths: tuple[str, ...]
    selection: Selection = field(default_factory=Selection)
    native: bool = False  # keep a stacks="all" snapshot's C++ frames
    source_roots: tuple[tuple[str, str], ...] = ()  # the recording machine's path prefix OLD is NEW here

    def snapshot_options(self) -> dict[str, Any]:
        """What :func:`gpuflame.formats.load` passes on to the snapshot reader."""
        resolver = Resolver(SourceMap(list(self.source_roots)), store=source_index_dir())
        return {"native": self.native, "resolver": resolver}


@dataclass(frozen=True)
class Opened:
    """A profile read and selected for one command: the view, and the words that say what it shows."""

    view: View
    source: str  # the files and the filters as typed: a header of the output names them

    @property
    def profile(self) -> Profile:
        """The profile shown: at its moment, filtered."""
        return self.view.profile

    @property
    def type_index(self) -> int:
        """The sample type shown first (``--type``, else peak, else inuse, else alloc)."""
        return self.view.type_index

    @property
    def notes(self) -> tuple[str, ...]:
        """What the filters noted (one that matched nothing): the front end says them its own way."""
        return self.view.notes


def load_profile(paths: Sequence[str], **snapshot_options: Any) -> Profile:
    """Read one profile, or several merged into one (e.g. one file per process)."""
    reuse_freed_memory()  # until the command returns (cli/main.py): its arrays reuse each other's pages
    with kept_to_the_end():  # a command's profile lives until it returns: no collection walks it
        profiles = [load(p, **snapshot_options) for p in paths]
        return profiles[0] if len(profiles) == 1 else merge(profiles)


def open_profile(request: Request) -> Opened:
    """Read *request*'s files as one profile, take its moment, apply its filters: every reading command's start."""
    return _select(request, _at_moment(request))


def select(profile: Profile, selection: Selection, source: str = "") -> Opened:
    """The select stage alone, on a profile already in memory: a served file, a notebook cell, a test's recording.

    The same moment and filters as :func:`open_profile`, so every front end shows what the CLI would.
    """
    return Opened(selection.apply(profile), source)


def open_each(request: Request) -> Iterator[Opened]:
    """Each file of *request* on its own, each at its own moment (``diff``: a time is from each file's start).

    Every file is read first; each is filtered as the caller takes it, so its notes come before the next filter.
    """
    alone = [replace(request, paths=(path,)) for path in request.paths]
    profiles = [_at_moment(one) for one in alone]
    return (_select(one, profile) for one, profile in zip(alone, profiles, strict=True))


def _at_moment(request: Request) -> Profile:
    """The request's files read, at the moment or window its selection asks for."""
    profile = request.selection.at_moment(load_profile(request.paths, **request.snapshot_options()))
    note = missing_def_lines_note(profile)
    if note:  # older gpuflame files, py-spy's, Go's: say why a bar has no line
        profile.comments.append(note)
    return profile


def _select(request: Request, profile: Profile) -> Opened:
    """The filters of *request* on *profile* (already at its moment), with the words that say what is shown."""
    shown = " ".join([", ".join(request.paths), *request.selection.words()])
    return Opened(request.selection.filter(profile), shown)
