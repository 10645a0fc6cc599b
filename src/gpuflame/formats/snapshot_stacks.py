"""A snapshot's frame lists as profile stacks: memoized, read once per distinct list (formats/torch_snapshot.py).

Split from the converter so that each module holds one job; the reading of
one list's frames (C++, CPython and Python frames in their places) is
:mod:`gpuflame.formats.torch_frames`'.
"""

from __future__ import annotations

from itertools import compress, count, repeat
from operator import eq, getitem, itemgetter, lshift, not_, rshift, xor
from typing import Any

from gpuflame import limits
from gpuflame.errors import ProfileFormatError
from gpuflame.formats.snapshot_blocks import INT64_MAX, NO_STACK_FRAME
from gpuflame.formats.torch_frames import Entry, StackReader, make_entry
from gpuflame.model.profile import Profile
from gpuflame.symbols import names
from gpuflame.symbols.qualnames import Resolver

# Lists kept per cheap key. Unbounded, lists that share their leaf, middle and root
# frames but differ elsewhere (a crafted file) made reading quadratic: 8,000 blocks took 40 s.
# Past it, such a list is read anew, which costs its length and nothing more.
SHAPE_BUCKET = 8


class Stacks:
    """Frame lists -> profile stacks (tuples of frame ids, leaf first), memoized.

    A snapshot repeats the same stacks across blocks and trace entries, and
    PyTorch shares one dict per distinct frame (and one list per captured
    stack, shared by a block and its trace entry), which survives pickling.
    So a list is looked up by its identity first (the snapshot keeps every
    object alive while we run), then by a cheap key (the identities of its
    leaf, middle and root frames and its length: a recursion repeats one
    frame dict) with a full comparison, which is an
    identity check per frame when frames are shared; only new stacks are
    read (:mod:`gpuflame.formats.torch_frames` puts C++, CPython and Python
    frames in their places).
    """

    def __init__(self, profile: Profile, resolver: Resolver, native: bool = False) -> None:
        self.profile = profile
        self.resolver = resolver
        self.reader = StackReader(native)
        self.by_list: dict[int, tuple[int, ...]] = {}
        self._by_shape: dict[int, list[tuple[list[Any], tuple[int, ...]]]] = {}
        self._entry_by_id: dict[int, Entry] = {}
        self._entry_by_key: dict[tuple[str, int, str], Entry] = {}
        self.unknown_def_lines: set[str] = set()  # files whose functions' def lines were not found
        self.no_stack = (profile.frame_id(NO_STACK_FRAME),)
        self.max_depth = limits.STACK_DEPTH.value()

    def stack(self, frames: Any) -> tuple[int, ...]:
        """The stack of a ``frames`` list taken from the snapshot."""
        found = self.by_list.get(id(frames))
        if found is None:
            found = self.by_list[id(frames)] = self.stack_of(frames)
        return found

    def many(self, lists: list[Any]) -> list[tuple[int, ...]]:
        """The stack of each frames list, in order: what :meth:`stack` gives each, in passes that run in C.

        A trace holds a frames list per event (millions), a few hundred
        distinct stacks among them, and one call of :meth:`stack` per list
        was most of reading a large trace. Each list's cheap key (as
        :meth:`stack_of` makes it) picks the first list with that key as its
        stand-in; one list comparison (an identity check per shared frame)
        confirms it, and only stand-ins are read. Lists that differ from
        their stand-in (model code's stacks often differ in one line that the
        key does not look at) are keyed again by all their frames'
        identities; empty or missing frames are ``<no stack recorded>``.
        """
        if not lists:
            return []
        if not set(map(type, lists)) <= {list, type(None)}:  # a damaged file: one at a time, as stack() refuses it
            return [self.stack(f) for f in lists]
        if not all(lists):  # allocations without a stack among them
            found = iter(self.many(list(filter(None, lists))))
            return [next(found) if f else self.no_stack for f in lists]
        if max(map(len, lists)) > self.max_depth:
            raise limits.STACK_DEPTH.exceeded("a stack in the snapshot")
        leaves = map(id, map(itemgetter(0), lists))
        roots = map(lshift, map(id, map(itemgetter(-1), lists)), repeat(1))
        middles = map(lshift, map(id, map(getitem, lists, map(rshift, map(len, lists), repeat(1)))), repeat(2))
        keys = list(map(xor, map(xor, map(xor, leaves, roots), middles), map(len, lists)))
        stand_in: dict[int, list[Any]] = {}
        stand_ins = list(map(stand_in.setdefault, keys, lists))
        of_key = {key: self.stack(frames) for key, frames in stand_in.items()}
        out = list(map(of_key.__getitem__, keys))
        others = list(compress(count(), map(not_, map(eq, stand_ins, lists))))
        if others:  # lists that differ from their stand-in (frames differ where the key did not look): exactly
            rest = list(map(lists.__getitem__, others))
            # the hash of the identities, not the tuple: a crafted file's distinct lists are then held once
            of_hash: dict[int, tuple[list[Any], tuple[int, ...]]] = {}
            for i, frames, key in zip(others, rest, map(hash, map(tuple, map(map, repeat(id), rest))), strict=True):
                seen = of_hash.get(key)
                if seen is None:
                    seen = of_hash[key] = (frames, self.stack(frames))
                out[i] = seen[1] if seen[0] is frames or seen[0] == frames else self.stack(frames)
        return out

    def stack_of(self, frames: Any) -> tuple[int, ...]:
        """The stack of a frames list, without the identity memo (see :meth:`stack`)."""
        if not frames:
            return self.no_stack
        if type(frames) is not list:
            raise ProfileFormatError("a 'frames' entry is not a list")
        if len(frames) > self.max_depth:
            raise limits.STACK_DEPTH.exceeded("a stack in the snapshot")
        key = id(frames[0]) ^ (id(frames[-1]) << 1) ^ (id(frames[len(frames) >> 1]) << 2) ^ len(frames)
        bucket = self._by_shape.get(key)
        if bucket is None:
            bucket = self._by_shape[key] = []
        for seen, found in bucket:
            if seen is frames or seen == frames:  # an identity check per frame when they are shared
                return found
        known = self._entry_by_id.get
        entries = [known(id(f)) for f in frames]
        if None in entries:
            entries = [self._entry(f) for f in frames]
        frame_id = self.profile.frame_id
        found = tuple(frame_id(f) for f in self.reader.read(entries)) or self.no_stack  # type: ignore[arg-type]
        if len(bucket) < SHAPE_BUCKET:
            bucket.append((frames, found))
        return found

    def _entry(self, frame: Any) -> Entry:
        entry = self._entry_by_id.get(id(frame))
        if entry is None:
            if type(frame) is not dict:
                raise ProfileFormatError("a stack frame is not a dict")
            # only str and int go into keys: hashing untrusted nested values is unsafe
            file = frame.get("filename")
            line = frame.get("line")
            name = frame.get("name")
            key = (
                file if type(file) is str else "",
                line if type(line) is int and 0 <= line <= INT64_MAX else 0,  # what pprof can store
                name if type(name) is str else "",
            )
            entry = self._entry_by_key.get(key)
            if entry is None:
                entry = self._entry_by_key[key] = make_entry(*key, self._python_name)
            self._entry_by_id[id(frame)] = entry
        return entry

    def _python_name(self, file: str, line: int, name: str) -> tuple[str, int]:
        """A Python frame's label and def line; files whose def lines are unknown are noted."""
        qualname, start = self.resolver.lookup(file, line, name)
        if not start:
            self.unknown_def_lines.add(file)
        return names.display_name(qualname), start
