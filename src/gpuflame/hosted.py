"""Profiling code that a host runs (a notebook cell, a pytest test) through the public API.

The notebook magic and the pytest plugin record with ``gpuflame.start`` and
``gpuflame.stop(write=False)`` like any program, take the profile it hands
back (no file), and cut the host's frames (IPython's, pytest's) from the bottom of every
stack, so the cell or the test is the root, as its flame graph should read.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType

import gpuflame.api
from gpuflame.boundary import backends
from gpuflame.capture.base import DEGRADED
from gpuflame.capture.code_frames import GPUFLAME_DIR
from gpuflame.model import Profile, cut_callers


def already_profiling() -> bool:
    """Whether ``gpuflame.start`` holds this process (the API has no public question for it)."""
    return getattr(gpuflame.api, "_active", None) is not None


def backend_for_now(backend: str) -> str | None:
    """*backend* narrowed to the frameworks imported already; None when none of its are.

    The API starts a backend when its framework is imported, and ``stop()``
    does not cancel a start still waiting for that import: a later import
    would start a recorder into a stopped session, holding the CPU allocator
    hook. A host that records many short windows (a test each) therefore
    starts only what can start now; ``auto`` picks as ``gpuflame run`` does.
    """
    imported = [sys.modules[m] for m in backends.frameworks(backend) if m in sys.modules]
    if not imported:
        return None
    return backends.for_framework(backend, imported[0]) if len(imported) == 1 else backend


def package_dirs(*modules: ModuleType) -> tuple[str, ...]:
    """The folders of a host's packages, and gpuflame's own (its frames are the host's too)."""
    return tuple(os.path.dirname(os.path.abspath(m.__file__ or "")) + os.sep for m in modules) + (GPUFLAME_DIR,)


class Hosted:
    """A host's recording, and the JAX buffers already live when it started (JAX lists every live buffer)."""

    def __init__(self, recording: gpuflame.api.Recording, jax_before: Profile | None) -> None:
        self.recording = recording
        self.jax_before = jax_before

    @property
    def backends(self) -> list[str]:
        return self.recording.backends


def start(path: Path, backend: str, host: str) -> Hosted:
    """``gpuflame.start``: the recording (*path* is written only if the process exits while it runs).

    *path* is in a folder the host made, so it is not checked as a user's output is, at every start.
    *host* names the host for a user's ``gpuflame.stop()`` that would stop it ("a %%gpuflame cell").

    With JAX recording, what it holds now is taken too: a cell or a test is charged with the
    buffers it made, not with those an earlier cell or test kept.
    """
    recording = gpuflame.api._start(path, False, gpuflame.api._options(backend=backend), check=False)[0]
    recording._host = host  # a user's bare gpuflame.stop() leaves it running (api.stop)
    before = None
    if backends.JAX in recording.backends:
        from gpuflame.capture.recorders.jax_memory import take_profile

        before = take_profile(keep_framework=recording.settings.keep_framework)
    return Hosted(recording, before)


def peak_now(hosted: Hosted) -> tuple[int, int] | None:
    """The recording's peak and in-use bytes so far without building its profile; None where it cannot say.

    Only a lone recorder without errors answers (the CPU allocator hook); JAX's
    are netted against what it held at the start, which only the profile does.
    """
    recording = hosted.recording
    if hosted.jax_before is not None or recording.nested or not recording.running:
        return None
    return recording._session.peak_now()


def degraded_note(hosted: Hosted) -> str | None:
    """The note a profile of this recording would carry if one of its recorders failed (capture/base.py)."""
    for recorder in hosted.recording._session.recorders:
        if recorder.errors:
            return f"gpuflame {recorder.name}: {DEGRADED}: {recorder.errors[0]}"
    return None


def stop(hosted: Hosted, host_dirs: tuple[str, ...], build: bool = True) -> Profile | None:
    """``gpuflame.stop`` without a file: the profile, the host's frames cut away; None if nothing was recorded.

    Encoding a file only to decode it again would cost more than a small test. *build* False: the
    recording stops and no profile is built (a host that had what it needs from :func:`peak_now`).
    """
    recording = hosted.recording
    if not build and gpuflame.api._active is recording:
        gpuflame.api._stop_outer(False, build=False)
        return None
    profile = recording.stop(write=False)  # the host's own: a user's recording nested in it ends with it
    if not isinstance(profile, Profile):  # None: nothing recorded (a path only comes back from a written file)
        return None
    if hosted.jax_before is not None:
        from gpuflame.capture.recorders.jax_memory import without_held

        profile = without_held(profile, hosted.jax_before)
    return cut_callers(profile, lambda f: f.file.startswith(host_dirs)).compact()
