"""One test phase (fixture set-up, or the test body) recorded through the public API.

The phase runs between ``gpuflame.start`` and ``gpuflame.stop``, exactly as a
``with gpuflame.profile(...)`` block would, so its numbers are the ones
``gpuflame run`` gives. pytest's own frames below the test (pluggy, _pytest)
are cut away, so the test function (or the fixture) is the root of every
stack, as the flame graph of a test should read.
"""

from __future__ import annotations

import os
import tempfile
import unittest.case
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import _pytest
import pluggy

from gpuflame import hosted
from gpuflame.boundary.backends import frameworks, spoken
from gpuflame.capture.base import degraded
from gpuflame.hosted import already_profiling, backend_for_now, package_dirs
from gpuflame.model import Profile

# pytest's frames (and below them what runs pytest: xdist's workers): cut below the test; and unittest's
# TestCase.run, through which pytest runs a unittest test (setUp and the test method become the roots)
HOST_DIRS = package_dirs(_pytest, pluggy) + (os.path.abspath(unittest.case.__file__),)


def scratch_folder() -> Path:
    """The file name each phase's ``gpuflame.start`` is given: written only if the process exits mid-phase.

    The phase's profile comes back from ``gpuflame.stop(write=False)`` without
    a file. In memory where the system has it (/dev/shm).
    """
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="gpuflame-pytest-", dir=base))


@dataclass
class Phase:
    """What one phase allocated: its profile (as shown) and the numbers the plugin reports."""

    profile: Profile | None
    peak: int
    inuse: int
    top: str  # the function with the largest self at the peak ('' when nothing)
    backends: list[str]

    def to_dict(self) -> dict[str, object]:
        return {"peak": self.peak, "inuse": self.inuse, "top": self.top, "backends": self.backends}


NOTHING = Phase(None, 0, 0, "", [])


class PhaseRecorder:
    """``start()`` before the phase, ``stop()`` after it; never raises into the test."""

    def __init__(self, scratch: Path, backend: str) -> None:
        self.scratch = scratch
        self.backend = backend
        self.error = ""  # why nothing was recorded, when something went wrong
        self._session: hosted.Hosted | None = None

    def start(self) -> None:
        if already_profiling():
            self.error = "this process is already being profiled (gpuflame.start); one profile at a time"
            return
        backend = backend_for_now(self.backend)
        if backend is None:
            wanted = spoken(frameworks(self.backend) or (self.backend,))
            self.error = f"{wanted} was not imported when the test started"
            return
        try:
            self._session = hosted.start(self.scratch / "phase.pb.gz", backend, "pytest --gpuflame")
        except Exception as exc:  # already profiling (the test's own gpuflame.start), bad backend
            self.error = f"could not start profiling ({exc})"

    def stop(self, wants_profile: Callable[[int | None], bool] = lambda _peak: True) -> Phase:
        """The phase's numbers; its profile too where *wants_profile* (given the peak) says it is needed.

        The peak and in-use bytes come from the recorder without a profile
        where it can say them (the CPU allocator hook): a passing test whose
        profile nobody reads pays for no profile. *wants_profile* is asked
        before the recording stops, so it can set up what the build needs;
        given None (the recorder cannot say the peak), the profile is built whatever it answers.
        """
        if self._session is None:
            return NOTHING
        session = self._session
        backends = session.backends
        numbers = hosted.peak_now(session)
        build = wants_profile(numbers[0] if numbers else None) or numbers is None
        try:
            profile = hosted.stop(session, HOST_DIRS, build)
        except Exception as exc:
            self.error = f"the profile of this test is lost ({type(exc).__name__}: {exc})"
            return NOTHING
        if not build:
            assert numbers is not None  # build is True without them
            return self._unbuilt(numbers, backends)
        if profile is None:
            return Phase(None, 0, 0, "", backends)
        note = degraded(profile.comments)
        if note is not None:  # its peak is short: checked against a budget or stored as a baseline, it would mislead
            self.error = f"the profile of this test is incomplete ({note})"
            return NOTHING
        return measure(profile, backends)

    def _unbuilt(self, numbers: tuple[int, int], backends: list[str]) -> Phase:
        """The numbers of a phase whose profile was not built, unless its recorder failed on the way."""
        assert self._session is not None
        note = hosted.degraded_note(self._session)
        if note is not None:
            self.error = f"the profile of this test is incomplete ({note})"
            return NOTHING
        return Phase(None, numbers[0], numbers[1], "", backends)


def measure(profile: Profile, backends: list[str]) -> Phase:
    """The numbers of a phase whose profile was built (its views imported here: most phases build none)."""
    from gpuflame.analysis.selection import Selection  # the select stage alone: not the pipeline's readers
    from gpuflame.analysis.summary import widest_leaf

    totals = profile.totals()
    peak = totals.get("peak_space", totals.get("inuse_space", 0))
    view = Selection(sample_type="peak_space" if "peak_space" in totals else None).apply(profile)
    leaf = widest_leaf(view.profile, view.type_index)
    return Phase(profile, peak, totals.get("inuse_space", 0), leaf.frame.name if leaf else "", backends)
