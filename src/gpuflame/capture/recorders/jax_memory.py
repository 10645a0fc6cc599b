"""Backend ``jax``: JAX's live-buffer profile, sampled, in the AKS guide's names.

``jax.profiler.device_memory_profile()`` returns a gzipped pprof of every
live ``jax.Array`` buffer (and executable) with the Python stack that made
it. Each :meth:`JaxMemoryRecorder.sample` takes one; a profile holds

- ``inuse_*`` from the latest sample;
- ``peak_*`` per device, from the sample where that device's total was the
  highest seen (each device has its own memory, as torch-cuda's per-device
  peaks; the peak is as fine as the sampling: call ``sample()`` at an
  interval, or where it matters);
- no ``alloc_*``: JAX's profile lists live buffers only, never freed ones, so
  the allocation totals cannot be known (a profile comment says so);
- a timeline: each sample's total per device, at the sample's time.

JAX names frames by function name only (``make``); the class comes from the
source file and line (:mod:`gpuflame.symbols.qualnames`), giving ``Model >
make``. Frames inside JAX itself (``jax/``, ``jaxlib/``) are pruned by
default: only the JAX function the user called stays at the leaf
(``Model > make`` -> ``ones``; ``scan``, not the ``api_boundary`` wrapper
around it; a jitted function's call is the caller's own line, as JAX's
cached calls leave no JAX frame); ``keep_framework=True`` keeps them all.

The profile covers every live buffer of the process, including arrays made
before ``start()``: JAX does not say when a buffer was made. A ``%%gpuflame``
cell or a test under the pytest plugin nets out what was held at its start
(:func:`without_held`), so it is not charged with what earlier ones kept.

Phases (``gpuflame.phase``): each phase change takes a sample, so each
phase's row holds the largest total sampled while it ran (at its start, at
each ``--interval``, at its end: a lower bound of its true peak, and the
table says how many samples) and the total at its end (exact: sampled
then). Samples carry no ``phase`` label: JAX does not say when, so in which
phase, a buffer was made.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from gpuflame.boundary.backends import JAX, REGISTRY
from gpuflame.capture.base import Recorder, empty_profile
from gpuflame.capture.books import phases
from gpuflame.model.peak import SAMPLED, PeakUnit
from gpuflame.model.phases import PhaseStat, ordered
from gpuflame.model.profile import PYTHON, Frame, Labels, Profile, Sample
from gpuflame.model.prune import framework_regex, is_framework, prune_framework
from gpuflame.model.timeline import MAX_POINTS, Point, Timeline, downsample
from gpuflame.symbols.names import display_name
from gpuflame.symbols.qualnames import Resolver

if TYPE_CHECKING:
    from gpuflame.capture.session import Session

JAX_PACKAGES = REGISTRY[JAX].packages  # jax/, jaxlib/

# one sample, reduced to what the recorder keeps: (stack, labels) -> [bytes, buffers]
Rows = dict[tuple[tuple[Frame, ...], Labels], list[int]]


def create(session: Session) -> JaxMemoryRecorder:
    """The ``jax`` backend's recorder for *session* (its registry line names this module)."""
    return JaxMemoryRecorder(keep_framework=session.settings.keep_framework)


class JaxMemoryRecorder(Recorder):
    """Samples of JAX's live buffers: peak (highest sampled total) and in-use (latest)."""

    name = JAX
    backend = JAX

    def __init__(
        self,
        keep_framework: bool = False,
        backend: str | None = None,
        source: Callable[[], bytes] | None = None,
    ) -> None:
        """*source* returns one gzipped pprof (default: JAX's ``device_memory_profile``)."""
        super().__init__()
        self.keep_framework = keep_framework
        self.platform = backend  # JAX's backend (cpu, gpu, ...): not self.backend, the --backend name
        self._source = source
        self._resolver = Resolver()
        self._latest: Rows = {}
        self._peak: dict[str, tuple[int, Rows]] = {}  # device -> (its highest sampled total, its rows then)
        self.samples_taken = 0
        self._series: dict[Labels, list[Point]] = {}  # (device, pid) -> (epoch ns, sampled total)
        self._lock = threading.Lock()  # samples come from a timer thread and from snapshot()
        self._phase = 0  # the running phase (capture/books/phases.py)
        self._phase_rows: dict[int, PhaseStat] = {}  # phase id -> its sampled row
        self._last: tuple[int, int, Rows] | None = None  # the latest sample: (epoch ns, total, rows)

    # -- Recorder -------------------------------------------------------------

    def _start(self) -> None:
        if self._source is None:
            import jax.profiler  # ImportError is reported by start()

            backend = self.platform
            self._source = lambda: jax.profiler.device_memory_profile(backend)
        self._phase, self._phase_rows = phases.current(), {}
        self._take()
        self._listen_to_phases()

    def _entered_phase(self, phase_id: int) -> None:
        pass  # the running phase was read before the first sample

    def _stop(self) -> None:
        self._stop_listening()
        self._take()

    def _on_phase(self, phase_id: int, _now: int) -> None:
        """A sample ends the running phase; the same sample starts the next (JAX cannot tell more)."""
        self.sample()
        with self._lock:
            self._phase = phase_id
            if self._last is not None:
                self._book_phase(*self._last)

    def _book_phase(self, now: int, total: int, rows: Rows) -> None:
        """One sample into the running phase's row (under the lock)."""
        by_leaf: dict[str, int] = {}
        for (stack, _), (nbytes, _) in rows.items():
            if stack:
                by_leaf[stack[0].name] = by_leaf.get(stack[0].name, 0) + nbytes
        top = max(by_leaf.items(), key=lambda kv: (kv[1], kv[0]), default=("", 0))
        devices = {dict(labels).get("device", "") for _, labels in rows}
        row = self._phase_rows.get(self._phase)
        if row is None or total > row.peak:
            start = row.start if row is not None else now
            row = PhaseStat(
                phases.name_of(self._phase),
                next(iter(devices)) if len(devices) == 1 else "",
                str(os.getpid()),
                start=start,
                peak=total,
                peak_time=now,
                top=top[0],
                top_bytes=top[1],
                order=self._phase,
                samples=row.samples if row is not None else 0,
            )
        self._phase_rows[self._phase] = replace(row, end=now, inuse_end=total, samples=row.samples + 1)

    def _snapshot(self) -> Profile:
        if self.running:
            self.sample()
        with self._lock:
            peak = {key: row for _, rows in self._peak.values() for key, row in rows.items()}
            latest = self._latest
        profile = empty_profile(alloc=False)
        for (stack, labels), (nbytes, count) in peak.items():
            profile.add(list(stack), [nbytes, count, 0, 0], dict(labels))
        for (stack, labels), (nbytes, count) in latest.items():
            profile.add(list(stack), [0, 0, nbytes, count], dict(labels))
        out = profile.compact()
        out.default_type = profile.default_type
        out.comments = self._comments()
        with self._lock:
            if self._series:
                out.timeline = Timeline()
                for labels, points in self._series.items():
                    out.timeline.add_series(labels, points)
        end = self.stopped_ns or time.time_ns()
        # no buffer live at any sample: still say that the peak is the largest of a few samples (0 B read as exact)
        devices = sorted({dict(labels).get("device", "") for _, labels in peak}) or [""]
        out.peaks = [
            PeakUnit(d, SAMPLED, self.started_ns, end, pid=str(os.getpid()), samples=self.samples_taken)
            for d in devices
        ]
        with self._lock:
            if any(self._phase_rows.keys() - {0}):  # a phase was marked: the table, sampled
                out.phases = ordered(self._phase_rows.values())
        return out

    def _degrade(self) -> None:
        self._source = None

    # -- sampling -------------------------------------------------------------

    def sample(self) -> None:
        """Take one sample of JAX's live buffers now; never raises."""
        if not self.running or self.degraded:
            return
        try:
            self._take()
        except Exception as exc:  # noqa: BLE001 - the workload must go on
            self.fail("could not read JAX's device memory profile", "no further JAX samples are taken", exc)

    def _take(self) -> None:
        source = self._source
        if source is None:
            return
        rows = self.convert(source())
        total = sum(v[0] for v in rows.values())
        now = time.time_ns()
        with self._lock:
            self.samples_taken += 1
            self._last = (now, total, rows)
            self._book_phase(now, total, rows)
            self._note_totals(now, rows)
            self._latest = rows
            self._note_peaks(rows)

    def _note_peaks(self, rows: Rows) -> None:
        """Each device's rows where its sampled total is its highest yet (under the lock).

        The sample with the highest total of all devices is not each device's peak: a device
        whose memory peaked while another's had fallen would show less than it held.
        """
        by_device: dict[str, Rows] = {}
        for key, row in rows.items():
            by_device.setdefault(dict(key[1]).get("device", ""), {})[key] = row
        for device, own in by_device.items():
            total = sum(v[0] for v in own.values())
            if total > self._peak.get(device, (-1, {}))[0]:
                self._peak[device] = (total, own)

    def _note_totals(self, now: int, rows: Rows) -> None:
        """One timeline point per device: its sampled total (0 for a device seen before, now empty)."""
        totals = dict.fromkeys(self._series, 0)
        for (_, labels), (nbytes, _) in rows.items():
            key = tuple((k, v) for k, v in labels if k in ("device", "pid"))
            totals[key] = totals.get(key, 0) + nbytes
        for key, nbytes in totals.items():
            points = self._series.setdefault(key, [])
            points.append((now, nbytes))
            if len(points) > 2 * MAX_POINTS:  # bounded under long --interval runs; peaks and falls kept
                points[:] = downsample(points, MAX_POINTS)

    def convert(self, data: bytes) -> Rows:
        """One JAX pprof -> rows in the AKS guide's names, framework frames pruned unless kept."""
        from gpuflame.formats import pprof

        raw = pprof.decode_in_process(data)  # the profiled process: no protobuf runtime
        space, count = _columns(raw)
        if not self.keep_framework:
            raw = prune_framework(_calls_as_written(raw), JAX_PACKAGES)
        names = [self._rename(f) for f in raw.frames]
        pid = str(os.getpid())
        rows: Rows = {}
        for s in raw.samples:
            nbytes = s.values[space]
            if not nbytes:
                continue  # executables and empty buffers: nothing held
            labels = dict(s.labels)
            labels.setdefault("device", "unknown")
            labels["pid"] = pid
            key = (tuple(names[i] for i in s.stack), tuple(sorted(labels.items())))
            row = rows.setdefault(key, [0, 0])
            row[0] += nbytes
            row[1] += s.values[count]
        return rows

    def _rename(self, frame: Frame) -> Frame:
        """``make`` at ``model.py:12`` -> ``Model > make``; names already dotted keep their owner.

        JAX gives no definition line: it is read from the source, which is here.
        """
        if frame.kind != PYTHON or not frame.name:
            return frame
        qualname, start = self._resolver.lookup(frame.file, frame.line, frame.name.rsplit(".", 1)[-1])
        if "." in frame.name and not frame.name.startswith("<"):
            name = display_name(frame.name)
        else:
            name = display_name(qualname)
        return frame._replace(name=name, start_line=frame.start_line or start)

    def _comments(self) -> list[str]:
        return [
            f"{WHOLE_PROCESS}; {self.samples_taken} samples taken",
            "inuse: the latest sample",
            "no alloc_* types: JAX reports live buffers only, so allocations since start cannot be counted",
        ]


def _calls_as_written(raw: Profile) -> Profile:
    """Stacks as the user's code called JAX: its error-filtering wrapper left out, a jitted call the user's line.

    Every public JAX function is wrapped by ``api_boundary``, whose frame
    (``reraise_with_filtered_traceback``) would otherwise name the API at the
    leaf (``lax.scan`` shown as that wrapper). A jitted function's first call
    runs jit's Python dispatch (``pjit.py``); later calls take its C++ path
    with no JAX frame at all: both are the user's line, as the cached call is.
    """
    regex = framework_regex(JAX_PACKAGES)
    wrapper = [f.file.replace("\\", "/").endswith(_WRAPPER_FILE) for f in raw.frames]
    jit = [f.file.replace("\\", "/").endswith(_JIT_FILE) for f in raw.frames]
    fw = [is_framework(f, regex) for f in raw.frames]
    out = []
    for s in raw.samples:
        stack = [i for i in s.stack if not wrapper[i]]
        user = next((k for k, i in enumerate(stack) if not fw[i]), 0)
        if user and jit[stack[user - 1]]:
            stack = stack[user:]
        out.append(Sample(tuple(stack), s.values, s.labels))
    return raw.derive(out)


_WRAPPER_FILE = "jax/_src/traceback_util.py"  # api_boundary's reraise_with_filtered_traceback
_JIT_FILE = "jax/_src/pjit.py"  # a jitted call's Python dispatch (cache_miss), taken on its first call


def _columns(raw: Profile) -> tuple[int, int]:
    """Where JAX's profile keeps bytes (``space/bytes``) and buffer counts (``allocations/count``)."""
    units = [t.unit for t in raw.sample_types]
    names = raw.type_names()
    space = names.index("space") if "space" in names else units.index("bytes")
    count = names.index("allocations") if "allocations" in names else units.index("count")
    return space, count


# the backend's first note, and what a host that nets out the start says instead (:func:`without_held`)
WHOLE_PROCESS = (
    "gpuflame jax backend: JAX's device memory profile (live jax.Array buffers of the whole "
    "process, including those made before start())"
)
NETTED = (
    "gpuflame jax backend: JAX's device memory profile (live jax.Array buffers), less what each stack "
    "held when this recording started (a cell's or a test's own, netted per stack)"
)


def without_held(profile: Profile, before: Profile) -> Profile:
    """*profile* less the JAX buffers *before* held, per stack and labels, in its peak and in-use columns.

    JAX lists every live buffer, not those made since ``start()``: a host that records
    one cell or one test takes a :func:`take_profile` first and subtracts it, so a
    test is not charged with the arrays an earlier test kept. JAX gives buffers no
    identity, so a stack's figures are netted (never below 0): a buffer held at start,
    freed, and made again by the same stack is not counted.
    """
    space, count = before.type_index("inuse_space"), before.type_index("inuse_objects")
    held = {_key(before, s): (s.values[space], s.values[count]) for s in before.samples}
    names = profile.type_names()
    netted = [(names.index(t), which) for t, which in _NETTED if t in names]
    out = []
    for s in profile.samples:
        start = held.get(_key(profile, s))
        if start is None:
            out.append(s)
            continue
        values = list(s.values)
        for i, which in netted:
            values[i] = max(0, values[i] - start[which])
        if any(values):
            out.append(Sample(s.stack, tuple(values), s.labels))
    netted_profile = profile.derive(out)
    netted_profile.comments = [c.replace(WHOLE_PROCESS, NETTED) for c in netted_profile.comments]
    return netted_profile


# the columns netted against the start: each loses the start's bytes (0) or buffer count (1)
_NETTED = (("peak_space", 0), ("peak_objects", 1), ("inuse_space", 0), ("inuse_objects", 1))


def _key(profile: Profile, sample: Sample) -> tuple[tuple[Frame, ...], Labels]:
    """A sample's stack as frames (two profiles number their frames apart) and its labels."""
    return tuple(profile.stack_frames(sample)), tuple(sorted(sample.labels))


def take_profile(keep_framework: bool = False, backend: str | None = None) -> Profile:
    """One JAX memory profile right now (a recorder started, sampled once and stopped)."""
    rec = JaxMemoryRecorder(keep_framework=keep_framework, backend=backend)
    rec.start()
    rec.stop()
    return rec.snapshot()
