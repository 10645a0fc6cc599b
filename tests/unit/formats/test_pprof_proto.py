"""formats/pprof_proto: the checked-in generated classes are what the pinned generator makes of the .proto files.

And gpuflame's reading view (split_profile.proto) stays pprof's wire format:
every field it names has pprof's number and wire type.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuflame.formats.pprof_proto import generate, profile_pb2, split_profile_pb2


def test_the_generated_files_are_what_the_pinned_generator_writes(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    generate.generate(tmp_path)
    made = sorted((tmp_path / "gpuflame" / "formats" / "pprof_proto").iterdir())
    assert [p.name for p in made] == [
        "profile_pb2.py",
        "profile_pb2.pyi",
        "split_profile_pb2.py",
        "split_profile_pb2.pyi",
    ]
    for path in made:
        assert path.read_bytes() == (generate.HERE / path.name).read_bytes(), f"{path.name}: run make proto"


def test_each_generated_module_names_its_generator_version_and_source() -> None:
    for module, proto in ((profile_pb2, "profile.proto"), (split_profile_pb2, "split_profile.proto")):
        head = Path(module.__file__).read_text(encoding="utf-8").splitlines()[:6]
        assert f"# source: gpuflame/formats/pprof_proto/{proto}" in head
        assert any(re.fullmatch(r"# Protobuf Python Version: \d+\.\d+\.\d+", line) for line in head)


# fields of the view that pprof does not define: gpuflame's data, which readers of pprof skip
GPUFLAME_FIELDS = {"gpuflame_data"}


def _wire(field) -> int:  # type: ignore[no-untyped-def]
    """The wire type a field's values take (packed repeated scalars and strings/messages: 2)."""
    if field.type in (field.TYPE_MESSAGE, field.TYPE_STRING, field.TYPE_BYTES):
        return 2
    return 2 if field.is_repeated and field.is_packed else 0


@pytest.mark.parametrize(
    ("view", "pprof"),
    [
        (split_profile_pb2.SplitProfile, profile_pb2.Profile),
        (split_profile_pb2.Sample, profile_pb2.Sample),
        (split_profile_pb2.Label, profile_pb2.Label),
    ],
)
def test_the_reading_view_keeps_pprofs_numbers_and_wire_types(view, pprof) -> None:  # type: ignore[no-untyped-def]
    theirs = {f.number: f for f in pprof.DESCRIPTOR.fields}
    for field in view.DESCRIPTOR.fields:
        if field.name in GPUFLAME_FIELDS:  # gpuflame's own: past every number pprof uses, which skips it
            assert field.number >= 1000 and field.number > max(theirs), field.name
            continue
        other = theirs[field.number]
        assert field.name == other.name, field.name
        assert (_wire(field), field.is_repeated) == (_wire(other), other.is_repeated), field.name
        if field.type == field.TYPE_MESSAGE and field.message_type.full_name.startswith("perftools."):
            assert field.message_type is other.message_type, field.name


def test_the_view_reads_a_sample_as_pprofs_own_message_bytes() -> None:
    sample = profile_pb2.Sample(location_id=[3, 300], value=[-7], label=[profile_pb2.Label(key=1, num=0, num_unit=2)])
    message = profile_pb2.Profile(sample=[sample], string_table=["", "k", "u"])
    split = split_profile_pb2.SplitProfile.FromString(message.SerializeToString())
    assert [profile_pb2.Sample.FromString(b) for b in split.sample] == [sample]
    assert list(split.string_table) == [b"", b"k", b"u"]
    label = split_profile_pb2.Sample.FromString(split.sample[0]).label[0]
    assert label.HasField("num_unit") and not label.HasField("num")  # proto3 writes no 0
