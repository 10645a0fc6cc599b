"""One self-contained HTML file: the viewer's assets with the profile inside.

The page must open from ``file://`` with no network at all, and frame names
come from user code, so:

- the CSS and JavaScript of ``gpuflame/viewer/`` are inlined at build time;
  a Content-Security-Policy allows only that exact script (by its SHA-256)
  and no fetches, so even a name that somehow became markup could not run;
- the profile is a compact JSON, gzip-compressed and base64-encoded inside a
  non-executable ``<script type="application/octet-stream">``. Base64 has no
  ``<``, so ``</script>`` or ``<!--`` inside a name cannot end the element;
  the page decompresses it with the browser's ``DecompressionStream``.

The JSON holds the frame table once and every sample with all its sample
types and labels, so the page switches type, label and trampoline hiding
without a rebuild. A profile with a timeline also ships it (not in diff
mode), drawn as memory over time above the graph. Frames that differ only
in their line are one function, as in the flame tree (:func:`gpuflame.model.functions.function_frames`).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
from importlib import resources

from gpuflame.analysis.tree import frame_sort_key, function_frames
from gpuflame.model.diff import select_types, shared_types
from gpuflame.model.history import History
from gpuflame.model.moment import NO_HISTORY
from gpuflame.model.profile import FRAME_KINDS, Frame, Profile, SampleType
from gpuflame.model.prune import DEFAULT_FRAMEWORKS, framework_regex, is_framework, names_the_memory
from gpuflame.model.timeline import Timeline

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
    """The profile as the viewer reads it: frame table, stacks (root first), samples.

    The profile is compacted first, so frames that filters left unused are
    not shipped and equal (stack, labels) samples are one; samples with the
    same stack share one stack entry.

    With *base* (diff mode) both profiles are reduced to the sample types
    they share and share one frame table, one stack table and one label
    table; ``samples`` are NEW's and ``base.samples`` BASE's, so the page
    aggregates both into one tree and colours each bar by its change.
    """
    if base is not None:
        common = shared_types(base, profile)
        chosen = profile.sample_types[type_index if type_index is not None else profile.pick_type()].type
        profile, base = select_types(profile, common).compact(), select_types(base, common).compact()
        type_index = [st.type for st in common].index(chosen) if chosen in base.type_names() else None
    else:
        profile = profile.compact()
    sites = _history_sites(profile) if base is None else None
    sources = [profile] if base is None else [profile, base]
    frames, frame_codes = _function_table(sources + ([sites] if sites is not None else []))
    regex = framework_regex(DEFAULT_FRAMEWORKS)
    files = sorted({f.file for f in frames})
    file_index = {f: i for i, f in enumerate(files)}
    tables = _Tables()
    new_samples = tables.samples(profile, frame_codes[0])
    data: dict[str, object] = {
        "format": FORMAT,
        "version": VERSION,
        "title": title,
        "comments": list(profile.comments),
        "types": [[st.type, st.unit] for st in profile.sample_types],
        "defaultType": profile.pick_type() if type_index is None else type_index,
        "kinds": list(FRAME_KINDS),
        "frames": {
            "name": [f.name for f in frames],
            "file": [file_index[f.file] for f in frames],
            "line": [f.line for f in frames],
            "kind": [FRAME_KINDS.index(f.kind) if f.kind in FRAME_KINDS else 0 for f in frames],
            # 1: a framework frame; 2: one that names what the memory is (model/prune.py)
            "framework": [(2 if names_the_memory(f) else 1) if is_framework(f, regex) else 0 for f in frames],
        },
        "files": files,
        "samples": new_samples,
    }
    if base is None and profile.peak_description("peak_space"):
        data["peak"] = profile.peak_description("peak_space")  # what the peak_* types are, in words
    if base is not None:
        data["base"] = {"samples": tables.samples(base, frame_codes[1])}
    elif profile.timeline is not None and any(profile.timeline.series.values()):
        data["timeline"] = timeline_data(profile.timeline)
        if sites is not None:
            data["history"] = history_data(profile.history, data["timeline"]["start"],
                                           tables.samples(sites, frame_codes[-1]))
        else:
            data["noHistory"] = NO_HISTORY
    data["stacks"] = {"length": tables.stack_lengths, "frames": tables.stack_ids}
    data["labelSets"] = [[list(pair) for pair in labels] for labels in tables.label_index]
    return data


def timeline_data(timeline: Timeline) -> dict[str, object]:
    """The timeline with times in nanoseconds since its first point.

    Epoch nanoseconds (~1.8e18) are past what a JavaScript number holds
    exactly (2^53); offsets from the start fit for 104 days.
    """
    start = min(points[0][0] for points in timeline.series.values() if points)
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
        tracks.append({
            "start": track.start - start if track.start else None, "end": track.end - start if track.end else None,
            "fold": track.fold - start, "folded": track.folded,
            "base": [[k * width + s, b, c] for s, (b, c) in track.base.items()],
            "t": deltas, "s": [k * width + s for s in track.sites], "b": list(track.sizes),
        })
    return {"stack": sites["stack"], "labels": sites["labels"], "tracks": tracks}


class _Tables:
    """The stack and label tables, shared by every sample set put through :meth:`samples`."""

    def __init__(self) -> None:
        self.stack_index: dict[tuple[int, ...], int] = {}
        self.stack_lengths: list[int] = []
        self.stack_ids: list[int] = []
        self.label_index: dict[tuple[tuple[str, str], ...], int] = {}

    def stack(self, stack: tuple[int, ...]) -> int:
        sid = self.stack_index.get(stack)
        if sid is None:
            sid = self.stack_index[stack] = len(self.stack_lengths)
            self.stack_lengths.append(len(stack))
            self.stack_ids.extend(stack)
        return sid

    def samples(self, profile: Profile, frame_code: list[int]) -> dict[str, list]:
        """Columns of *profile*'s non-zero samples: stack id, label set id, one value list per type."""
        stacks: list[int] = []
        labels: list[int] = []
        values: list[list[int]] = [[] for _ in profile.sample_types]
        for sample in profile.samples:
            if not any(sample.values):
                continue
            stacks.append(self.stack(tuple(frame_code[fid] for fid in reversed(sample.stack))))
            labels.append(self.label_index.setdefault(sample.labels, len(self.label_index)))
            for column, value in zip(values, sample.values, strict=True):
                column.append(value)
        return {"stack": stacks, "labels": labels, "values": values}


def _function_table(profiles: list[Profile]) -> tuple[list[Frame], list[list[int]]]:
    """Distinct function frames of all *profiles* sorted by name, and per profile each frame id's index.

    Sorted here so the page can order children by frame index (as the flame
    tree does, by name) without sorting 100k strings itself.
    """
    shown = [function_frames(p.frames) for p in profiles]
    table = sorted({f for frames in shown for f in frames}, key=frame_sort_key)
    index = {f: i for i, f in enumerate(table)}
    return table, [[index[f] for f in frames] for frames in shown]


def encode_payload(data: dict[str, object]) -> str:
    """Compact JSON, gzip (fixed mtime, so equal input gives equal output), base64."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return base64.b64encode(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0)).decode("ascii")


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
        "DATA": encode_payload(viewer_data(profile, title, type_index, base)),
    }
    return _PLACEHOLDER.sub(lambda m: parts[m.group(1)], viewer_asset("template.html"))
