"""Mutated files fed to every reader behind ``gpuflame.formats.loads``.

Each input must either load into a valid Profile or raise ProfileFormatError
(one plain line); any other exception is a bug. Seeds are fixed, so a failure
reproduces. Inputs: gzip pprof, raw pprof (small ids, two-byte ids, inlined
locations), folded stacks, and every ``tests/fixtures/*.pickle`` (PyTorch
snapshots) once ``gpuflame.formats.torch_snapshot`` exists.

For gzip, the protobuf inside is mutated and compressed again as well: bit
flips in the gzip stream itself mostly stop at its CRC check and would never
reach the protobuf decoder.
"""

from __future__ import annotations

import gzip
import importlib.util
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflame.errors import ProfileFormatError
from gpuflame.formats import detect, folded, loads, pprof
from gpuflame.formats import protobuf_wire as wire
from gpuflame.model import FRAME_KINDS, Frame, Profile, SampleType

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("*.pickle"))
SNAPSHOT_READER = importlib.util.find_spec("gpuflame.formats.torch_snapshot") is not None
MUTATIONS_PER_SEED = 700
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1  # what pprof can store


def mutations(data: bytes, rng: random.Random, count: int = MUTATIONS_PER_SEED) -> Iterator[bytes]:
    """Truncations at regular steps, then *count* random edits, then random bytes."""
    step = max(1, len(data) // 80)
    for cut in range(0, len(data), step):
        yield data[:cut]
    for _ in range(count):
        buf = bytearray(data)
        kind = rng.randrange(5)
        pos = rng.randrange(len(buf)) if buf else 0
        if kind == 0 and buf:  # bit flips
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(len(buf))
                buf[i] ^= 1 << rng.randrange(8)
        elif kind == 1:  # overwrite a run with random bytes
            run = rng.randint(1, 8)
            buf[pos : pos + run] = rng.randbytes(run)
        elif kind == 2:  # insert random bytes
            buf[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif kind == 3:  # delete a slice
            del buf[pos : pos + rng.randint(1, 16)]
        else:  # duplicate a slice somewhere else
            piece = buf[pos : pos + rng.randint(1, 32)]
            at = rng.randrange(len(buf) + 1)
            buf[at:at] = piece
        yield bytes(buf)
    for size in (1, 2, 3, 8, 64, 512, 4096):
        yield rng.randbytes(size)


def check_profile(p: Profile) -> None:
    """A loaded profile is well formed and can be written again."""
    assert isinstance(p, Profile)
    assert all(
        isinstance(t, SampleType) and isinstance(t.type, str) and isinstance(t.unit, str)
        for t in p.sample_types
    )
    for f in p.frames:
        assert isinstance(f, Frame)
        assert isinstance(f.name, str) and isinstance(f.file, str)
        assert type(f.line) is int and INT64_MIN <= f.line <= INT64_MAX
        assert f.kind in FRAME_KINDS
    n_frames, n_types = len(p.frames), len(p.sample_types)
    for s in p.samples:
        assert type(s.stack) is tuple and all(type(i) is int and 0 <= i < n_frames for i in s.stack)
        assert type(s.values) is tuple and len(s.values) == n_types
        assert all(type(v) is int and INT64_MIN <= v <= INT64_MAX for v in s.values), s.values
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in s.labels)
    assert all(isinstance(c, str) for c in p.comments)
    for name in ("time_nanos", "duration_nanos"):
        value = getattr(p, name)
        assert type(value) is int and INT64_MIN <= value <= INT64_MAX, f"{name} = {value} does not fit pprof"
    assert p.default_type is None or isinstance(p.default_type, str)
    pprof.decode(pprof.encode(p))
    if n_types:
        folded.encode(p, 0)


def feed(data: bytes) -> str:
    """``loaded``, ``rejected`` or ``skipped``; raises on anything but ProfileFormatError."""
    try:
        fmt = detect(data)
    except ProfileFormatError:
        return "rejected"
    if fmt == "torch-snapshot" and not SNAPSHOT_READER:
        return "skipped"
    try:
        p = loads(data, source="fuzz")
    except ProfileFormatError as exc:
        assert str(exc) and "\n" not in str(exc), repr(exc)
        return "rejected"
    check_profile(p)
    return "loaded"


def _many_frames() -> Profile:
    """Over 127 frames, so location ids are two bytes long."""
    p = Profile(sample_types=[SampleType("inuse_space", "bytes"), SampleType("inuse_objects", "count")])
    frames = [Frame(f"K{i % 9} > m{i}", f"/p/{i % 4}.py", i) for i in range(150)]
    for start in range(0, 150, 10):
        p.add(frames[start : start + 12], [start * 4096 - 100_000, 1], {"pid": start % 3})
    return p


def _inlined_raw() -> bytes:
    """A raw pprof message with an inlined (two-Line) location, a mapping and a num label."""
    strings = ["", "alloc_space", "bytes", "inner", "outer", "/src/a.go", "/bin/app", "n"]
    table = b"".join(wire.field_string(6, s) for s in strings)
    st_ = wire.field_bytes(1, wire.field_varint(1, 1) + wire.field_varint(2, 2))
    mapping = wire.field_bytes(3, wire.field_varint(1, 1) + wire.field_varint(5, 6))
    fns = b"".join(
        wire.field_bytes(5, wire.field_varint(1, fid) + wire.field_varint(2, name) + wire.field_varint(4, 5))
        for fid, name in ((1, 3), (2, 4))
    )
    lines = wire.field_bytes(4, wire.field_varint(1, 1) + wire.field_varint(2, 7))
    lines += wire.field_bytes(4, wire.field_varint(1, 2) + wire.field_varint(2, 9))
    loc = wire.field_bytes(4, wire.field_varint(1, 1) + wire.field_varint(2, 1) + lines)
    loc += wire.field_bytes(
        4, wire.field_varint(1, 2) + wire.field_varint(2, 1) + wire.field_varint(3, 0x7F00AA)
    )
    label = wire.field_bytes(3, wire.field_varint(1, 7) + wire.field_varint(3, 64))
    sample = wire.field_bytes(2, wire.field_packed(1, [2, 1]) + wire.field_packed(2, [-5]) + label)
    return st_ + sample + mapping + loc + fns + table


def seeds(rich: Profile) -> dict[str, bytes]:
    pid_types = rich.type_index("inuse_space")
    # counts of _many_frames: its sizes go negative, which folded input refuses
    folded_text = folded.encode(rich, pid_types, locations=True) + folded.encode(_many_frames(), 1)
    folded_text += "<module> (train.py:3);step (train.py:9) 17\n\n"
    out = {
        "pprof-gzip": pprof.encode(rich),
        "pprof-raw": pprof.encode_raw(rich),
        "pprof-two-byte-ids": pprof.encode_raw(_many_frames()),
        "pprof-inlined": _inlined_raw(),
        "folded": folded_text.encode("utf-8"),
    }
    for path in FIXTURES:
        out[f"fixture-{path.name}"] = path.read_bytes()
    return out


SEED_NAMES = ["pprof-gzip", "pprof-raw", "pprof-two-byte-ids", "pprof-inlined", "folded"] + [
    f"fixture-{p.name}" for p in FIXTURES
]


@pytest.mark.parametrize("name", SEED_NAMES)
def test_mutated_inputs_load_or_fail_plainly(rich_profile: Profile, name: str) -> None:
    data = seeds(rich_profile)[name]
    if name.startswith("fixture-") and not SNAPSHOT_READER:
        pytest.skip("gpuflame.formats.torch_snapshot does not exist yet")
    assert feed(data) == "loaded", "the unmutated seed must load"
    rng = random.Random(f"gpuflame-fuzz-{name}")
    outcomes = {"loaded": 0, "rejected": 0, "skipped": 0}
    for mutated in mutations(data, rng):
        outcomes[feed(mutated)] += 1
    if name == "pprof-gzip":
        inner = gzip.decompress(data)
        for mutated in mutations(inner, rng):
            outcomes[feed(gzip.compress(mutated, mtime=0))] += 1
    # the fuzzing reached both outcomes, so it exercised the decoder rather than only its front door
    assert outcomes["loaded"] > 0 and outcomes["rejected"] > 0, outcomes
