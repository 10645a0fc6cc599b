"""The sample types of a GPU-memory profile, named as Go's heap profiles are."""

from __future__ import annotations

from gpuflame.model.peak import JOINT_OBJECTS, JOINT_SPACE
from gpuflame.model.profile import SampleType

PEAK_SPACE = SampleType("peak_space", "bytes")
PEAK_OBJECTS = SampleType("peak_objects", "count")
INUSE_SPACE = SampleType("inuse_space", "bytes")
INUSE_OBJECTS = SampleType("inuse_objects", "count")
ALLOC_SPACE = SampleType("alloc_space", "bytes")
ALLOC_OBJECTS = SampleType("alloc_objects", "count")

# a process of a run: what it held at the run's joint peak (model/peak.py); the run's merge uses them up
JOINT_PEAK_SPACE = SampleType(JOINT_SPACE, "bytes")
JOINT_PEAK_OBJECTS = SampleType(JOINT_OBJECTS, "count")

# gpuflame simulate's profile (simulate/fragmentation.py), at the simulated reserved peak
FRAGMENTATION = SampleType("fragmentation", "bytes")
RESERVED = SampleType("reserved", "bytes")

ALL = (PEAK_SPACE, PEAK_OBJECTS, INUSE_SPACE, INUSE_OBJECTS, ALLOC_SPACE, ALLOC_OBJECTS)

DESCRIPTIONS = {
    "peak_space": "live at the moment of the highest total (the OOM question)",
    "peak_objects": "allocations live at the peak",
    "inuse_space": "live at the end of the window (leaks, steady state)",
    "inuse_objects": "allocations live at the end of the window",
    "alloc_space": "everything allocated in the window, frees ignored",
    "alloc_objects": "allocations made in the window",
    JOINT_SPACE: "live in this process at the highest total of its run's processes on the device, "
    "as far as it saw (gpuflame run merges it into peak_space)",
    JOINT_OBJECTS: "allocations live in this process at its run's joint peak",
    "fragmentation": "cached by the allocator but unused at its reserved peak, under the stacks whose "
    "allocations split the segments (gpuflame simulate)",
    "reserved": "segments held at the reserved peak, under the stacks whose allocations made them (gpuflame simulate)",
}


def memory_sample_types(peak: bool = True, inuse: bool = True, alloc: bool = True) -> list[SampleType]:
    """The space/objects pairs a memory profile carries, peak first."""
    out: list[SampleType] = []
    if peak:
        out += [PEAK_SPACE, PEAK_OBJECTS]
    if inuse:
        out += [INUSE_SPACE, INUSE_OBJECTS]
    if alloc:
        out += [ALLOC_SPACE, ALLOC_OBJECTS]
    return out
