"""The profile model and its verbs (merge, filter, diff, prune)."""

from gpuflame.model.diff import diff, negate, select_types
from gpuflame.model.filter import cut_callers, drop_small, focus, hide, ignore, select_labels
from gpuflame.model.merge import merge
from gpuflame.model.profile import (
    FRAME_KINDS,
    NATIVE,
    PYTHON,
    SYNTHETIC,
    TRAMPOLINE_KIND,
    Frame,
    Profile,
    Sample,
    SampleType,
    make_labels,
)
from gpuflame.model.prune import DEFAULT_FRAMEWORKS, prune_framework
from gpuflame.model.sample_types import memory_sample_types

__all__ = [
    "DEFAULT_FRAMEWORKS",
    "FRAME_KINDS",
    "NATIVE",
    "PYTHON",
    "SYNTHETIC",
    "TRAMPOLINE_KIND",
    "Frame",
    "Profile",
    "Sample",
    "SampleType",
    "cut_callers",
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
