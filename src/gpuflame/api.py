"""The Python API: profile a block of code from inside the program, with ``gpuflame run``'s options.

    import gpuflame

    with gpuflame.profile("step.pb.gz"):
        train_step()

    recording = gpuflame.start("serve.pb.gz", backend="torch", interval="30s")
    ...
    gpuflame.stop()          # writes the file; returns its path

    gpuflame.start(store=True)             # into the run store: `gpuflame serve` lists it
    ...
    profile = gpuflame.stop(write=False)   # no file: the Profile itself

Unlike ``gpuflame run``, the API profiles this process only (not its
children). Like it, it takes the options ``gpuflame run``'s flags set, reads
the same ``GPUFLAME_*`` variables for the ones not given (``Settings.from_env``:
what a process ``gpuflame run`` started is told), and never raises into the
program once started: a failure is one line on stderr and a profile that
says what it lost. A ``start()`` while a profile is running is a warning and
changes nothing: the running profile goes on, and only the ``stop()`` (or
``with`` block) that started it ends it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, overload

from gpuflame.boundary.backends import BACKENDS, TORCH_HOOKS
from gpuflame.boundary.settings import Settings, env_name
from gpuflame.capture.autostart import watch
from gpuflame.capture.session import Session
from gpuflame.defaults import PUSH_INTERVAL_S
from gpuflame.errors import GpuflameError
from gpuflame.files import check_output
from gpuflame.launch.store import PROFILE_NAME, RunMeta, new_run_folder, store_root
from gpuflame.model import Profile
from gpuflame.units import interval_seconds

DEFAULT_OUTPUT = "gpuflame.pb.gz"

_lock = threading.Lock()
_active: Recording | None = None
_nested: list[Recording] = []  # started inside _active (a user's own start() in a %%gpuflame cell), innermost last


class Recording:
    """What :func:`start` returns: where the profile goes and what records it. Not the session itself."""

    def __init__(
        self, session: Session, run_folder: Path | None, started: float, nested_into: Path | None = None
    ) -> None:
        self._session = session
        self._run_folder = run_folder  # the store's folder for this profile, or None
        self._started = started
        self._nested_into = nested_into  # a nested recording's own file (it shares the running session)
        self._host = ""  # a host's recording (hosted.py: "a %%gpuflame cell"), which only the host stops

    @property
    def path(self) -> Path:
        """The file :func:`stop` writes (in the store's run folder with ``store=``)."""
        return self._nested_into or self._session.path

    @property
    def nested(self) -> bool:
        """Started while another recording ran: it shares that one's recorders and gets its own answer."""
        return self._nested_into is not None

    @property
    def settings(self) -> Settings:
        """The settings it records with: the options given, the environment for the rest."""
        return self._session.settings

    @property
    def backends(self) -> list[str]:
        """The backends recording so far (one starts when the program imports its framework)."""
        return [r.backend for r in self._session.recorders]

    @property
    def running(self) -> bool:
        return not self._session.finished

    @property
    def lost(self) -> list[str]:
        """What could not be recorded, in words (also in the profile's comments)."""
        return list(self._session.lost)

    def stop(self, *, write: bool = True) -> Path | Profile | None:
        """Stop this recording (and any still nested in it); None if it has ended already."""
        if self.nested:
            return _stop_nested(self, write)
        return _stop_outer(write) if _active is self else None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<gpuflame.Recording {state} into {str(self.path)!r}, backends {self.backends}>"


def start(
    output: str | os.PathLike[str] | None = None,
    backend: str | None = None,
    interval: float | str | None = None,
    *,
    torch_hook: str | None = None,
    native: bool | None = None,
    keep_framework: bool | None = None,
    pyroscope: str | None = None,
    service_name: str | None = None,
    tenant: str | None = None,
    pyroscope_ca: str | None = None,
    pyroscope_user: str | None = None,
    pyroscope_token_file: str | None = None,
    pyroscope_password_file: str | None = None,
    store: bool | str | os.PathLike[str] = False,
) -> Recording:
    """Start recording this process; each backend starts when the program imports its framework.

    The options are ``gpuflame run``'s flags (``--backend``, ``--interval``
    as seconds or ``"15s"``, ``--torch-hook``, ``--native``,
    ``--keep-framework``, ``--pyroscope`` and its group); one not given
    takes its ``GPUFLAME_*`` variable, else the default. *output* is the file
    :func:`stop` writes (default ``gpuflame.pb.gz``); ``store=True`` (or a
    store folder) writes it into a new run folder of the store instead,
    with the ``meta.json`` that ``gpuflame serve`` lists.

    Returns a :class:`Recording` (the running one, with a RuntimeWarning,
    when a profile is running already). Raises ValueError for an option
    gpuflame cannot use (a backend or torch hook not in ``BACKENDS`` /
    ``TORCH_HOOKS``, an interval that is negative, unreadable or out of
    ``defaults.MIN_INTERVAL_S``..``MAX_INTERVAL_S`` (0 is "only at exit"), a
    Pyroscope URL or credentials file it cannot use, *output* together with
    *store*, an *output* that is a folder, cannot be written, or is a file
    gpuflame did not write),
    TypeError for an option it does not take, and OSError when the store's
    folder cannot be made. Nothing else: once
    started, failures are reported on stderr and in the profile.
    """
    options = _options(
        backend=backend,
        interval=interval,
        torch_hook=torch_hook,
        native=native,
        keep_framework=keep_framework,
        pyroscope=pyroscope,
        service_name=service_name,
        tenant=tenant,
        pyroscope_ca=pyroscope_ca,
        pyroscope_user=pyroscope_user,
        pyroscope_token_file=pyroscope_token_file,
        pyroscope_password_file=pyroscope_password_file,
    )
    return _start(output, store, options)[0]


@functools.cache
def _option_names() -> frozenset[str]:
    """:func:`start`'s option names, read once: a host that starts a recording per test asks at every start."""
    return frozenset(inspect.signature(start).parameters) - {"output", "store"}


def _options(**given: object) -> dict[str, object]:
    """:func:`start`'s keywords as :class:`Settings` fields (``pyroscope``: ``pyroscope_url``); TypeError for others."""
    known = _option_names()
    unknown = sorted(set(given) - known)
    if unknown:
        raise TypeError(
            f"gpuflame.start() got unknown options {', '.join(unknown)} (it takes {', '.join(sorted(known))})"
        )
    return {("pyroscope_url" if k == "pyroscope" else k): v for k, v in given.items()}


def _start(
    output: str | os.PathLike[str] | None,
    store: bool | str | os.PathLike[str],
    options: dict[str, object],
    in_block: bool = False,
    check: bool = True,
) -> tuple[Recording, bool]:
    """The recording running now, and whether this call started it.

    *in_block*: called for a ``with profile()`` block, not ``start()``: the nesting warning
    names it so, and points one frame further up (contextlib's ``__enter__`` is between).
    *check*: False for a host's own scratch file in a folder it made (hosted.py), written only if
    the process exits mid-recording: checked as a user's output at each test's start, it cost a
    seventh of what recording a small test costs.
    """
    global _active
    settings = settings_for(options)
    if output is not None and store is not False:
        raise ValueError("give output or store, not both (store=True writes into a new run folder of the store)")
    with _lock:
        if _active is not None:
            nested = Recording(_active._session, None, time.time(), nested_into=_output_path(output))
            _nested.append(nested)
            warnings.warn(
                f"gpuflame is already profiling this process into {_active.path}; this "
                f"{'profile() block' if in_block else 'start()'} shares that recording, which goes on, "
                f"and its {'end' if in_block else 'stop()'} writes what it holds then to {nested.path}",
                RuntimeWarning,
                stacklevel=4 if in_block else 3,  # the user's line: start()'s caller, or the with line
            )
            return nested, True
        started = time.time()
        run_folder = _run_folder(store, started)
        if run_folder is not None:
            path = run_folder / PROFILE_NAME
        else:
            path = _output_path(output) if check else Path(output or DEFAULT_OUTPUT)
        # no session folder: the API writes one file, and notes of what was lost go into it
        session = Session(settings, path=path)
        session.install_exit_hooks()
        if settings.pyroscope_url:
            from gpuflame.capture.continuous import attach

            attach(session)
        watch(session, settings.backend)
        _active = Recording(session, run_folder, started)
        if run_folder is not None:
            _write_meta(_active)
        return _active, True


def _output_path(output: str | os.PathLike[str] | None) -> Path:
    """The file :func:`stop` will write, checked now as ``run -o`` checks it (missing folders made).

    A folder, an unwritable place or a file gpuflame did not write is a
    ValueError here, not a profile lost at the end.
    """
    path = Path(output or DEFAULT_OUTPUT).resolve()
    try:
        check_output(path, make_folders=True, force_hint="remove it, or give another name")
    except GpuflameError as exc:
        raise ValueError(str(exc)) from None
    return path


def settings_for(options: dict[str, object]) -> Settings:
    """The environment's settings with the options given over them; ValueError for one gpuflame cannot use.

    The last answer is kept while the options and the environment's ``GPUFLAME_*`` values are the same
    (a host starts a recording per test: read and checked each time, they were a quarter of a start);
    never with Pyroscope, whose credentials files are read at each start.
    """
    try:
        key = (tuple(options.items()), tuple(map(os.environ.get, _env_names())))
        hash(key)
    except TypeError:  # an option of a type gpuflame does not take: said by the checks below
        return _settings_for(options)
    found = _settings_memo.get(key)
    if found is not None:
        return found
    settings = _settings_for(options)
    if not settings.pyroscope_url:
        _settings_memo.clear()  # the last answer only
        _settings_memo[key] = settings
    return settings


_settings_memo: dict[tuple[object, ...], Settings] = {}  # settings_for's last answer, by options and environment


@functools.cache
def _env_names() -> tuple[str, ...]:
    """The variables :meth:`Settings.from_env` reads."""
    return tuple(env_name(f.name) for f in dataclasses.fields(Settings))


def _settings_for(options: dict[str, object]) -> Settings:
    """:func:`settings_for` read and checked anew."""
    given = {k: v for k, v in options.items() if v is not None}
    if "interval" in given:
        given["interval"] = _seconds(given["interval"])
    settings = dataclasses.replace(Settings.from_env(), **given)  # type: ignore[arg-type]
    if settings.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {settings.backend!r}")
    if settings.torch_hook not in TORCH_HOOKS:
        raise ValueError(f"torch_hook must be one of {', '.join(TORCH_HOOKS)}, not {settings.torch_hook!r}")
    if settings.pyroscope_url:
        _check_pyroscope(settings)
        if settings.interval <= 0:
            settings = dataclasses.replace(settings, interval=PUSH_INTERVAL_S)
    # this process only, into one file: not gpuflame run's folder, children or root
    return dataclasses.replace(settings, session_dir="", follow=False, root_pid=0)


def _seconds(value: object) -> float:
    try:
        return interval_seconds(value)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ValueError(f"interval: {exc}") from None


def _check_pyroscope(settings: Settings) -> None:
    """A bad URL or credentials file fails here, in the caller, as ``gpuflame run`` fails before the program."""
    from gpuflame.capture.continuous import ContinuousPush

    try:
        ContinuousPush(settings)
    except GpuflameError as exc:
        raise ValueError(str(exc)) from None


def _run_folder(store: bool | str | os.PathLike[str], started: float) -> Path | None:
    if store is False:
        return None
    root = store_root() if store is True else Path(store)
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return new_run_folder(root, [script], started)


def _write_meta(recording: Recording, profile: Profile | None = None) -> None:
    """``meta.json`` of a stored recording: at start (so a crash still lists it), then at stop."""
    folder = recording._run_folder
    if folder is None:
        return
    ended = time.time() if not recording.running else 0.0
    meta = RunMeta(
        command=[sys.executable, *sys.argv],
        started=recording._started,
        ended=ended,
        backend=recording.settings.backend,
        processes=[os.getpid()],
        lost=recording.lost,
        totals=profile.totals() if profile is not None else {},
        profile=PROFILE_NAME if recording.running or profile is not None else None,
    )
    try:
        meta.write(folder)
    except OSError as exc:
        recording._session.report(f"could not write {folder}/meta.json ({exc}); gpuflame serve will not list it")


@overload
def stop(*, write: Literal[True] = ...) -> Path | None: ...


@overload
def stop(*, write: Literal[False]) -> Profile | None: ...


def stop(*, write: bool = True) -> Path | Profile | None:
    """Stop the innermost recording and write its profile; its path, or None if nothing was written.

    A recording started inside another (a ``start()`` in a ``%%gpuflame``
    cell or a test under ``pytest --gpuflame``) is stopped first and gets
    what the running recording holds then; the outer one goes on. A
    ``stop()`` there with no ``start()`` of its own stops nothing: the cell's
    or the test's recording is its host's, and goes on (a RuntimeWarning).

    ``write=False`` writes no file and returns the :class:`~gpuflame.Profile`
    itself (what the file would hold, notes of what was lost included), or
    None when nothing was recorded or nothing is running: for code that reads
    the numbers at once, as the pytest plugin and the notebook magic do,
    without paying for encoding a file and reading it back. Never raises.
    """
    with _lock:
        innermost = _nested[-1] if _nested else None
        host = _active._host if _active is not None else ""
    if innermost is not None:
        return _stop_nested(innermost, write)
    if host:  # the user's code stopped what it did not start: the host's numbers would be lost
        warnings.warn(
            f"gpuflame.stop(): the recording running is {host}'s, not started by this code; it goes on "
            "(start() your own recording inside it to stop one here)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return _stop_outer(write)


def _stop_outer(write: bool, build: bool = True) -> Path | Profile | None:
    """Stop the recording that owns the session (its nested ones with it, said in its notes).

    *build* False (with *write* False): no profile is built (a host that has its numbers already).
    """
    global _active
    with _lock:
        recording, _active = _active, None
        dropped, _nested[:] = list(_nested), []
    if recording is None:
        return None
    for nested in dropped:  # stopped with their outer recording before their own stop(): say so
        recording._session.report(f"a recording nested in this one was never stopped; {nested.path} was not written")
    session = recording._session
    session.finish(write=write, build=build)
    if recording._run_folder is None and not write:  # nothing to say of the file: no stat (a host stops per test)
        return session.result
    written = session.path.exists()
    if recording._run_folder is not None:
        _write_meta(recording, session.result if written else None)
    if not write:
        return session.result
    return session.path if written else None


def _stop_nested(recording: Recording, write: bool) -> Path | Profile | None:
    """A nested recording's answer: what the running recording holds now, said to be so; it goes on."""
    with _lock:
        if recording not in _nested:
            return None
        _nested.remove(recording)
    session = recording._session
    profile = session.current()
    if profile is None:
        return None
    profile.comments.append(
        f"recorded inside another recording (into {session.path}), which was running already: this profile holds "
        f"what that one held at this stop(), from its own start, {recording._started - _outer_start(session):.3f} s "
        "before this start()"
    )
    if not write:
        return profile
    return recording.path if session.save_to(profile, recording.path) else None


def _outer_start(session: Session) -> float:
    return _active._started if _active is not None and _active._session is session else time.time()


@contextlib.contextmanager
def profile(
    output: str | os.PathLike[str] | None = None,
    backend: str | None = None,
    interval: float | str | None = None,
    **options: object,
) -> Iterator[Recording]:
    """Profile the ``with`` block (:func:`start`'s options); the file is written when it ends, even by an exception.

    Inside a running profile the block shares that one (with a warning), which goes on; the block's file
    holds what that recording held when the block ended.
    """
    store = options.pop("store", False)
    options = _options(backend=backend, interval=interval, **options)
    recording, started = _start(output, store, options, in_block=True)  # type: ignore[arg-type]
    try:
        yield recording
    finally:
        if started:
            recording.stop()
