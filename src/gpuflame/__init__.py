"""gpuflame: which Python functions hold the GPU memory?"""

from gpuflame.profile import Frame, Profile, Sample, SampleType

__version__ = "0.1.0"

__all__ = ["Frame", "Profile", "Sample", "SampleType", "__version__"]
