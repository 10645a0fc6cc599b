"""pprof reader/writer, checked against Google's protobuf runtime and by round trips."""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuflame.errors import GpuflameError, ProfileFormatError
from gpuflame.formats import load, loads, pprof
from gpuflame.formats import protobuf_encode as wire
from gpuflame.model import FRAME_KINDS, NATIVE, PYTHON, Frame, Profile, SampleType, make_labels
from gpuflame.symbols.kinds import guess_kind
from gpuflame.symbols.names import native_address_name
from tests.helpers.paths import DATA

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def view(p: Profile) -> tuple:
    """Everything a round trip must keep, with stacks as frame tuples (ids may be renumbered)."""
    samples = [(tuple(p.frames[i] for i in s.stack), s.values, s.labels) for s in p.samples]
    return (p.sample_types, p.comments, p.default_type, p.time_nanos, p.duration_nanos, samples)


# =============================================================================
# wire format
# =============================================================================


@pytest.mark.parametrize(
    "value",
    [
        0,
        1,
        127,
        128,
        300,
        16383,
        16384,
        (1 << 31) - 1,
        1 << 31,
        1 << 32,
        INT64_MAX,
        -1,
        -2,
        -(1 << 31),
        INT64_MIN,
    ],
)
def test_varints_match_googles_encoding(profile_pb2: ModuleType, value: int) -> None:
    packed = profile_pb2.Profile(comment=[value, value]).SerializeToString()
    assert wire.field_packed(13, [value, value]) == packed
    assert list(profile_pb2.Profile.FromString(packed).comment) == [value, value]
    scalar = profile_pb2.Label(num=value).SerializeToString()
    assert wire.field_varint(3, value) == scalar  # zero is omitted by both


def test_negative_int64_is_a_ten_byte_varint(profile_pb2: ModuleType) -> None:
    assert len(wire.encode_varint(-1)) == 10
    assert profile_pb2.Label.FromString(wire.field_varint(3, -5)).num == -5


def test_out_of_range_integers_are_refused_when_writing() -> None:
    with pytest.raises(ValueError):
        wire.encode_varint(1 << 64)
    with pytest.raises(ValueError):
        wire.encode_varint(INT64_MIN - 1)
    for value, line in ((INT64_MAX + 1, 1), (INT64_MIN - 1, 1), (5, INT64_MAX + 1)):
        p = Profile(sample_types=[SampleType("inuse_space", "bytes")])
        p.add([Frame("f", "/f.py", line)], [value])
        with pytest.raises(GpuflameError, match=r"^cannot write pprof: .* does not fit in int64$"):
            pprof.encode(p)


@given(st.lists(st.integers(0, (1 << 64) - 1), max_size=50))
def test_packed_varints_are_what_google_reads(values: list[int]) -> None:
    from gpuflame.formats.pprof_proto import profile_pb2

    assert list(profile_pb2.Sample.FromString(wire.field_packed(1, values)).location_id) == values


@pytest.mark.parametrize(
    "data",
    [
        b"\x08",  # a varint cut short
        b"\x12\x05ab",  # a sample longer than the data
        b"\x09\x00\x00",  # a fixed64 cut short
        b"\x08" + b"\xff" * 11 + b"\x01",  # a varint longer than 10 bytes
        b"\x0b",  # a group never closed
        b"\x0e",  # wire type 6
        b"\x00\x01",  # field number 0
        b"\x12\x03\x0a\x01\x81",  # a sample's packed ids cut inside the last one
    ],
)
def test_malformed_protobuf_is_a_format_error(data: bytes) -> None:
    for blob in (data, gzip.compress(data)):
        with pytest.raises(ProfileFormatError, match="^malformed pprof: "):
            pprof.decode(blob)


# =============================================================================
# our bytes, read by Google's protobuf
# =============================================================================


def test_google_protobuf_reads_every_field_we_write(profile_pb2: ModuleType, rich_profile: Profile) -> None:
    data = pprof.encode(rich_profile)
    msg = profile_pb2.Profile.FromString(gzip.decompress(data))
    strings = list(msg.string_table)
    assert strings[0] == ""
    assert len(set(strings)) == len(strings), "each string is stored once"

    assert [(strings[t.type], strings[t.unit]) for t in msg.sample_type] == [
        tuple(t) for t in rich_profile.sample_types
    ]
    assert strings[msg.default_sample_type] == rich_profile.default_type
    assert [strings[i] for i in msg.comment] == rich_profile.comments
    assert (msg.time_nanos, msg.duration_nanos) == (rich_profile.time_nanos, rich_profile.duration_nanos)
    first = rich_profile.sample_types[0]
    assert (strings[msg.period_type.type], strings[msg.period_type.unit], msg.period) == (
        first.type,
        first.unit,
        1,
    )

    locations = {loc.id: loc for loc in msg.location}
    functions = {fn.id: fn for fn in msg.function}
    mappings = {m.id: m for m in msg.mapping}
    assert len(locations) == len(msg.location) and len(functions) == len(msg.function)
    assert 0 not in locations and 0 not in functions and 0 not in mappings
    keys = [(fn.name, fn.system_name, fn.filename) for fn in msg.function]
    assert len(set(keys)) == len(keys), "one Function per distinct (name, system_name, filename)"

    def frame_of(location_id: int) -> tuple[str, str, int, bool, int]:
        loc = locations[location_id]
        mapping_file = strings[mappings[loc.mapping_id].filename] if loc.mapping_id else None
        assert len(loc.line) == 1, "every location has its Line, address-named ones too"
        fn = functions[loc.line[0].function_id]
        name, file = strings[fn.name], strings[fn.filename]
        dotted = name.replace(" > ", ".")
        # equal names are left out so that go tool pprof does not "demangle" <module> to ""
        assert strings[fn.system_name] == (dotted if dotted != name else "")
        if mapping_file is not None:
            assert mapping_file == file
        return name, file, loc.line[0].line, bool(loc.mapping_id), loc.address

    assert len(msg.sample) == len(rich_profile.samples)
    for got, want in zip(msg.sample, rich_profile.samples, strict=True):
        assert tuple(got.value) == want.values
        frames = rich_profile.stack_frames(want)
        decoded = [frame_of(i) for i in got.location_id]
        assert [d[:3] for d in decoded] == [(f.name, f.file, f.line) for f in frames]
        for d, f in zip(decoded, frames, strict=True):
            assert d[3] == (f.kind == NATIVE), "native frames, and only they, have a mapping"
            if f.name.startswith("0x"):
                assert d[4] == int(f.name, 16)
        labels = [(strings[lab.key], strings[lab.str]) for lab in got.label]
        assert tuple(sorted(labels)) == want.labels
        assert all(lab.num == 0 for lab in got.label)


def test_location_ids_have_one_varint_width(profile_pb2: ModuleType) -> None:
    for n_frames, width in [(5, 1), (127, 1), (128, 2), (16256, 2), (16257, 3)]:
        base = pprof.location_id_base(n_frames)
        assert len(wire.encode_varint(base)) == width
        assert len(wire.encode_varint(base + n_frames - 1)) == width
    p = Profile(sample_types=[SampleType("alloc_space", "bytes")])
    frames = [Frame(f"f{i}", "/m.py", i) for i in range(300)]
    p.add(frames, [1])
    msg = profile_pb2.Profile.FromString(pprof.encode_raw(p))
    assert sorted(loc.id for loc in msg.location) == list(range(128, 428))
    assert list(msg.sample[0].location_id) == list(range(128, 428))


# =============================================================================
# Google's bytes, read by us
# =============================================================================


def _google_profile(pb: ModuleType) -> tuple[bytes, list[tuple[list[Frame], tuple[int, ...], tuple]]]:
    """A profile built with Google's classes the way Go's pprof and others write them.

    Returns its bytes and the samples we expect to read (frames leaf first).
    """
    strings = [""]

    def s(text: str) -> int:
        if text not in strings:
            strings.append(text)
        return strings.index(text)

    msg = pb.Profile()
    msg.sample_type.add(type=s("alloc_objects"), unit=s("count"))
    msg.sample_type.add(type=s("alloc_space"), unit=s("bytes"))
    msg.mapping.add(id=7, memory_start=0x400000, memory_limit=0x800000, filename=s("/usr/bin/app"), has_functions=True)
    big_fn, big_loc = 1 << 40, (1 << 33) + 5
    msg.function.add(id=1, name=s("main.alloc"), system_name=s("main.alloc"), filename=s("/src/main.go"))
    msg.function.add(id=2, name=s("main.inlined"), filename=s("/src/main.go"))
    msg.function.add(id=big_fn, name=s(""), system_name=s("Model.forward"), filename=s("/m/model.py"))
    # an inlined call: line[0] is the innermost frame
    msg.location.add(
        id=1,
        mapping_id=7,
        address=0x401000,
        line=[pb.Line(function_id=2, line=10), pb.Line(function_id=1, line=20)],
    )
    msg.location.add(id=big_loc, mapping_id=7, address=0x7F15DEADBEEF)  # no line: unsymbolized
    msg.location.add(id=3, line=[pb.Line(function_id=big_fn, line=300)])
    sample = msg.sample.add(location_id=[big_loc, 1, 3], value=[3, (1 << 35) + 7])
    sample.label.add(key=s("bytes"), num=4096, num_unit=s("bytes"))
    sample.label.add(key=s("pid"), str=s("77"))
    msg.sample.add(location_id=[3], value=[-1, -(1 << 40)])
    msg.comment.append(s("from google"))
    msg.default_sample_type = s("alloc_space")
    msg.time_nanos = 123
    msg.duration_nanos = 456
    msg.drop_frames = s("runtime\\..*")
    msg.doc_url = s("https://example.invalid/doc")
    msg.string_table.extend(strings)

    addr = Frame(native_address_name(0x7F15DEADBEEF), "/usr/bin/app", 0, NATIVE)
    inner = Frame("main.inlined", "/src/main.go", 10, NATIVE)
    outer = Frame("main.alloc", "/src/main.go", 20, NATIVE)
    model = Frame("Model.forward", "/m/model.py", 300, PYTHON)
    expected = [
        ([addr, inner, outer, model], (3, (1 << 35) + 7), make_labels({"bytes": 4096, "pid": "77"})),
        ([model], (-1, -(1 << 40)), ()),
    ]
    return msg.SerializeToString(), expected


def test_we_read_what_google_protobuf_writes(profile_pb2: ModuleType) -> None:
    data, expected = _google_profile(profile_pb2)
    for blob in (data, gzip.compress(data)):
        p = pprof.decode(blob)
        assert p.sample_types == [SampleType("alloc_objects", "count"), SampleType("alloc_space", "bytes")]
        assert p.default_type == "alloc_space"
        assert p.comments == ["from google"]
        assert (p.time_nanos, p.duration_nanos) == (123, 456)
        got = [(p.stack_frames(s), s.values, s.labels) for s in p.samples]
        assert got == expected


def test_loads_sniffs_raw_and_gzip_pprof(profile_pb2: ModuleType) -> None:
    data, expected = _google_profile(profile_pb2)
    assert [s.values for s in loads(data).samples] == [e[1] for e in expected]
    assert [s.values for s in loads(gzip.compress(data)).samples] == [e[1] for e in expected]


def test_unpacked_repeated_fields_are_read_too() -> None:
    # proto2-era writers put each location id and value in its own field
    def sample(ids: list[int], values: list[int]) -> bytes:
        body = b"".join(wire.field_varint(1, i) for i in ids)
        body += b"".join(wire.tag(2, wire.VARINT) + wire.encode_varint(v) for v in values)
        return wire.field_bytes(2, body)

    fn = wire.field_bytes(5, wire.field_varint(1, 1) + wire.field_varint(2, 3))
    loc = b"".join(
        wire.field_bytes(
            4,
            wire.field_varint(1, lid) + wire.field_bytes(4, wire.field_varint(1, 1) + wire.field_varint(2, lid)),
        )
        for lid in (1, 200)
    )
    table = b"".join(wire.field_string(6, t) for t in ("", "space", "bytes", "f"))
    st_ = wire.field_bytes(1, wire.field_varint(1, 1) + wire.field_varint(2, 2))
    p = pprof.decode(st_ + sample([200, 1], [-7]) + fn + loc + table)
    assert [(f.name, f.line) for f in p.stack_frames(p.samples[0])] == [("f", 200), ("f", 1)]
    assert p.samples[0].values == (-7,)


def test_unknown_fields_of_any_wire_type_are_skipped(rich_profile: Profile) -> None:
    raw = pprof.encode_raw(rich_profile)
    extra = (
        wire.tag(99, 5)  # fixed32
        + b"\x01\x02\x03\x04"
        + wire.tag(98, 1)  # fixed64
        + b"\x00" * 8
        + wire.field_bytes(97, b"whatever")
        + wire.field_varint(96, 5)
    )
    assert view(pprof.decode(extra + raw)) == view(pprof.decode(raw))


# =============================================================================
# round trips
# =============================================================================


def test_round_trip_keeps_everything(rich_profile: Profile) -> None:
    back = pprof.decode(pprof.encode(rich_profile))
    assert view(back) == view(rich_profile)
    assert {f.kind for f in back.frames} == set(FRAME_KINDS)


def test_output_is_gzip_and_reproducible(rich_profile: Profile) -> None:
    data = pprof.encode(rich_profile)
    assert data[:2] == b"\x1f\x8b"
    assert data == pprof.encode(rich_profile)
    assert gzip.decompress(data) == pprof.encode_raw(rich_profile)


def test_round_trip_with_many_frames_takes_every_stack_path() -> None:
    """1-byte, 2-byte and 3-byte location ids all decode (each width has its own code path)."""
    for n_frames in (100, 3000, 17000):
        p = Profile(sample_types=[SampleType("inuse_space", "bytes")])
        frames = [Frame(f"C{i % 50} > m{i}", f"/pkg/mod{i % 7}.py", i + 1) for i in range(n_frames)]
        for start in range(0, n_frames, 37):
            p.add(frames[start : start + 40], [start * 1000 + 1])
        p.add(frames[:1], [1])
        assert view(pprof.decode(pprof.encode(p))) == view(p)


def test_kind_is_derived_on_read() -> None:
    p = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    lying = Frame("helper", "/a/b.py", 3, NATIVE)  # a Python file, but marked native
    p.add([lying], [1])
    back = pprof.decode(pprof.encode(p))
    assert back.frames == [Frame("helper", "/a/b.py", 3, pprof.frame_kind("helper", "/a/b.py", True))]
    assert back.frames[0].kind == PYTHON


def _expected_kind(name: str, file: str, kind: str) -> str:
    return pprof.frame_kind(name, file, kind == NATIVE)


names = st.one_of(
    st.text(min_size=1, max_size=12),
    st.sampled_from(["<module>", "<interpreter trampoline>", "<cached free blocks>", "Foo > bar", "a;b"]),
    st.integers(0, (1 << 64) - 1).map(native_address_name),
)
files = st.one_of(st.just(""), st.sampled_from(["/a/x.py", "libcuda.so", "<frozen os>"]), st.text(max_size=8))


@st.composite
def frames(draw: st.DrawFn) -> Frame:
    name, file = draw(names), draw(files)
    kind = _expected_kind(name, file, draw(st.sampled_from(FRAME_KINDS)))
    return Frame(name, file, draw(st.integers(0, INT64_MAX)), kind)


@st.composite
def profiles(draw: st.DrawFn) -> Profile:
    types = draw(st.lists(st.tuples(st.text(min_size=1, max_size=6), st.text(max_size=6)), max_size=4))
    p = Profile(sample_types=types)
    frame_pool = draw(st.lists(frames(), min_size=1, max_size=20))
    for _ in range(draw(st.integers(0, 8))):
        stack = draw(st.lists(st.sampled_from(frame_pool), max_size=12))
        values = draw(st.lists(st.integers(INT64_MIN, INT64_MAX), min_size=len(types), max_size=len(types)))
        labels = draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3))
        p.add(stack, values, labels)
    p.comments = draw(st.lists(st.text(max_size=10), max_size=3))
    p.default_type = draw(st.sampled_from([None] + [t for t, _ in types]))
    p.time_nanos = draw(st.integers(INT64_MIN, INT64_MAX))
    p.duration_nanos = draw(st.integers(INT64_MIN, INT64_MAX))
    return p


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profiles())
def test_round_trip_of_random_profiles(p: Profile) -> None:
    assert view(pprof.decode(pprof.encode(p))) == view(p)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profiles())
def test_random_profiles_read_the_same_with_google_protobuf(profile_pb2: ModuleType, p: Profile) -> None:
    msg = profile_pb2.Profile.FromString(pprof.encode_raw(p))
    strings = list(msg.string_table)
    locations = {loc.id: loc for loc in msg.location}
    functions = {fn.id: fn for fn in msg.function}
    assert [tuple(s.value) for s in msg.sample] == [s.values for s in p.samples]
    for got, want in zip(msg.sample, p.samples, strict=True):
        names_ = []
        for lid in got.location_id:
            loc = locations[lid]
            names_.append(
                strings[functions[loc.line[0].function_id].name] if loc.line else native_address_name(loc.address)
            )
        assert names_ == [f.name for f in p.stack_frames(want)]
    # and Google's re-serialization (canonical field order) reads back the same
    assert view(pprof.decode(msg.SerializeToString())) == view(p)


def test_a_frame_named_0x0_keeps_its_name() -> None:
    p = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    p.add([Frame("0x0", "", 0, NATIVE), Frame("0x00", "", 0, NATIVE)], [5])
    assert view(pprof.decode(pprof.encode(p))) == view(p)


def test_decoded_kinds_follow_guess_kind() -> None:
    p = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    fr = [
        Frame("x", "/a.py", 1),
        Frame("<cached free blocks>", kind="synthetic"),
        Frame("0xabcdef12", kind=NATIVE),
    ]
    p.add(fr, [1])
    back = pprof.decode(pprof.encode(p))
    assert [f.kind for f in back.frames] == [guess_kind(f.name, f.file) for f in fr]


# =============================================================================
# bad input
# =============================================================================


def _message(sample_types: list[tuple[int, int]], strings: list[str], extra: bytes = b"") -> bytes:
    out = b"".join(wire.field_bytes(1, wire.field_varint(1, t) + wire.field_varint(2, u)) for t, u in sample_types)
    return out + extra + b"".join(wire.field_string(6, s) for s in strings)


def test_a_missing_location_is_named() -> None:
    for lid in (5, 300):  # a one-byte and a two-byte id
        sample = wire.field_bytes(2, wire.field_packed(1, [lid]) + wire.field_packed(2, [1]))
        with pytest.raises(ProfileFormatError, match=f"location {lid}, which does not exist"):
            pprof.decode(_message([(1, 2)], ["", "space", "bytes"], sample))


@pytest.mark.parametrize(
    ("ids", "missing"), [([1, 99], 99), ([1, 300], 300), ([200, 300], 200), ([2, 3, 70000], 70000)]
)
def test_a_missing_location_among_existing_ones_is_found(rich_profile: Profile, ids: list[int], missing: int) -> None:
    """Each id layout (one byte, mixed widths, two bytes, three bytes) reports the missing id."""
    raw = pprof.encode_raw(rich_profile)
    bad = wire.field_bytes(2, wire.field_packed(1, ids) + wire.field_packed(2, [0] * 6))
    with pytest.raises(ProfileFormatError, match=f"location {missing},"):
        pprof.decode(raw + bad)


def test_value_count_must_match_sample_types() -> None:
    sample = wire.field_bytes(2, wire.field_packed(2, [1, 2]))
    with pytest.raises(ProfileFormatError, match="2 values but the profile has 1 sample types"):
        pprof.decode(_message([(1, 2)], ["", "space", "bytes"], sample))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            wire.field_bytes(4, wire.field_varint(1, 1) + wire.field_bytes(4, wire.field_varint(1, 9))),
            "function 9",
        ),
        (wire.field_bytes(4, wire.field_varint(1, 1) + wire.field_varint(2, 4)), "mapping 4"),
        (wire.field_bytes(4, wire.field_varint(2, 0)), "location has id 0"),
        (wire.field_bytes(5, wire.field_varint(2, 1)), "function has id 0"),
        (wire.field_bytes(5, wire.field_varint(1, 1) + wire.field_varint(2, 50)), "string 50"),
        (wire.field_varint(14, 77), "string 77"),
        (wire.field_bytes(4, wire.field_varint(1, 1)) * 2, "location id 1 appears twice"),
    ],
)
def test_broken_references_are_format_errors(extra: bytes, message: str) -> None:
    with pytest.raises(ProfileFormatError, match=message):
        pprof.decode(_message([(1, 2)], ["", "space", "bytes"], extra))


def test_string_table_must_start_empty() -> None:
    with pytest.raises(ProfileFormatError, match="string_table"):
        pprof.decode(_message([(1, 2)], ["x", "space", "bytes"]))


def test_every_truncation_is_a_format_error(rich_profile: Profile) -> None:
    raw = pprof.encode_raw(rich_profile)
    failures = 0
    for cut in range(1, len(raw)):
        try:
            pprof.decode(raw[:cut])
        except ProfileFormatError as exc:
            assert "\n" not in str(exc)
            failures += 1
    # a cut between two top-level fields is a valid, smaller profile; most cuts are not
    assert failures > len(raw) // 2


def test_truncated_gzip_is_a_plain_error(rich_profile: Profile) -> None:
    data = pprof.encode(rich_profile)
    with pytest.raises(ProfileFormatError, match="truncated"):
        pprof.decode(data[: len(data) // 2])


# =============================================================================
# files from other tools, and other tools reading ours
# =============================================================================


def test_reads_a_real_go_heap_profile() -> None:
    """tests/data/go-1.19-heap.pb.gz: runtime/pprof's heap profile of a small Go program.

    The program (Go 1.19, MemProfileRate=1) appends fifty 64 KiB slices from an
    inlined method ``(*Model).Forward``. The expected numbers are what
    ``go tool pprof -raw`` prints for the same file: 11 samples with a non-zero
    value (it hides all-zero ones; the file has 17), 3279744 bytes in use.
    """
    p = load(DATA / "go-1.19-heap.pb.gz")
    assert [str(t) for t in p.sample_types] == [
        "alloc_objects/count",
        "alloc_space/bytes",
        "inuse_objects/count",
        "inuse_space/bytes",
    ]
    assert len(p.samples) == 17
    assert sum(1 for s in p.samples if any(s.values)) == 11
    assert p.totals()["inuse_space"] == 3279744
    biggest = max(p.samples, key=lambda s: s.values[3])
    assert biggest.values == (50, 50 * 65536, 50, 50 * 65536)
    assert biggest.labels == (("bytes", "65536"),)
    # Forward was inlined into main.main: one Location, two Lines, innermost first
    assert [(f.name, f.file.rsplit("/", 1)[-1], f.line, f.kind) for f in p.stack_frames(biggest)] == [
        ("main.(*Model).Forward", "main.go", 15, NATIVE),
        ("main.main", "main.go", 22, NATIVE),
        ("runtime.main", "proc.go", 250, NATIVE),
    ]


GO = shutil.which("go")
RAW_SAMPLE = re.compile(r"^\s*(-?\d+(?:\s+-?\d+)*):((?: \d+)*)\s*$")


def _go_pprof_raw(path: Path) -> list[tuple[tuple[int, ...], int]]:
    """``(values, stack depth)`` per sample, as ``go tool pprof -raw`` reads the file."""
    out = subprocess.run([GO, "tool", "pprof", "-raw", str(path)], capture_output=True, text=True, check=True)
    rows = []
    for line in out.stdout.splitlines():
        m = RAW_SAMPLE.match(line)
        if m:
            rows.append((tuple(int(v) for v in m.group(1).split()), len(m.group(2).split())))
    return rows


@pytest.mark.subprocess
@pytest.mark.skipif(GO is None, reason="go is not installed (apt-get install golang-go)")
def test_go_tool_pprof_reads_our_files(tmp_path: Path, rich_profile: Profile) -> None:
    many = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    frames = [Frame(f"f{i}", "/x.py", i + 1) for i in range(17000)]  # three-byte location ids
    many.add(frames[-3:], [5])
    many.add(frames[:2], [7])
    for name, p in (("rich", rich_profile), ("many", many)):
        path = tmp_path / f"{name}.pb.gz"
        path.write_bytes(pprof.encode(p))
        # pprof hides samples whose values are all zero
        expected = [(s.values, len(s.stack)) for s in p.samples if any(s.values)]
        assert _go_pprof_raw(path) == expected
    top = subprocess.run(
        [GO, "tool", "pprof", "-top", "-sample_index=inuse_space", str(tmp_path / "rich.pb.gz")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in ("<module>", "<interpreter trampoline>", "LlamaMLP > forward", "0x7f15deadbeef"):
        assert name in top


def test_readers_take_gzip_from_below_and_pprof_fits_in_modules_under_500_lines() -> None:
    """Issue 22 item 5: no import loop between formats/load_save.py and the readers; pprof split to size."""
    import ast

    folder = Path(pprof.__file__).parent
    for name in ("pprof", "pprof_read", "pprof_tables", "pprof_samples", "pprof_bulk", "torch_snapshot"):
        tree = ast.parse((folder / f"{name}.py").read_text(encoding="utf-8"))
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert "gpuflame.formats.load_save" not in imported, name
    gzip_io = ast.parse((folder / "gzip_io.py").read_text(encoding="utf-8"))
    assert not [n for n in ast.walk(gzip_io) if isinstance(n, ast.ImportFrom) and "formats" in (n.module or "")]
    for path in folder.glob("pprof*.py"):
        assert len(path.read_text(encoding="utf-8").splitlines()) < 500, path.name


def test_the_inflated_bytes_are_let_go_before_the_samples_are_read(monkeypatch) -> None:
    """A million-frame pprof inflates to 225 MB: held while the samples were read, it raised the peak as much.

    By the time the samples are read the inflated file is gone, and they come
    as their joined bytes (pprof_samples.SampleBytes), not a bytes object each.
    """
    import sys

    from gpuflame.formats import pprof_read
    from tests.helpers.large_profile import tree_profile

    inflated: list[bytes] = []

    def gunzip(data: bytes) -> bytes:
        inflated.append(gzip.decompress(data))
        return inflated[-1]

    real_columns = pprof_read.read_sample_columns
    seen: dict[str, object] = {}

    def columns(samples, *rest):
        seen["inflated held elsewhere"] = sys.getrefcount(inflated[0]) > 2  # the list's and the call's
        seen["samples"] = samples
        return real_columns(samples, *rest)

    monkeypatch.setattr(pprof_read, "gunzip", gunzip)
    monkeypatch.setattr(pprof_read, "read_sample_columns", columns)
    profile = tree_profile(50)
    decoded = pprof.decode(pprof.encode(profile))
    assert seen["inflated held elsewhere"] is False
    assert type(seen["samples"]).__name__ == "SampleBytes"
    assert sorted(decoded.stack_frames(s)[0].name for s in decoded.samples) == sorted(
        profile.stack_frames(s)[0].name for s in profile.samples
    )


def test_a_large_location_table_is_read_as_arrays_that_still_answer_as_a_mapping(monkeypatch) -> None:
    """pprof_bulk.OneFrameEach: no dict of a million 1-tuples, unless a reader asks for one."""
    import numpy as np

    from gpuflame.formats import pprof_bulk, pprof_read, pprof_samples, pprof_tables

    monkeypatch.setattr(pprof_tables, "BULK_MIN", 0)
    monkeypatch.setattr(pprof_samples, "BULK_MIN", 0)
    found: list = []

    def read_locations(*args):
        found.append(pprof_tables.read_locations(*args))
        return found[0]

    monkeypatch.setattr(pprof_read, "read_locations", read_locations)
    profile = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    profile.add([Frame("leaf", "/a.py", 3), Frame("<module>", "/a.py", 9)], [100])
    profile.add([Frame("other", "/b.py", 4), Frame("<module>", "/a.py", 9)], [50])
    decoded = pprof.decode(pprof.encode(profile))
    table = found[0]
    assert isinstance(table, pprof_bulk.OneFrameEach) and table._dict is None
    assert pprof_samples.one_frame_each(table) and table._dict is None  # said without the dict
    lookup = pprof_bulk._FrameLookup.of(table)
    assert lookup is not None and table._dict is None
    as_dict = dict(table)
    assert len(as_dict) == len(table) == 3 and all(len(v) == 1 for v in as_dict.values())
    assert {decoded.frames[v[0]].name for v in as_dict.values()} == {"leaf", "other", "<module>"}
    ids = np.array(list(as_dict), dtype=np.uint64)
    assert lookup(ids).tolist() == [as_dict[i][0] for i in as_dict]
    with pytest.raises(KeyError):
        table[10**9]


@pytest.mark.parametrize(("key", "variable"), [(b"\x12", "SAMPLES"), (b"\x22", "FRAMES"), (b"\x32", "FRAMES")])
def test_a_table_past_its_limit_stops_before_the_parse(monkeypatch, key: bytes, variable: str) -> None:
    """Two bytes of file can be an empty sample, and the runtime's parse makes an object of 40 bytes of it:
    a file of a billion is refused by the count of its key bytes, before anything is parsed."""
    from gpuflame import limits
    from gpuflame.formats import pprof_read

    monkeypatch.setenv(getattr(limits, variable).env, "1000")
    parsed = []
    real = pprof_read.runtime_parser

    def parser():  # type: ignore[no-untyped-def]
        found = real()
        return found._replace(profile=lambda data: parsed.append(data) or found.profile(data))

    monkeypatch.setattr(pprof_read, "runtime_parser", parser)
    with pytest.raises(ProfileFormatError, match=f"before parsing.*{getattr(limits, variable).env}"):
        pprof.decode(key + b"\x00" + (key + b"\x00") * 1000)
    assert parsed == []
    pprof.decode((b"\x12\x00") * 999)  # under the limit: parsed
    assert len(parsed) == 1


def test_locations_of_one_line_each_read_in_bulk_as_one_by_one(monkeypatch, rich_profile: Profile) -> None:
    """pprof_tables._one_line_frames (every writer's usual table, C loops) against the location-by-location reader."""
    from gpuflame.formats import pprof_tables

    files = [pprof.encode(rich_profile), (DATA / "jax-0.10.2-cpu-device-memory.prof").read_bytes()]
    taken = []
    real = pprof_tables._one_line_frames

    def spy(*args):  # type: ignore[no-untyped-def]
        taken.append(real(*args))
        return taken[-1]

    monkeypatch.setattr(pprof_tables, "_one_line_frames", spy)
    bulk = [pprof.decode(data) for data in files]
    assert all(t is not None for t in taken) and len(taken) == len(files)
    monkeypatch.setattr(pprof_tables, "_one_line_frames", lambda *args: None)
    for data, fast in zip(files, bulk, strict=True):
        slow = pprof.decode(data)
        assert slow.frames == fast.frames and slow.samples == fast.samples
