"""What the pprof writer and reader share: profile.proto's field numbers and the frame-kind rule.

Standard library only, below both: the writer (:mod:`gpuflame.formats.pprof`)
runs in the profiled process; the reader (:mod:`gpuflame.formats.pprof_read`)
reads through the ``protobuf`` runtime, by name, and shares the rule.
"""

from __future__ import annotations

from gpuflame.model.profile import NATIVE, PYTHON
from gpuflame.symbols.kinds import guess_kind

# Field numbers of profile.proto's Profile (only those gpuflame writes).
P_SAMPLE_TYPE, P_SAMPLE, P_MAPPING, P_LOCATION, P_FUNCTION, P_STRING_TABLE = 1, 2, 3, 4, 5, 6
P_TIME_NANOS, P_DURATION_NANOS, P_PERIOD_TYPE, P_PERIOD, P_COMMENT, P_DEFAULT_SAMPLE_TYPE = 9, 10, 11, 12, 13, 14
# gpuflame's own field, not pprof's (pprof_proto/split_profile.proto): its data entries, which readers of pprof
# skip, where comments would be printed by `go tool pprof -top`
P_GPUFLAME_DATA = 1000


def frame_kind(name: str, file: str, in_mapping: bool) -> str:
    """The kind a decoded frame gets: :func:`guess_kind`, and fileless frames in a Mapping are native."""
    kind = guess_kind(name, file)
    if kind == PYTHON and in_mapping and not file:
        return NATIVE
    return kind
