"""formats/pprof_stdlib_parse.py: the profiled process's parse gives the protobuf runtime's answer.

The JAX recorder reads JAX's device-memory profile in the profiled process
with the standard library (pprof.decode_in_process); every other pprof is
read through the runtime. On real files both must give the same profile
(on mutated ones, or both a ProfileFormatError: test_fuzz_readers.py).
"""

from __future__ import annotations

import pytest

from gpuflame.errors import ProfileFormatError
from gpuflame.formats import pprof
from tests.helpers.paths import DATA

FILES = [
    "go-1.19-heap.pb.gz",
    "jax-0.10.2-cpu-device-memory.prof",
    "hostile/repeated-timeline.pb.gz",
    "gpuflame-0.1.0-data-in-comments.pb.gz",
]


def answer(data: bytes, standard_library: bool) -> object:
    """What a decode gives, compared whole (or "error")."""
    try:
        p = pprof.decode_in_process(data) if standard_library else pprof.decode(data)
    except ProfileFormatError:
        return "error"
    samples = [(s.stack, s.values, s.labels) for s in p.samples]
    return p.frames, samples, p.comments, p.sample_types, p.default_type, p.time_nanos, p.timeline, p.peaks


@pytest.mark.parametrize("name", FILES)
def test_real_files_read_the_same_without_the_runtime(name: str) -> None:
    data = (DATA / name).read_bytes()
    assert answer(data, True) == answer(data, False) != "error"


@pytest.mark.subprocess
def test_the_in_process_read_imports_no_runtime() -> None:
    """In a fresh interpreter: JAX's profile read as the recorder reads it, with no google.* module loaded."""
    import json
    import subprocess
    import sys

    code = (
        "import json, sys\nfrom gpuflame.formats import pprof\n"
        f"p = pprof.decode_in_process(open({str(DATA / FILES[1])!r}, 'rb').read())\n"
        "print(json.dumps([len(p.samples), sorted(m for m in sys.modules if m.split('.')[0] in ('google', 'numpy'))]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    count, loaded = json.loads(out.stdout)
    assert count > 0 and loaded == []
