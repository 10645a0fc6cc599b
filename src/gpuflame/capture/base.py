"""What every capture source is: a :class:`Recorder`, and the rule that it never breaks the workload.

A recorder runs inside someone else's program. A bug in gpuflame, a backend
that changed under us, a full disk: none of it may change what the workload
computes or whether it finishes. So a recorder catches every internal error,
keeps it in :attr:`Recorder.errors`, prints the first one on stderr as
``gpuflame: <what failed>; <what is lost>``, and degrades (stops recording)
while the workload goes on. What it had recorded up to then stays available
through :meth:`Recorder.snapshot`. Only ``Exception`` is caught: Ctrl-C and
``SystemExit`` belong to the workload and pass through.

The profile a recorder hands out carries the sample types of README's table
(``peak_*``, ``inuse_*``, ``alloc_*`` where known), the labels ``device``
and ``pid`` on every sample, and ``default_type = "peak_space"``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from abc import ABC, abstractmethod
from types import TracebackType

from gpuflame.capture.books import auto_phases, phases
from gpuflame.model.profile import Profile
from gpuflame.model.sample_types import memory_sample_types

DEFAULT_TYPE = "peak_space"


# what a profile's comment says when its recorder stopped after an internal error (:func:`degraded`)
DEGRADED = "recording degraded after an internal error"


def degraded(comments: list[str]) -> str | None:
    """The note of a recorder that stopped part way, if a profile's *comments* hold one: its numbers are short."""
    return next((c for c in comments if DEGRADED in c), None)


class Recorder(ABC):
    """A capture source: ``start()``, ``stop()``, ``snapshot()`` any number of times.

    Subclasses implement :meth:`_start`, :meth:`_stop` and :meth:`_snapshot`;
    the public methods wrap them so that no exception reaches the caller.
    ``snapshot()`` works while running and after ``stop()``: it returns what
    is known so far (an empty profile if nothing is).
    """

    name: str = "recorder"  # in messages: which recorder (which hook) said it
    marks_known_phases: bool = False  # mark frameworks' known phases while recording (auto_phases)
    backend: str = "recorder"  # the --backend it records for (two torch recorders share "torch")
    # the session stops it before taking the final profile (its snapshot after stop() is complete
    # and cheaper: the books are handed over, not copied); others are snapshotted, then stopped
    final_after_stop: bool = False

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.losses: list[str] = []  # what is missing while recording goes on (lose())
        self.running = False
        self.degraded = False
        self.started_ns = 0
        self.stopped_ns = 0
        self._error_lock = threading.Lock()

    # -- the interface ------------------------------------------------------

    def start(self) -> None:
        """Begin recording; a no-op when already running or degraded."""
        if self.running or self.degraded:
            return
        try:
            self._start()
        except Exception as exc:  # noqa: BLE001 - the workload must go on
            self.fail("could not start recording", "nothing is recorded", exc)
            return
        self.started_ns = time.time_ns()
        self.stopped_ns = 0
        self.running = True

    def stop(self) -> None:
        """End the recording window; what was recorded stays for :meth:`snapshot`."""
        if not self.running:
            return
        self.running = False
        self.stopped_ns = time.time_ns()
        try:
            self._stop()
        except Exception as exc:  # noqa: BLE001
            self.fail("could not stop recording cleanly", "the profile may miss its last events", exc)

    def snapshot(self) -> Profile:
        """What is known so far, as a profile; never raises."""
        try:
            profile = self._snapshot()
        except Exception as exc:  # noqa: BLE001
            self.fail("could not build the profile", "this snapshot is empty", exc, degrade=False)
            profile = empty_profile()
        self._stamp(profile)
        return profile

    def peak_now(self) -> tuple[int, int] | None:
        """Peak and in-use bytes of the window so far without building a profile; None where it cannot say.

        Must equal the peak_space and inuse_space totals of :meth:`snapshot` taken at the same moment.
        """
        return None

    # -- for subclasses -----------------------------------------------------

    @abstractmethod
    def _start(self) -> None: ...

    @abstractmethod
    def _stop(self) -> None: ...

    @abstractmethod
    def _snapshot(self) -> Profile: ...

    # -- phases (capture/books/phases.py): each recorder books them its own way, listens the same way --

    def _listen_to_phases(self) -> None:
        """From now on every phase change reaches :meth:`_on_phase`; the running phase is :meth:`_entered_phase`'s."""
        if self.marks_known_phases:
            auto_phases.install()  # transformers', vLLM's, Lightning's, Accelerate's known phases
        phases.listen(self._on_phase)
        self._entered_phase(phases.current())

    def _stop_listening(self) -> None:
        phases.unlisten(self._on_phase)

    def _on_phase(self, phase_id: int, now_ns: int) -> None:  # noqa: B027 - a recorder that books phases overrides it
        """Phase *phase_id* runs from *now_ns* (the epoch ns of the change)."""

    def _entered_phase(self, phase_id: int) -> None:
        """Recording starts inside *phase_id* (0: none): by default booked as a change now, where there is one."""
        if phase_id:
            self._on_phase(phase_id, time.time_ns())

    def _degrade(self) -> None:  # noqa: B027 - optional hook, most recorders need nothing
        """Stop recording after an internal error; must not raise. Default: nothing."""

    def fail(self, what: str, lost: str, exc: BaseException | None = None, degrade: bool = True) -> None:
        """Count an internal error, report the first one on stderr, and degrade.

        Safe to call from any thread and from inside hooks: it never raises.
        *degrade* False keeps recording (the failure lost one result only).
        """
        try:
            detail = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
            message = f"gpuflame: {self.name} backend: {what}{detail}; {lost}"
            with self._error_lock:
                first = not self.errors
                self.errors.append(message)
            if first:
                print(message, file=sys.stderr, flush=True)
            if degrade and not self.degraded:
                self.degraded = True
                self._degrade()
        except Exception:  # noqa: BLE001 - even reporting must not break the workload
            self.degraded = True

    def lose(self, message: str) -> None:
        """Something will be missing from the profile while recording goes on: say it once on stderr.

        The session forwards :attr:`losses` to the launcher (``lost-PID.txt``).
        Never raises.
        """
        try:
            with self._error_lock:
                if message in self.losses:
                    return
                self.losses.append(message)
            print(f"gpuflame: {self.name} backend: {message}", file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - even reporting must not break the workload
            pass

    def _stamp(self, profile: Profile) -> None:
        """Times and error notes every profile of this recorder carries."""
        if self.started_ns and not profile.time_nanos:
            profile.time_nanos = self.started_ns
            end = self.stopped_ns or time.time_ns()
            profile.duration_nanos = max(0, end - self.started_ns)
        if self.errors:
            note = f"gpuflame {self.name}: {DEGRADED}: {self.errors[0]}"
            if note not in profile.comments:
                profile.comments.append(note)

    # -- context manager ----------------------------------------------------

    def __enter__(self) -> Recorder:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def empty_profile(peak: bool = True, inuse: bool = True, alloc: bool = True) -> Profile:
    """A memory profile with the standard sample types and no samples."""
    return Profile(
        sample_types=memory_sample_types(peak, inuse, alloc),
        default_type=DEFAULT_TYPE if peak else None,
    )


def process_labels(device: str) -> dict[str, str]:
    """The labels every sample of this process carries."""
    return {"device": device, "pid": str(os.getpid())}
