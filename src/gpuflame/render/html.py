"""One self-contained HTML file: the viewer's assets with the profile inside.

The page must open from ``file://`` with no network at all, and frame names
come from user code, so:

- the CSS and JavaScript of ``gpuflame/viewer/`` are inlined at build time;
  a Content-Security-Policy allows only that exact script (by its SHA-256)
  and no fetches, so even a name that somehow became markup could not run;
- the profile is gzip-compressed and base64-encoded inside a
  non-executable ``<script type="application/octet-stream">``. Base64 has no
  ``<``, so ``</script>`` or ``<!--`` inside a name cannot end the element;
  the page decompresses it with the browser's ``DecompressionStream``.

The payload (:func:`encode_payload`) is a JSON head (names, files, labels,
types) followed by the number columns as little-endian binary arrays, which
the page views as typed arrays without parsing. It holds the frame table
once, the distinct stacks as one prefix tree (a node per distinct stack
prefix, :func:`gpuflame.analysis.prefix_tree.prefix_tree`) and every sample with all
its sample types and labels pointing at its stack's node, so the page
switches type, label and trampoline hiding without a rebuild, and with no
frame hidden sums the tree in one pass over its nodes: a million-frame page
paints in seconds. A profile with a timeline also ships it (not in diff
mode), drawn as memory over time above the graph. Frames that differ only
in their line are one function, as in the flame tree (:func:`gpuflame.model.functions.function_frames`).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
import struct
from importlib import resources
from typing import NamedTuple

import numpy as np

from gpuflame.analysis.compare import renamed_note
from gpuflame.analysis.prefix_tree import prefix_tree
from gpuflame.model.diff import renamed, renamed_scripts, select_types, shared_types
from gpuflame.model.function_table import FunctionTable, function_table
from gpuflame.model.history import History
from gpuflame.model.moment import NO_HISTORY
from gpuflame.model.profile import FRAME_KINDS, Frame, Labels, Profile, SampleType
from gpuflame.model.prune import DEFAULT_FRAMEWORKS, framework_files, framework_regex, names_the_memory
from gpuflame.model.timeline import Timeline
from gpuflame.printable import encodable

FORMAT = "gpuflame-viewer"
VERSION = 1

# Placeholders in template.html, each replaced once, in one pass, so text
# put in by one replacement is never scanned for another.
_PLACEHOLDER = re.compile(r"/\*GPUFLAME:(CSS|JS|CSP_SCRIPT|DATA)\*/")


def viewer_asset(name: str) -> str:
    """A file of ``gpuflame/viewer/`` (template.html, viewer.js, viewer.css)."""
    return (resources.files("gpuflame") / "viewer" / name).read_text(encoding="utf-8")


def viewer_data(
    profile: Profile, title: str, type_index: int | None = None, base: Profile | None = None
) -> dict[str, object]:
    """The profile as the viewer reads it: frame table, stacks (a prefix tree), samples.

    Frames that filters left unused are not shipped and all-zero samples are
    left out; samples with the same stack share one node of the stack tree.
    Number columns are numpy arrays, which :func:`encode_payload` ships as
    binary.

    With *base* (diff mode) both profiles are reduced to the sample types
    they share and share one frame table, one stack table and one label
    table; ``samples`` are NEW's and ``base.samples`` BASE's, so the page
    aggregates both into one tree and colours each bar by its change.
    """
    notes: list[str] = []
    if base is not None:  # a renamed script is one file, as gpuflame diff compares it
        files = renamed_scripts(base, profile)
        base = renamed(base, files)
        notes = [renamed_note(old, new) for old, new in sorted(files.items())]
        common = shared_types(base, profile)
        chosen = profile.sample_types[type_index if type_index is not None else profile.pick_type()].type
        profile, base = select_types(profile, common).compact(), select_types(base, common).compact()
        type_index = [st.type for st in common].index(chosen) if chosen in base.type_names() else None
    sites = _history_sites(profile) if base is None else None
    sources = ([profile] if base is None else [profile, base]) + ([sites] if sites is not None else [])
    columns = [_stack_columns(p) for p in sources]
    used = [_used_frames(c.frames, len(p.frames)) for p, c in zip(sources, columns, strict=True)]
    table = function_table([[p.frames[i] for i in ids] for p, ids in zip(sources, used, strict=True)])
    frame_codes = _frame_codes(sources, used, table.row)
    stacks, sample_sets, label_sets = _sample_tables(columns, frame_codes)
    data: dict[str, object] = {
        "format": FORMAT,
        "version": VERSION,
        "title": title,
        "comments": list(profile.comments) + notes,
        "types": [[st.type, st.unit] for st in profile.sample_types],
        "defaultType": profile.pick_type() if type_index is None else type_index,
        "kinds": list(FRAME_KINDS),
        "frames": _frame_columns(table),
        "files": table.files,
        "samples": sample_sets[0],
    }
    peak = profile.peak_description("peak_space") if base is None else None  # a pass over every sample
    if peak:
        data["peak"] = peak  # what the peak_* types are, in words
    if base is not None:
        data["base"] = {"samples": sample_sets[1]}
    elif profile.timeline is not None and any(profile.timeline.series.values()):
        data["timeline"] = timeline_data(profile.timeline)
        if sites is not None and profile.history is not None:  # sites come from the history
            data["history"] = history_data(profile.history, profile.timeline.start() or 0, sample_sets[-1])
        else:
            data["noHistory"] = NO_HISTORY
    data["stacks"] = stacks
    data["labelSets"] = label_sets
    return data


def timeline_data(timeline: Timeline) -> dict[str, object]:
    """The timeline with times in nanoseconds since its first point.

    Epoch nanoseconds (~1.8e18) are past what a JavaScript number holds
    exactly (2^53); offsets from the start fit for 104 days.
    """
    start = timeline.start() or 0  # None only without points, and then there is no t to shift
    return {
        "start": start,
        "series": [
            {
                "labels": [list(pair) for pair in labels],
                "t": [t - start for t, _ in points],
                "b": [b for _, b in points],
            }
            for labels, points in timeline.series.items()
            if points
        ],
    }


def _history_sites(profile: Profile) -> Profile | None:
    """One sample per (track, site) of the history, in order: its stack and labels go into the page's tables."""
    history = profile.history
    if history is None or not history.tracks:
        return None
    sites = Profile(sample_types=[SampleType("site", "count")])
    for track in history.tracks:
        for site, (_, labels) in enumerate(history.sites):
            sites.add(history.site_frames(site), [1], dict(labels) | dict(track.labels))
    return sites


def history_data(history: History, start: int, sites: dict[str, list]) -> dict[str, object]:
    """The event history for the page's click and drag on the strip (model/history.py, model/moment.py).

    Times in ns since the strip's *start*, events as differences; a site is
    (track, site) numbered as :func:`_history_sites` adds them, its stack and
    label set in the page's tables. ``start`` null: unknown (torch-cuda: the
    state before the allocator's trace is not known).
    """
    tracks, width = [], len(history.sites)
    for k, track in enumerate(history.tracks):
        deltas, last = [], track.fold
        for t in track.times:
            deltas.append(t - last)
            last = t
        tracks.append(
            {
                "start": track.start - start if track.start else None,
                "end": track.end - start if track.end else None,
                "fold": track.fold - start,
                "folded": track.folded,
                "base": [[k * width + s, b, c] for s, (b, c) in track.base.items()],
                "t": deltas,
                "s": [k * width + s for s in track.sites],
                "b": list(track.sizes),
            }
        )
    return {"stack": sites["stack"], "labels": sites["labels"], "tracks": tracks}


class Columns(NamedTuple):
    """A profile's samples with a non-zero value, as the page's tables take them."""

    lengths: np.ndarray
    frames: np.ndarray  # leaf first, as the profile holds them
    label_ids: np.ndarray
    label_sets: list[Labels]
    values: np.ndarray


def _stack_columns(profile: Profile) -> Columns:
    """*profile*'s samples with a non-zero value: stack lengths, their frame ids leaf first, labels, values.

    From :meth:`Profile.columns`: a page of a million samples forty frames
    deep pays no Python step per sample or frame.
    """
    held = profile.columns()
    lengths, leaf_first, label_ids, values = held.lengths, held.frames, held.label_ids, held.values
    keep = values.any(axis=1)
    if not keep.all():
        leaf_first = leaf_first[np.repeat(keep, lengths)]
        lengths, label_ids, values = lengths[keep], label_ids[keep], values[keep]
    return Columns(lengths, leaf_first, label_ids, held.label_sets, values)


def _sample_tables(columns: list[Columns], frame_codes: list[np.ndarray]) -> tuple[dict, list[dict], list]:
    """One stack table (a prefix tree of function codes) and label table for every sample set's *columns*.

    A stack is the node of the tree where it ends, so the page walks parent
    links instead of reading a frame list per stack: a million stacks forty
    deep are a million nodes, not forty million ids.
    """
    if len(columns) == 1:  # a million-frame page: its 40M frame ids read through their codes, no copy
        flat, code_of = columns[0].frames, frame_codes[0]
    else:  # diff mode: each profile's codes looked up in its own table, then joined
        flat, code_of = np.concatenate([codes[c.frames] for c, codes in zip(columns, frame_codes, strict=True)]), None
    tree = prefix_tree(np.concatenate([c.lengths for c in columns]), flat, leaf_first=True, code_of=code_of)
    label_index: dict[Labels, int] = {}
    out, first = [], 0
    for c in columns:
        ids, first_at = np.unique(c.label_ids, return_index=True)  # the sets kept samples use, in order of use
        shared = np.zeros(len(c.label_sets), dtype=np.int64)
        for i in ids[np.argsort(first_at)].tolist():
            shared[i] = label_index.setdefault(c.label_sets[i], len(label_index))
        count = len(c.lengths)
        out.append(
            {
                "stack": tree.node_of_stack[first : first + count].astype("<i4"),
                "labels": shared[c.label_ids].astype("<i4"),
                "values": [_value_column(c.values[:, k]) for k in range(c.values.shape[1])],
            }
        )
        first += count
    stacks = {"parent": tree.parent.astype("<i4"), "frame": tree.code.astype("<i4")}
    return stacks, out, [[list(pair) for pair in labels] for labels in label_index]


def _value_column(values: np.ndarray) -> np.ndarray:
    """Int32 where every value fits (half the bytes to inflate in the page), else float64 (exact below 2**53)."""
    if not len(values) or (values.min() >= -(2**31) and values.max() < 2**31):
        return values.astype("<i4")
    return values.astype("<f8")


def _used_frames(frames: np.ndarray, count: int) -> list[int]:
    """The frame ids that occur in *frames* (every stack's ids), in order.

    Marked in a mask: ``bincount`` first widened forty million int32 ids to
    int64, 300 MB of fresh pages (1.2 s of system time on a VM).
    """
    seen = np.zeros(count, dtype=bool)
    seen[frames] = True
    return np.flatnonzero(seen).tolist()


def _frame_codes(profiles: list[Profile], used: list[list[int]], rows: np.ndarray) -> list[np.ndarray]:
    """Per profile, each frame id's row of the function table; -1 for frames no kept sample uses."""
    codes, first = [], 0
    for p, ids in zip(profiles, used, strict=True):
        code = np.full(max(len(p.frames), 1), -1, dtype=np.int32)  # a row of the table: fewer than 2**31
        code[ids] = rows[first : first + len(ids)]
        codes.append(code)
        first += len(ids)
    return codes


def _frame_columns(table: FunctionTable) -> dict[str, object]:
    """The page's frame table: names, then file, line, kind and framework flag as typed arrays.

    Sorted as the flame tree sorts bars (by name), so the page orders
    children by frame index without sorting 100k strings itself.
    """
    kind_code = {k: i for i, k in enumerate(FRAME_KINDS)}
    return {
        "name": table.names,
        "file": _int32(table.file),
        "line": _int32(table.line),
        "kind": np.array([kind_code.get(k, 0) for k in table.kinds], np.uint8)[table.kind],
        # 1: a framework frame; 2: one that names what the memory is (model/prune.py)
        "framework": _framework_flags(table),
    }


def _framework_flags(table: FunctionTable) -> np.ndarray:
    """Per row, 0, 1 (a framework frame) or 2 (one that names the memory), asked per kind and file.

    Functions share files, and only framework rows are asked whether their
    name says what the memory is.
    """
    regex = framework_regex(DEFAULT_FRAMEWORKS)
    in_framework = np.zeros(len(table.names), dtype=bool)
    for k, kind in enumerate(table.kinds):
        rows = np.flatnonzero(table.kind == k)
        files = np.unique(table.file[rows])
        by_file = np.zeros(len(table.files), dtype=bool)
        by_file[files] = framework_files(kind, list(map(table.files.__getitem__, files.tolist())), regex)
        in_framework[rows] = by_file[table.file[rows]]
    flags = in_framework.astype(np.uint8)
    for i in np.flatnonzero(in_framework).tolist():
        if names_the_memory(Frame(table.names[i], "", 0, table.kinds[table.kind[i]])):
            flags[i] = 2
    return flags


def _int32(values: np.ndarray) -> np.ndarray:
    """Clipped to int32 (a line past 2**31 is not a line a person wrote)."""
    return np.clip(values, -(2**31), 2**31 - 1).astype("<i4")


# An array in the payload's JSON head: {"@": [kind, byte offset after the head, count]}.
ARRAY_REF = "@"
ARRAY_KINDS = ("i4", "u1", "f8")  # int32, uint8, float64, little-endian: the page's typed arrays
# zlib level 1: on a million-frame page (83 MB of body) 0.8 s against 3.9 s at level 6, for a page
# 5% larger (18.0 against 17.2 MB; a small page 6 KB larger), and the browser inflates both as fast
COMPRESS_LEVEL = 1


def encode_payload(data: dict[str, object]) -> str:
    """The page's payload: base64 of gzip (fixed mtime, so equal input gives equal output) of a body.

    The body is a little-endian u32 head length, the head (compact JSON),
    then every numpy array of *data* as little-endian int32 or float64, each
    at an offset that is a multiple of 8, so the page views them as typed
    arrays with no parsing: a million-frame page parses names, not numbers.
    """
    blobs: list[bytes] = []
    offset = 0

    def ref(array: np.ndarray) -> dict[str, list]:
        nonlocal offset
        kind = f"{array.dtype.kind}{array.dtype.itemsize}"
        if kind not in ARRAY_KINDS:
            raise ValueError(f"the page has no typed array for {array.dtype}")
        raw = array.astype("<" + kind, copy=False).tobytes()
        blobs.append(raw + b"\0" * (-len(raw) % 8))
        at, offset = offset, offset + len(blobs[-1])
        return {ARRAY_REF: [kind, at, len(array)]}

    def walk(value: object) -> object:
        if isinstance(value, np.ndarray):
            return ref(value)
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list) and value and isinstance(value[0], (dict, list, np.ndarray)):
            return [walk(v) for v in value]
        return value

    head = json.dumps(walk(data), separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    start = 4 + len(head) + (-(4 + len(head)) % 8)
    body = struct.pack("<I", len(head)) + head + b"\0" * (start - 4 - len(head))
    # offsets in the head count from the first array; the page adds `start`
    payload = gzip.compress(body + b"".join(blobs), compresslevel=COMPRESS_LEVEL, mtime=0)
    return base64.b64encode(payload).decode("ascii")


def decode_payload(text: str) -> dict[str, object]:
    """The data of :func:`encode_payload`, arrays as lists (for tests and scripts)."""
    body = gzip.decompress(base64.b64decode(text))
    (length,) = struct.unpack_from("<I", body)
    start = 4 + length + (-(4 + length) % 8)

    def walk(value: object) -> object:
        if isinstance(value, dict):
            if ARRAY_REF in value:
                kind, at, count = value[ARRAY_REF]
                return np.frombuffer(body, dtype="<" + kind, count=count, offset=start + at).tolist()
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    data = walk(json.loads(body[4 : 4 + length]))
    assert isinstance(data, dict)  # the head is always one JSON object
    return data


def script_hash(script: str) -> str:
    """The CSP source that allows exactly this inline script."""
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def render_html(profile: Profile, title: str, type_index: int | None = None, base: Profile | None = None) -> str:
    """The whole viewer page for *profile*; with *base*, the diff of *profile* (new) against it."""
    script = viewer_asset("viewer.js")
    parts = {
        "CSS": viewer_asset("viewer.css"),
        "JS": script,
        "CSP_SCRIPT": script_hash(script),
        "DATA": encode_payload(viewer_data(profile, encodable(title), type_index, base)),  # a file name: \udcff
    }
    return _PLACEHOLDER.sub(lambda m: parts[m.group(1)], viewer_asset("template.html"))
