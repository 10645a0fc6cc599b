"""What a profiled process is told to do, carried in environment variables.

The launcher (``gpuflame run``) and the Kubernetes webhook configure the
profiler only through the environment, because that is what reaches every
child process: console scripts, ``subprocess`` children, multiprocessing
spawn and forkserver workers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from gpuflame.boundary.backends import BACKENDS, TORCH_HOOKS, say
from gpuflame.defaults import BACKEND, PUSH_FLUSH_S, PUSH_TIMEOUT_S, TORCH_HOOK
from gpuflame.units import interval_seconds

PREFIX = "GPUFLAME_"
__all__ = ["BACKENDS", "PREFIX", "TORCH_HOOKS", "Settings", "env_name"]  # BACKENDS, TORCH_HOOKS: boundary/backends.py


@dataclass(frozen=True)
class Settings:
    """The profiler's settings for one run (shared by all its processes)."""

    enabled: bool = False  # profile this process from its start: the switch, apart from where files go
    session_dir: str = ""  # where each process writes proc-<pid>.pb.gz
    backend: str = BACKEND
    interval: float = 0.0  # seconds between periodic snapshots; 0 = only at exit
    follow: bool = True  # profile child processes too
    native: bool = False  # native frames where the backend can give them
    torch_hook: str = TORCH_HOOK  # torch backend: allocator (CPU, fast), dispatch (any device), auto
    keep_framework: bool = False  # keep framework-internal frames (jax/, jaxlib/) the jax backend prunes
    root_pid: int = 0  # the process gpuflame run started
    # continuous mode (capture/continuous.py); secrets never travel here, only the files that hold them
    pyroscope_url: str = ""
    service_name: str = ""
    tenant: str = ""  # X-Scope-OrgID
    pyroscope_ca: str = ""  # CA file added to the system's for TLS verification
    pyroscope_user: str = ""  # basic auth user; password/token from GPUFLAME_PYROSCOPE_{PASSWORD,TOKEN}[_FILE]
    pyroscope_token_file: str = ""
    pyroscope_password_file: str = ""
    pyroscope_timeout: float = PUSH_TIMEOUT_S  # seconds one push may take
    pyroscope_flush: float = PUSH_FLUSH_S  # seconds the process may spend at exit sending what is queued

    def to_env(self, *names: str) -> dict[str, str]:
        """The variables that carry these settings to a child process (only *names*' when given).

        The launcher passes them all; the webhook passes the ones a pod's
        annotations set. :meth:`from_env` reads either back to these settings.
        """
        unknown = set(names) - {f.name for f in fields(self)}
        if unknown:
            raise ValueError(f"not a setting: {', '.join(sorted(unknown))}")
        return {env_name(f.name): _text(getattr(self, f.name)) for f in fields(self) if not names or f.name in names}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Settings from the environment; bad values fall back to defaults (never raise)."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = env.get(env_name(f.name))
            if raw is None:
                continue
            try:
                values[f.name] = _value(f.name, getattr(cls, f.name), raw)
            except ValueError as exc:
                if f.name == "interval":  # a loop of snapshots must not be a typo away: say what was done
                    say(f"{env_name(f.name)}={raw[:64]!r} ignored ({exc}); the default is used")
                continue
        if "enabled" not in values:  # set by a launcher older than the switch (a pod's webhook): on with a folder
            values["enabled"] = bool(values.get("session_dir"))
        if values.get("backend") not in BACKENDS:
            values.pop("backend", None)
        if values.get("torch_hook") not in TORCH_HOOKS:
            values.pop("torch_hook", None)
        return cls(**values)  # type: ignore[arg-type]


def _value(name: str, default: object, raw: str) -> object:
    """One variable's value as the type of its setting's default; ValueError for one that is not."""
    if name == "interval":
        return interval_seconds(raw)
    if isinstance(default, bool):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if isinstance(default, int):
        return int(raw)
    if isinstance(default, float):
        return float(raw)
    return raw


def env_name(setting: str) -> str:
    """The environment variable that carries *setting* (``session_dir`` -> ``GPUFLAME_SESSION_DIR``)."""
    return PREFIX + setting.upper()


def _text(value: object) -> str:
    """A setting as its variable holds it: ``1``/``0``, ``15`` for 15.0, ``0.5``."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
