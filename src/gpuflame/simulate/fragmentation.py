"""The ``fragmentation`` profile: who makes the memory the allocator holds but does not use.

At each device's simulated reserved peak, every free block's bytes (cached,
not handed out) go under the stack whose allocation split it off its
segment (a segment never split: the stack that made it), as
``fragmentation``; every segment's bytes go under the stack whose
allocation made it, as ``reserved``. So the flame graph's widest
``fragmentation`` bars are the functions whose allocation patterns waste
memory. Stacks of segments made before the trace began are not known
(``<no stack recorded>``). Its timeline is the simulated allocated bytes
over the whole replay, per device (the viewer's strip).
"""

from __future__ import annotations

from gpuflame.model.profile import Profile
from gpuflame.model.sample_types import FRAGMENTATION, RESERVED
from gpuflame.model.timeline import Timeline
from gpuflame.simulate.replay import Run
from gpuflame.units import format_bytes


def fragmentation_profile(run: Run) -> Profile:
    """One profile, label ``device`` per device, ``fragmentation`` opening first."""
    profile = Profile([FRAGMENTATION, RESERVED], default_type=FRAGMENTATION.type)
    timeline = profile.timeline = Timeline()
    for sim, out, sites in run.at_peaks():
        waste: dict[int, int] = {}
        held: dict[int, int] = {}
        for pool in (sim.small, sim.large):
            for b in pool.blocks.values():
                waste[b.origin] = waste.get(b.origin, 0) + b.size
        for seg in sim.segments.values():
            held[seg.site] = held.get(seg.site, 0) + seg.reserved()
        for site in sorted(waste.keys() | held.keys()):
            profile.add(sites.frames(site), [waste.get(site, 0), held.get(site, 0)], {"device": out.device})
        timeline.add_series((("device", out.device),), out.over_time.points("allocated"))
        profile.comments.append(
            f"{out.device}: gpuflame simulate at the simulated reserved peak ({format_bytes(sim.reserved)} reserved, "
            f"{format_bytes(sim.allocated)} allocated), settings: {out.settings}"
        )
    return profile
