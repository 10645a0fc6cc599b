"""speedscope JSON, validated against speedscope's own file-format schema.

tests/data/speedscope-file-format-schema.json is shipped in the npm package
``speedscope`` (see tests/data/speedscope-LICENSE.txt). jsonschema is not a
dependency, so a validator for the keywords that schema uses ($ref, type,
properties, required, items, enum, const, anyOf) is written out below; a
keyword it does not know fails the test rather than passing silently.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from gpuflame.errors import GpuflameError
from gpuflame.formats import dumps, speedscope
from gpuflame.model import Frame, Profile, SampleType
from tests.helpers.paths import DATA

SCHEMA = json.loads((DATA / "speedscope-file-format-schema.json").read_text())
KNOWN = {
    "$schema",
    "$ref",
    "definitions",
    "title",
    "type",
    "properties",
    "required",
    "items",
    "enum",
    "const",
    "anyOf",
}
TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "number": (int, float),
}


def schema_errors(value: object, schema: dict, path: str = "$") -> list[str]:
    """Every way *value* breaks *schema* (the subset of draft-07 the speedscope schema uses)."""
    unknown = set(schema) - KNOWN
    assert not unknown, f"validator does not know {unknown}"
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/definitions/")
        return schema_errors(value, SCHEMA["definitions"][name], path)
    if "anyOf" in schema:
        options = [schema_errors(value, option, path) for option in schema["anyOf"]]
        return [] if any(not o for o in options) else [f"{path}: matches no anyOf option: {options}"]
    errors: list[str] = []
    kind = schema.get("type")
    if kind is not None:
        ok = isinstance(value, TYPES[kind]) and not isinstance(value, bool)
        if not ok:
            return [f"{path}: expected {kind}, got {type(value).__name__}"]
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: expected {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}: missing {key}")
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                errors += schema_errors(value[key], sub, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{path}[{i}]")
    return errors


def test_the_validator_catches_broken_documents() -> None:
    good = {"$schema": speedscope.SCHEMA, "shared": {"frames": [{"name": "a"}]}, "profiles": []}
    assert schema_errors(good, SCHEMA) == []
    bad_unit = {
        **good,
        "profiles": [
            {
                "type": "sampled",
                "name": "x",
                "unit": "kilobytes",
                "startValue": 0,
                "endValue": 1,
                "samples": [[0]],
                "weights": [1],
            }
        ],
    }
    assert schema_errors(bad_unit, SCHEMA)
    assert schema_errors({**good, "shared": {"frames": [{"file": "x"}]}}, SCHEMA)
    assert schema_errors({**good, "$schema": "other"}, SCHEMA)


def _check_structure(doc: dict) -> None:
    """What speedscope's importer relies on beyond the schema: indices in range, one weight per sample."""
    n_frames = len(doc["shared"]["frames"])
    for prof in doc["profiles"]:
        assert len(prof["samples"]) == len(prof["weights"])
        assert all(0 <= i < n_frames for stack in prof["samples"] for i in stack)
        assert prof["endValue"] - prof["startValue"] == sum(prof["weights"])
        assert all(w > 0 for w in prof["weights"])
    assert 0 <= doc.get("activeProfileIndex", 0) < max(1, len(doc["profiles"]))


def _sums(doc: dict, prof: dict) -> Counter:
    frames = doc["shared"]["frames"]
    out: Counter = Counter()
    for stack, weight in zip(prof["samples"], prof["weights"], strict=True):
        out[tuple((frames[i]["name"], frames[i].get("file", ""), frames[i].get("line", 0)) for i in stack)] += weight
    return out


def _expected(p: Profile, index: int, pid: str | None) -> Counter:
    out: Counter = Counter()
    for s in p.samples:
        if s.label("pid") == pid:
            out[tuple((f.name, f.file, f.line) for f in reversed(p.stack_frames(s)))] += s.values[index]
    return Counter({k: v for k, v in out.items() if v})


def test_output_validates_and_splits_by_pid(rich_profile: Profile) -> None:
    index = rich_profile.type_index("inuse_space")
    doc = json.loads(speedscope.encode(rich_profile, index))
    assert schema_errors(doc, SCHEMA) == []
    _check_structure(doc)
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    assert [p["name"] for p in doc["profiles"]] == ["pid 7", "pid 4242", "no pid"]
    assert {p["unit"] for p in doc["profiles"]} == {"bytes"}
    assert {p["type"] for p in doc["profiles"]} == {"sampled"}
    for prof, pid in zip(doc["profiles"], ["7", "4242", None], strict=True):
        assert _sums(doc, prof) == _expected(rich_profile, index, pid)
    names = [f["name"] for f in doc["shared"]["frames"]]
    assert len(names) == len(set(names)), "frames are shared, each once"
    assert "peak" not in json.dumps(doc["profiles"]), "only the chosen type is written"


def test_frames_carry_file_and_line_when_known(rich_profile: Profile) -> None:
    doc = json.loads(speedscope.encode(rich_profile, rich_profile.type_index("inuse_space")))
    by_name = {f["name"]: f for f in doc["shared"]["frames"]}
    assert by_name["LlamaMLP > forward"] == {
        "name": "LlamaMLP > forward",
        "file": "/app/modeling_llama.py",
        "line": 123,
    }
    assert by_name["<cached free blocks>"] == {"name": "<cached free blocks>"}


def test_single_profile_without_pid_and_unit_none_for_counts() -> None:
    p = Profile(sample_types=[SampleType("alloc_space", "bytes"), SampleType("alloc_objects", "count")])
    a, b = Frame("main", "/x.py", 3, start_line=3), Frame("work", "/x.py", 9, start_line=9)
    p.add([b, a], [100, 1])
    p.add([b, a], [50, 2])
    p.add([a], [0, 0])
    doc = json.loads(speedscope.encode(p, 1))
    assert schema_errors(doc, SCHEMA) == []
    _check_structure(doc)
    [prof] = doc["profiles"]
    assert (prof["name"], prof["unit"]) == ("alloc_objects/count", "none")
    assert _sums(doc, prof) == Counter({(("main", "/x.py", 3), ("work", "/x.py", 9)): 3})
    assert json.loads(speedscope.encode(p, 0))["profiles"][0]["unit"] == "bytes"


def test_empty_profile_is_still_valid() -> None:
    doc = json.loads(speedscope.encode(Profile(sample_types=[SampleType("inuse_space", "bytes")]), 0))
    assert schema_errors(doc, SCHEMA) == []
    _check_structure(doc)


def test_negative_values_are_refused_with_a_plain_message(rich_profile: Profile) -> None:
    with pytest.raises(GpuflameError, match="negative values"):
        speedscope.encode(rich_profile, rich_profile.type_index("peak_space"))


def test_unicode_names_survive(rich_profile: Profile) -> None:
    p = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    p.add([Frame("Überschicht > vorwärts ✓", "/ü.py", 1)], [1])
    doc = json.loads(dumps(p, "speedscope").decode("utf-8"))
    assert doc["shared"]["frames"][0]["name"] == "Überschicht > vorwärts ✓"


@pytest.mark.parametrize(("unit", "expected"), [("bytes", "bytes"), ("nanoseconds", "nanoseconds"), ("count", "none")])
def test_units(unit: str, expected: str) -> None:
    assert speedscope.unit_of(unit) == expected
    assert expected in SCHEMA["definitions"]["FileFormat.ValueUnit"]["enum"]


# -- reading ---------------------------------------------------------------------------------------

# Written by hand in the shapes speedscope's file-format schema gives, the way other tools
# export: times in milliseconds with fractions, an evented profile of nested calls.
EVENTED = {
    "$schema": speedscope.SCHEMA,
    "shared": {
        "frames": [
            {"name": "main", "file": "app.py", "line": 1},
            {"name": "load", "file": "app.py", "line": 9},
            {"name": "parse", "col": 4},
        ]
    },
    "profiles": [
        {
            "type": "evented",
            "name": "thread 1",
            "unit": "milliseconds",
            "startValue": 0,
            "endValue": 10.5,
            "events": [
                {"type": "O", "frame": 0, "at": 0},
                {"type": "O", "frame": 1, "at": 1.25},
                {"type": "O", "frame": 2, "at": 2},
                {"type": "C", "frame": 2, "at": 5},
                {"type": "C", "frame": 1, "at": 6},
                {"type": "C", "frame": 0, "at": 10.5},
            ],
        }
    ],
    "name": "app",
    "activeProfileIndex": 0,
    "exporter": "hand",
}
SAMPLED = {
    "$schema": speedscope.SCHEMA,
    "shared": {"frames": [{"name": "a"}, {"name": "b"}]},
    "profiles": [
        {
            "type": "sampled",
            "name": "cpu",
            "unit": "none",
            "startValue": 0,
            "endValue": 3,
            "samples": [[0, 1], [0], [0, 1]],
            "weights": [1, 1, 1],
        }
    ],
}


def stacks_of(p: Profile, type_index: int = 0) -> dict[tuple[str, ...], int]:
    out: Counter[tuple[str, ...]] = Counter()
    for s in p.samples:
        out[tuple(p.frames[i].name for i in reversed(s.stack))] += s.values[type_index]
    return dict(out)


def test_gpuflame_speedscope_reads_back_as_the_profile_it_was(rich_profile: Profile) -> None:
    from gpuflame.formats import folded, loads

    index = rich_profile.type_index("inuse_space")
    back = loads(dumps(rich_profile, "speedscope", "inuse_space"))
    assert back.sample_types == [rich_profile.sample_types[index]]
    assert folded.encode(back, 0) == folded.encode(rich_profile, index)
    pids = {s.label("pid") for s in rich_profile.samples if s.values[index]}
    assert {s.label("pid") for s in back.samples} == pids


def test_evented_profiles_sum_the_time_each_stack_was_open() -> None:
    p = speedscope.decode(json.dumps(EVENTED))
    assert p.sample_types == [SampleType("cpu", "nanoseconds")]
    assert stacks_of(p) == {("main",): 5_750_000, ("main", "load"): 1_750_000, ("main", "load", "parse"): 3_000_000}
    assert p.frames[0].file == "app.py" and p.frames[0].line == p.frames[0].start_line == 1
    assert not any("definition lines unknown" in c for c in p.comments)


def test_sampled_profiles_sum_equal_stacks() -> None:
    assert schema_errors(SAMPLED, SCHEMA) == [] and schema_errors(EVENTED, SCHEMA) == []
    p = speedscope.decode(json.dumps(SAMPLED).encode())
    assert p.sample_types == [SampleType("samples", "count")]
    assert stacks_of(p) == {("a", "b"): 2, ("a",): 1}


def test_report_reads_a_speedscope_file(tmp_path: Path, rich_profile: Profile) -> None:
    from gpuflame.cli.main import main

    path = tmp_path / "x.speedscope.json"
    path.write_bytes(dumps(rich_profile, "speedscope", "inuse_space"))
    assert main(["report", str(path)]) == 0


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"tree": {}}, "not a speedscope profile"),
        (
            {**SAMPLED, "profiles": [{**SAMPLED["profiles"][0], "samples": [[0, 7]], "weights": [1]}]},
            "not in shared.frames",
        ),
        ({**SAMPLED, "profiles": [{**SAMPLED["profiles"][0], "weights": [1]}]}, "3 samples but 1 weights"),
        ({**SAMPLED, "profiles": [{**SAMPLED["profiles"][0], "unit": "parsecs"}]}, "unknown unit"),
        (
            {**EVENTED, "profiles": [{**EVENTED["profiles"][0], "events": EVENTED["profiles"][0]["events"][:2]}]},
            "still open",
        ),
        ({**SAMPLED, "profiles": [{**SAMPLED["profiles"][0], "weights": [1, 1e300, 1]}]}, "does not fit"),
        # JSON integers have any size: past a float, math.isfinite raised OverflowError (exit 3)
        ({**SAMPLED, "profiles": [{**SAMPLED["profiles"][0], "weights": [1, 10**400, 1]}]}, r"about 2\*\*1329"),
        ({**SAMPLED, "shared": {"frames": [{"name": "a", "line": 10**400}, {"name": "b"}]}}, "line .* does not fit"),
        ({**SAMPLED, "profiles": [{**SAMPLED["profiles"][0], "weights": [1, -(10**30), 1]}]}, r"\(-1e\+30\) does"),
    ],
)
def test_bad_documents_are_one_plain_line(doc: dict[str, object], message: str) -> None:
    from gpuflame.errors import ProfileFormatError

    with pytest.raises(ProfileFormatError, match=message) as caught:
        speedscope.decode(json.dumps(doc))
    assert "\n" not in str(caught.value)


def test_deeply_nested_json_is_one_plain_line() -> None:
    from gpuflame.errors import ProfileFormatError
    from gpuflame.formats import loads

    with pytest.raises(ProfileFormatError, match="nests too deeply"):
        loads(b'{"shared": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")


def test_evented_stacks_are_bounded_by_the_frames_limit(monkeypatch) -> None:
    """Events deep inside a deep stack: each would be a stack as long as the depth (quadratic in the file).
    Time per event no longer depends on the depth; the stacks made are counted against GPUFLAME_MAX_FRAMES."""
    from gpuflame.errors import ProfileFormatError

    depth, leaves = 200, 100
    frames = [{"name": f"f{i}"} for i in range(depth + leaves)]
    events = [{"type": "O", "frame": i, "at": i} for i in range(depth)]
    for k in range(leaves):
        events += [
            {"type": "O", "frame": depth + k, "at": depth + 2 * k},
            {"type": "C", "frame": depth + k, "at": depth + 2 * k + 1},
        ]
    events += [{"type": "C", "frame": i, "at": depth + 2 * leaves} for i in reversed(range(depth))]
    doc = {
        **EVENTED,
        "shared": {"frames": frames},
        "profiles": [{**EVENTED["profiles"][0], "unit": "none", "events": events}],
    }
    p = speedscope.decode(json.dumps(doc))
    assert sum(len(s.stack) for s in p.samples) > 20_000 and max(len(s.stack) for s in p.samples) == depth + 1
    monkeypatch.setenv("GPUFLAME_MAX_FRAMES", "20000")
    with pytest.raises(ProfileFormatError, match="GPUFLAME_MAX_FRAMES"):
        speedscope.decode(json.dumps(doc))
