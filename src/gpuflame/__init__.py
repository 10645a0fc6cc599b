"""gpuflame: which Python functions hold the GPU memory?

    with gpuflame.profile("out.pb.gz"):
        ...                       # then: gpuflame report out.pb.gz

In a notebook: ``%load_ext gpuflame``, then ``%%gpuflame`` on a cell.
Phases: ``with gpuflame.phase("train"): ...`` (or ``gpuflame.phase("serve")``).

PYTEST_DONT_REWRITE: pytest's plugin loader marks this package for assertion
rewriting; under ``gpuflame run -- pytest`` it is imported first, and pytest
warned "Module already imported so cannot be rewritten; gpuflame" at every run.
"""

import importlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuflame.api import Recording, profile, start, stop
    from gpuflame.capture.books.phases import phase
    from gpuflame.formats import load
    from gpuflame.model import Frame, Profile, Sample, SampleType
    from gpuflame.notebook import last

from gpuflame.version import __version__

# imported on first use: `gpuflame run`'s bootstrap imports gpuflame.capture.autostart, which
# imports this package first; the API, the readers and the model's verbs are not what it needs
_LAZY = {
    "Recording": "gpuflame.api",
    "profile": "gpuflame.api",
    "start": "gpuflame.api",
    "stop": "gpuflame.api",
    "phase": "gpuflame.capture.books.phases",
    "load": "gpuflame.formats",
    "Frame": "gpuflame.model",
    "Profile": "gpuflame.model",
    "Sample": "gpuflame.model",
    "SampleType": "gpuflame.model",
    "last": "gpuflame.notebook",
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'gpuflame' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Frame",
    "Profile",
    "Recording",
    "Sample",
    "SampleType",
    "__version__",
    "last",
    "load",
    "phase",
    "profile",
    "save",
    "start",
    "stop",
]


def save(
    profile: "Profile", path: str | os.PathLike[str], fmt: str | None = None, type_name: str | None = None
) -> None:
    """Write *profile* as ``gpuflame export`` does: the format from *fmt*, else *path*'s name, else pprof.

    Text formats (folded, speedscope, json, svg) carry one sample type
    (*type_name*, default peak, else in use, else allocated). The file is
    written atomically; raises GpuflameError if it cannot be.
    """
    from gpuflame.render import writers

    writers.save(profile, path, writers.output_format(path, fmt), type_name)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gpuflame`` (IPython looks for this function in the module it loads)."""
    from gpuflame.notebook import load_ipython_extension as load

    load(ipython)
