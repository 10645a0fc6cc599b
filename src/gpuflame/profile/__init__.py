"""The profile model and its verbs (merge, filter, diff, prune)."""

from gpuflame.profile.diff import diff, negate, select_types
from gpuflame.profile.filter import drop_small, focus, hide, ignore, select_labels
from gpuflame.profile.merge import merge
from gpuflame.profile.model import (
    FRAME_KINDS,
    NATIVE,
    PYTHON,
    SYNTHETIC,
    TRAMPOLINE,
    Frame,
    Profile,
    Sample,
    SampleType,
    make_labels,
)
from gpuflame.profile.prune import DEFAULT_FRAMEWORKS, prune_framework
from gpuflame.profile.sample_types import memory_sample_types

__all__ = [
    "DEFAULT_FRAMEWORKS",
    "FRAME_KINDS",
    "NATIVE",
    "PYTHON",
    "SYNTHETIC",
    "TRAMPOLINE",
    "Frame",
    "Profile",
    "Sample",
    "SampleType",
    "diff",
    "drop_small",
    "focus",
    "hide",
    "ignore",
    "make_labels",
    "memory_sample_types",
    "merge",
    "negate",
    "prune_framework",
    "select_labels",
    "select_types",
]
