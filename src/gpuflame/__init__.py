"""gpuflame: which Python functions hold the GPU memory?

    with gpuflame.profile("out.pb.gz"):
        ...                       # then: gpuflame report out.pb.gz
"""

from gpuflame.api import profile, start, stop
from gpuflame.model import Frame, Profile, Sample, SampleType

__version__ = "0.1.0"

__all__ = ["Frame", "Profile", "Sample", "SampleType", "__version__", "profile", "start", "stop"]
