"""Mutated files fed to every reader behind ``gpuflame.formats.loads``.

Each input must either load into a valid Profile or raise ProfileFormatError
(one plain line); any other exception is a bug. Seeds are fixed, so a failure
reproduces. Inputs: gzip pprof, raw pprof (small ids, two-byte ids, inlined
locations), folded stacks, speedscope JSON, and every ``tests/fixtures/*.pickle``
(PyTorch snapshots; one again as protocol 0). ``GPUFLAME_FUZZ_MUTATIONS``
raises the 700 mutations per seed for a longer run.

For gzip, the protobuf inside is mutated and compressed again as well: bit
flips in the gzip stream itself mostly stop at its CRC check and would never
reach the protobuf decoder.
"""

from __future__ import annotations

import base64
import gzip
import importlib.util
import os
import pickle
import random
from collections.abc import Iterator

import pytest

from gpuflame.errors import ProfileFormatError
from gpuflame.formats import detect, folded, loads, pprof, speedscope
from gpuflame.formats import protobuf_encode as wire
from gpuflame.model import FRAME_KINDS, Frame, Profile, SampleType
from tests.helpers.paths import FIXTURES

PICKLES = sorted(FIXTURES.glob("*.pickle"))
SNAPSHOT_READER = importlib.util.find_spec("gpuflame.formats.torch_snapshot") is not None
MUTATIONS_PER_SEED = int(os.environ.get("GPUFLAME_FUZZ_MUTATIONS", "700"))
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
        isinstance(t, SampleType) and isinstance(t.type, str) and isinstance(t.unit, str) for t in p.sample_types
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
    loc += wire.field_bytes(4, wire.field_varint(1, 2) + wire.field_varint(2, 1) + wire.field_varint(3, 0x7F00AA))
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
    out["speedscope"] = speedscope.encode(rich, pid_types).encode("utf-8")
    for path in PICKLES:
        out[f"fixture-{path.name}"] = path.read_bytes()
    out["pickle-protocol-0"] = pickle.dumps(pickle.loads(PICKLES[0].read_bytes()), protocol=0)
    return out


SEED_NAMES = [
    "pprof-gzip",
    "pprof-raw",
    "pprof-two-byte-ids",
    "pprof-inlined",
    "folded",
    "speedscope",
    "pickle-protocol-0",
] + [f"fixture-{p.name}" for p in PICKLES]


@pytest.mark.slow
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


def _wide_ids_raw() -> bytes:
    """A raw pprof message whose location ids are three bytes long (as in a profile of over 16,256 frames)."""
    strings = ["", "alloc_space", "bytes", "Model > forward", "step", "/src/m.py", "/bin/lib.so", "pid", "7"]
    table = b"".join(wire.field_string(6, s) for s in strings)
    st_ = wire.field_bytes(1, wire.field_varint(1, 1) + wire.field_varint(2, 2))
    mapping = wire.field_bytes(3, wire.field_varint(1, 1) + wire.field_varint(5, 6))
    fns = b"".join(
        wire.field_bytes(
            5,
            wire.field_varint(1, fid)
            + wire.field_varint(2, name)
            + wire.field_varint(4, 5)
            + wire.field_varint(5, 10 * fid),
        )
        for fid, name in ((1, 3), (2, 4), (3, 4))
    )
    locs = b"".join(
        wire.field_bytes(
            4,
            wire.field_varint(1, 20000 + i)
            + wire.field_varint(2, i == 3)
            + wire.field_bytes(4, wire.field_varint(1, i) + wire.field_varint(2, 40 + i)),
        )
        for i in (1, 2, 3)
    )
    label = wire.field_bytes(3, wire.field_varint(1, 7) + wire.field_varint(2, 8))
    samples = b"".join(
        wire.field_bytes(2, wire.field_packed(1, ids) + wire.field_packed(2, [size]) + label)
        for ids, size in (([20001, 20002], 4096), ([20003, 20002, 20001], 512), ([20002], -7))
    )
    return st_ + samples + mapping + locs + fns + table


def _decoded(data: bytes) -> object:
    """What decoding gives, comparable: the profile's content, or the error's words."""
    try:
        p = pprof.decode(data)
    except ProfileFormatError as exc:
        return str(exc)
    return p.frames, [(s.stack, s.values, s.labels) for s in p.samples], p.comments, p.sample_types


@pytest.mark.parametrize("name", ["pprof-raw", "pprof-two-byte-ids", "pprof-inlined", "pprof-wide-ids"])
def test_bulk_reading_gives_the_message_by_message_answer(
    rich_profile: Profile, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """formats/pprof_bulk.py forced on small mutated files: the runtime's answer sample by sample, or its error.

    In bulk twice: the samples in one piece, and in pieces of a few bytes
    (``SAMPLE_CHUNK``: a million-sample file is read a few MB at a time).
    """
    from gpuflame.formats import pprof_bulk, pprof_samples, pprof_tables

    data = {**seeds(rich_profile), "pprof-wide-ids": _wide_ids_raw()}[name]
    rng = random.Random(f"gpuflame-bulk-{name}")
    differ = []
    for mutated in [data, *mutations(data, rng, 250)]:
        answers = []
        for bulk_min, chunk in ((1 << 62, 1 << 22), (0, 1 << 22), (0, 5)):
            monkeypatch.setattr(pprof_tables, "BULK_MIN", bulk_min)
            monkeypatch.setattr(pprof_samples, "BULK_MIN", bulk_min)
            monkeypatch.setattr(pprof_bulk, "SAMPLE_CHUNK", chunk)
            answers.append(_decoded(mutated))
        if answers[0] != answers[1] or answers[0] != answers[2]:
            differ.append((mutated, answers))
    assert not differ, differ[:2]
    assert not isinstance(_decoded(data), str)


@pytest.mark.parametrize("name", ["pprof-raw", "pprof-inlined", "pprof-two-byte-ids", "pprof-wide-ids"])
def test_the_in_process_parse_reads_mutated_files_as_the_runtime_does(rich_profile: Profile, name: str) -> None:
    """pprof.decode_in_process (standard library, the JAX recorder's) against pprof.decode (the protobuf runtime)."""

    def answer(data: bytes, standard_library: bool) -> object:
        try:
            p = pprof.decode_in_process(data) if standard_library else pprof.decode(data)
        except ProfileFormatError:
            return "error"
        return p.frames, [(s.stack, s.values, s.labels) for s in p.samples], p.comments, p.sample_types

    data = {**seeds(rich_profile), "pprof-wide-ids": _wide_ids_raw()}[name]
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    rng = random.Random(f"gpuflame-stdlib-{name}")
    differ = [m for m in [data, *mutations(data, rng, 300)] if answer(m, True) != answer(m, False)]
    assert not differ, [m.hex() for m in differ[:3]]
    assert answer(data, True) != "error"


@pytest.mark.parametrize("chunk", [1 << 22, 5])
def test_bulk_reading_takes_the_fast_road_on_plain_tables(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    """The seed above is read by the bulk reader itself, not by its fallback; in one piece or many."""
    from gpuflame.formats import pprof_bulk, pprof_samples, pprof_tables

    monkeypatch.setattr(pprof_tables, "BULK_MIN", 0)
    monkeypatch.setattr(pprof_samples, "BULK_MIN", 0)
    monkeypatch.setattr(pprof_bulk, "SAMPLE_CHUNK", chunk)
    answered = []
    real = pprof_bulk.sample_columns

    def spy(*args):  # type: ignore[no-untyped-def]
        answered.append(real(*args))
        return answered[-1]

    monkeypatch.setattr(pprof_bulk, "sample_columns", spy)
    p = pprof.decode(_wide_ids_raw())
    assert len(answered) == 1 and answered[0] is not None
    assert [p.frames[i].name for i in p.samples[1].stack] == ["step", "step", "Model > forward"]
    assert [p.frames[i].line for i in p.samples[1].stack] == [43, 42, 41]
    assert [s.values for s in p.samples] == [(4096,), (512,), (-7,)]


# -- one hypothesis target per reader ---------------------------------------------------------------
#
# Each target feeds one reader inputs derived from a real seed (bytes edited at drawn places, or JSON
# values of the reader's own shape) and asserts the contract: a result, or ProfileFormatError in one
# line; never another exception. The suite runs FUZZ_EXAMPLES per target, derandomized so a failure
# reproduces; a longer run raises it:
# GPUFLAME_FUZZ_EXAMPLES=2500 pytest tests/unit/formats/test_fuzz_readers.py -k target.
# What such runs found is kept in tests/data/hostile/ (fuzz-*), run by tests/unit/formats/test_hostile_files.py.

import json  # noqa: E402
import zlib  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gpuflame.formats import safe_pickle  # noqa: E402
from gpuflame.model import comments as comment_data  # noqa: E402
from gpuflame.model import history, peak, phases, timeline  # noqa: E402

FUZZ_EXAMPLES = int(os.environ.get("GPUFLAME_FUZZ_EXAMPLES", "40"))
# a long run can flag slow inputs too (GPUFLAME_FUZZ_DEADLINE_MS=2000); the suite never times anything
_DEADLINE_MS = os.environ.get("GPUFLAME_FUZZ_DEADLINE_MS")
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=int(_DEADLINE_MS) if _DEADLINE_MS else None,
    derandomize=FUZZ_EXAMPLES <= 1000,
    suppress_health_check=list(HealthCheck),
    database=None,
)


def _edits() -> st.SearchStrategy[list[tuple[int, int, bytes]]]:
    """Edits (kind, position, bytes): 0 overwrite, 1 insert, 2 delete, 3 truncate."""
    return st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 20), st.binary(max_size=12)), max_size=6)


def apply_edits(data: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    buf = bytearray(data)
    for kind, pos, chunk in edits:
        at = pos % (len(buf) + 1)
        if kind == 0:
            buf[at : at + len(chunk)] = chunk
        elif kind == 1:
            buf[at:at] = chunk
        elif kind == 2:
            del buf[at : at + 1 + len(chunk)]
        else:
            del buf[at:]
    return bytes(buf)


def holds_contract(read, data) -> None:  # type: ignore[no-untyped-def]
    """*read(data)* returns, or raises ProfileFormatError of one line; nothing else."""
    try:
        result = read(data)
    except ProfileFormatError as exc:
        assert str(exc) and "\n" not in str(exc), repr(exc)
        return
    if isinstance(result, Profile):
        check_profile(result)


def _rich() -> Profile:
    from tests.helpers.rich_profile import build_rich_profile

    return build_rich_profile()


def _with_comments() -> Profile:
    """The rich profile with a timeline, a peak, a phase table and a history, so the comment decoders are reached."""
    from gpuflame.model.history import EventLog, of_track

    p = _rich()
    p.timeline = timeline.Timeline()
    p.timeline.add_series((("device", "cuda:0"),), [(1, 10), (2, 30), (5, 0)])
    p.peaks = [peak.PeakUnit("cuda:0")]
    log = EventLog(1, limit=8)
    for t, size in enumerate((64, 128, -64, 256, -128, 32, 8, -8, 16, 4)):
        log.add(10 + t, t % 3, size)
    frames = [Frame(f"f{i}", "a.py", i) for i in range(3)]
    p.history = of_track(log.track(100), lambda s: frames[: s + 1], lambda s: (("device", "cuda:0"),))
    return p


_SEEDS: dict[str, bytes] = {}


def seed(name: str) -> bytes:
    """The unedited input of a target, built once."""
    if name not in _SEEDS:
        p = _with_comments()
        _SEEDS.update(
            {
                "pprof": pprof.encode_raw(p),
                "pprof-gzip": pprof.encode(p),
                "folded": folded.encode(p, p.type_index("inuse_space"), locations=True).encode(),
                "speedscope": speedscope.encode(p, p.type_index("inuse_space")).encode(),
                "pickle": (FIXTURES / "handwritten_small_trace.pickle").read_bytes(),
            }
        )
        _SEEDS["pickle-0"] = pickle.dumps(pickle.loads(_SEEDS["pickle"]), protocol=0)
    return _SEEDS[name]


@FUZZ
@given(_edits())
def test_target_pprof(edits) -> None:  # type: ignore[no-untyped-def]
    holds_contract(pprof.decode, apply_edits(seed("pprof"), edits))


@FUZZ
@given(_edits())
def test_target_pprof_gzip_inner(edits) -> None:  # type: ignore[no-untyped-def]
    inner = apply_edits(gzip.decompress(seed("pprof-gzip")), edits)
    holds_contract(pprof.decode, gzip.compress(inner, 1, mtime=0))


@FUZZ
@given(_edits())
def test_target_folded(edits) -> None:  # type: ignore[no-untyped-def]
    holds_contract(lambda d: folded.decode(d.decode("utf-8", "replace")), apply_edits(seed("folded"), edits))


@FUZZ
@given(_edits())
def test_target_speedscope_bytes(edits) -> None:  # type: ignore[no-untyped-def]
    holds_contract(speedscope.decode, apply_edits(seed("speedscope"), edits))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)


@FUZZ
@given(st.data())
def test_target_speedscope_values(data) -> None:  # type: ignore[no-untyped-def]
    """The document's own shape with any JSON put in at one drawn place."""
    doc = json.loads(seed("speedscope"))
    where = data.draw(st.sampled_from(["frames", "profile", "samples", "weights", "unit", "type", "events"]))
    value = data.draw(JSON)
    prof = doc["profiles"][0]
    if where == "frames":
        doc["shared"]["frames"].append(value)
    elif where == "profile":
        doc["profiles"].append(value)
    elif where == "samples":
        prof["samples"].append(value)
        prof["weights"].append(1)
    elif where == "events":
        doc["profiles"] = [{**prof, "type": "evented", "events": [value, *data.draw(st.lists(JSON, max_size=4))]}]
    else:
        prof[where if where != "weights" else "weights"] = value
    holds_contract(speedscope.decode, json.dumps(doc))


@FUZZ
@given(_edits())
def test_target_safe_pickle(edits) -> None:  # type: ignore[no-untyped-def]
    holds_contract(safe_pickle.loads, apply_edits(seed("pickle"), edits))


@FUZZ
@given(_edits())
def test_target_safe_pickle_protocol_0(edits) -> None:  # type: ignore[no-untyped-def]
    holds_contract(safe_pickle.loads, apply_edits(seed("pickle-0"), edits))


@FUZZ
@given(_edits())
def test_target_torch_snapshot(edits) -> None:  # type: ignore[no-untyped-def]
    from gpuflame.formats import torch_snapshot

    holds_contract(torch_snapshot.decode, apply_edits(seed("pickle"), edits))


@FUZZ
@given(st.data())
def test_target_torch_snapshot_values(data) -> None:  # type: ignore[no-untyped-def]
    """A real snapshot's structure with any plain value put at a drawn key of a drawn dict (torch_frames too)."""
    from gpuflame.formats import torch_snapshot

    snap = pickle.loads(seed("pickle"))
    dicts: list[dict] = []
    stack: list[object] = [snap]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            dicts.append(item)
            stack += list(item.values())
        elif isinstance(item, list):
            stack += item
    target = data.draw(st.sampled_from(dicts))
    key = data.draw(st.sampled_from(sorted(target)) if target else st.just("x"))
    target[key] = data.draw(JSON)
    holds_contract(lambda s: torch_snapshot.from_snapshot(s), snap)


@FUZZ
@given(st.data())
def test_target_comment_decoders(data) -> None:  # type: ignore[no-untyped-def]
    """Each data comment's decoder on JSON of its own shape with one drawn value, packed as gpuflame packs it."""
    p = _with_comments()
    kind = data.draw(st.sampled_from(["timeline", "history", "peak", "phases"]))
    if kind == "timeline":
        payload, prefix, read = (
            {"series": [{"labels": [["d", "x"]], "t": [1, 2], "b": [3, 4]}]},
            timeline.PREFIX,
            timeline.Timeline.from_comment,
        )
    elif kind == "history":
        comment = p.history.to_comment()  # type: ignore[union-attr]
        packed = base64.b64decode(comment[len(history.PREFIX) :])
        payload, prefix, read = json.loads(zlib.decompress(packed)), history.PREFIX, history.History.from_comment
    elif kind == "peak":
        comment = peak.to_comment(p.peaks)
        payload, prefix, read = json.loads(comment[len(peak.PREFIX) :]), peak.PREFIX, peak.from_comment
    else:
        payload, prefix, read = [["p", 1, 2, 3]], phases.PREFIX, phases.from_comment
    _poke(payload, data)
    text = json.dumps(payload)
    comment = comment_data.pack_json(prefix, payload) if kind in ("timeline", "history") else prefix + text
    try:
        read(comment)
    except (ValueError, ProfileFormatError) as exc:
        assert "\n" not in str(exc)


def _poke(payload: object, data) -> None:  # type: ignore[no-untyped-def]
    """Replace one drawn value inside *payload* by drawn JSON."""
    node = payload
    for _ in range(data.draw(st.integers(0, 4))):
        children = (
            list(node.items()) if isinstance(node, dict) else list(enumerate(node)) if isinstance(node, list) else []
        )
        if not children:
            break
        key, child = data.draw(st.sampled_from(children))
        if not isinstance(child, (dict, list)) or data.draw(st.booleans()):
            node[key] = data.draw(JSON)  # type: ignore[index]
            return
        node = child


@FUZZ
@given(st.binary(max_size=64), st.sampled_from(["pprof", "pprof-gzip", "folded", "speedscope", "pickle", "pickle-0"]))
def test_target_front_door(prefix: bytes, name: str) -> None:
    """load_save.loads: the sniffing with any bytes in front of any seed."""
    data = prefix + seed(name)
    try:
        detect(data)
    except ProfileFormatError:
        return
    holds_contract(lambda d: loads(d, source="fuzz"), data)


def test_bulk_frame_kinds_are_the_message_by_message_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    """pprof_tables' kinds asked per file: a trampoline in a Python file, native code, a fileless frame in a mapping."""
    from gpuflame.formats import pprof_samples, pprof_tables
    from gpuflame.model.profile import SampleType
    from gpuflame.symbols.names import TRAMPOLINE_NAME

    profile = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    frames = [
        Frame("step", "/src/train.py", 3),
        Frame(TRAMPOLINE_NAME, "/usr/lib/python3.11/runpy.py", 0),
        Frame("cudaMalloc", "/usr/lib/libcudart.so", 0, "native"),
        Frame("0x7f00", "", 0, "native"),
    ]
    for i in range(len(frames)):
        profile.add(frames[i:], [100 + i])
    data = pprof.encode(profile)
    kinds = []
    for bulk_min in (0, 1 << 62):
        monkeypatch.setattr(pprof_tables, "BULK_MIN", bulk_min)
        monkeypatch.setattr(pprof_samples, "BULK_MIN", bulk_min)
        kinds.append({(f.name, f.file): f.kind for f in pprof.decode(data).frames})
    assert kinds[0] == kinds[1]
    assert kinds[0][(TRAMPOLINE_NAME, "/usr/lib/python3.11/runpy.py")] != "python"
