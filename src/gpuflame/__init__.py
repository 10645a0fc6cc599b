"""gpuflame: which Python functions hold the GPU memory?

    with gpuflame.profile("out.pb.gz"):
        ...                       # then: gpuflame report out.pb.gz

In a notebook: ``%load_ext gpuflame``, then ``%%gpuflame`` on a cell.
Phases: ``with gpuflame.phase("train"): ...`` (or ``gpuflame.phase("serve")``).
"""

from typing import Any

from gpuflame.api import profile, start, stop
from gpuflame.capture.phases import phase
from gpuflame.model import Frame, Profile, Sample, SampleType
from gpuflame.notebook import last

__version__ = "0.1.0"

__all__ = ["Frame", "Profile", "Sample", "SampleType", "__version__", "last", "phase", "profile", "start", "stop"]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gpuflame`` (IPython looks for this function in the module it loads)."""
    from gpuflame.notebook import load_ipython_extension as load

    load(ipython)
