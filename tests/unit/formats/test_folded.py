"""Folded stacks: flamegraph.pl's input format, written and read."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuflame.errors import ProfileFormatError
from gpuflame.formats import folded, loads
from gpuflame.model import Frame, Profile, SampleType
from gpuflame.symbols.kinds import guess_kind
from tests.helpers.paths import DATA

# flamegraph.pl reads each line with this pattern (stack, then whitespace, then
# the count); the tests use it as an independent reader.
FLAMEGRAPH_PL_LINE = re.compile(r"^(.*)\s+?(\d+(?:\.\d*)?)$")


def tiny_reader(text: str) -> Counter:
    """Split on the last space, then on ';' — the least any folded reader does."""
    out: Counter = Counter()
    for line in text.splitlines():
        if line.startswith("# "):  # gpuflame's header: no count, so flamegraph.pl skips it too
            continue
        stack, _, count = line.rpartition(" ")
        out[tuple(stack.split(";")) if stack else ()] += int(count)
    return out


def expected_sums(p: Profile, index: int, label=lambda f: f.name) -> Counter:
    """Per root-first stack of names, the summed value, computed from the model directly."""
    out: Counter = Counter()
    for s in p.samples:
        out[tuple(label(p.frames[i]) for i in reversed(s.stack))] += s.values[index]
    return Counter({k: v for k, v in out.items() if v})


def test_encode_sums_stacks_root_first(rich_profile: Profile) -> None:
    index = rich_profile.type_index("peak_space")
    text = folded.encode(rich_profile, index)
    assert tiny_reader(text) == expected_sums(rich_profile, index)
    lines = text.splitlines()
    assert lines == sorted(lines)
    assert text.endswith("\n")
    assert "<module>;<interpreter trampoline>;LlamaMLP > forward;cudaMalloc;0x7f15deadbeef 1073741824" in lines


def test_zero_sums_are_left_out_and_equal_stacks_merged() -> None:
    p = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    a, b = Frame("a"), Frame("b")
    p.add([b, a], [5], {"device": "cuda:0"})
    p.add([b, a], [7], {"device": "cuda:1"})
    p.add([a], [3])
    p.add([a], [-3])
    p.add([b], [0])
    assert folded.encode(p, 0) == "# gpuflame folded stacks: inuse_space (bytes)\na;b 12\n"


def test_positive_lines_match_flamegraph_pl_pattern(rich_profile: Profile) -> None:
    index = rich_profile.type_index("inuse_space")
    text = folded.encode(rich_profile, index)
    total = 0
    header, *lines = text.splitlines()
    assert FLAMEGRAPH_PL_LINE.match(header) is None  # a line flamegraph.pl skips, as it skips any without a count
    for line in lines:
        m = FLAMEGRAPH_PL_LINE.match(line)
        assert m, line
        total += int(m.group(2))
    assert total == sum(expected_sums(rich_profile, index).values())


def test_negative_values_of_a_diff_are_written_and_read_back(rich_profile: Profile) -> None:
    index = rich_profile.type_index("peak_space")
    text = folded.encode(rich_profile, index)
    negative = [line for line in text.splitlines() if line.endswith(str(-(5 << 32)))]
    assert negative == ["<module>;LlamaMLP > forward -21474836480"]
    back = folded.decode(text, allow_negative=True)
    assert back.totals() == {"peak_space": sum(expected_sums(rich_profile, index).values())}  # the header's type
    number = text.splitlines().index(negative[0]) + 1
    with pytest.raises(ProfileFormatError, match=rf"line {number}: the count -21474836480 is negative"):
        folded.decode(text)  # by default: a negative size is damage


def test_separators_in_names_are_replaced() -> None:
    p = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    p.add([Frame("leaf;with;semis"), Frame("two\nlines\r"), Frame("")], [9])
    text = folded.encode(p, 0, header=False)
    assert text == "<unknown>;two lines ;leaf,with,semis 9\n"
    assert tiny_reader(text) == Counter({("<unknown>", "two lines ", "leaf,with,semis"): 9})


def test_locations_are_written_py_spy_style_and_read_back() -> None:
    p = Profile(sample_types=[SampleType("alloc_space", "bytes")])
    stack = [
        Frame("LlamaMLP > forward", "/m/modeling_llama.py", 123),
        Frame("<module>", "train.py", 0),
        Frame("native"),
    ]
    p.add(stack, [4096])
    text = folded.encode(p, 0, locations=True, header=False)
    assert text == "native;<module> (train.py:0);LlamaMLP > forward (/m/modeling_llama.py:123) 4096\n"
    back = folded.decode(text, sample_type="alloc_space/bytes")
    assert back.sample_types == [SampleType("alloc_space", "bytes")]
    assert back.stack_frames(back.samples[0]) == [
        Frame("LlamaMLP > forward", "/m/modeling_llama.py", 123, "python"),
        Frame("<module>", "train.py", 0, "python"),
        Frame("native", "", 0, guess_kind("native")),
    ]


def test_decode_reads_py_spy_output() -> None:
    text = (
        "<module> (train.py:10);step (train.py:42);forward (torch/nn/modules/module.py:1511) 7\n"
        "\n"
        "<module> (train.py:10);0x7f1500001234 3   \r\n"
        "   \n"
    )
    p = folded.decode(text)
    assert p.sample_types == [SampleType("samples", "count")]  # py-spy counts samples: no bytes are claimed
    assert [s.values for s in p.samples] == [(7,), (3,)]
    first = p.stack_frames(p.samples[0])
    assert [(f.name, f.file, f.line) for f in first] == [
        ("forward", "torch/nn/modules/module.py", 1511),
        ("step", "train.py", 42),
        ("<module>", "train.py", 10),
    ]
    second = p.stack_frames(p.samples[1])
    assert [(f.name, f.kind) for f in second] == [("0x7f1500001234", "native"), ("<module>", "python")]
    assert len(p.frames) == 4, "equal frame texts share one frame"


def test_a_line_with_only_a_count_is_an_empty_stack() -> None:
    p = folded.decode(" 12\na 3\n")
    assert [(s.stack, s.values) for s in p.samples] == [((), (12,)), ((0,), (3,))]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a;b 1\nc;d\n", r"line 2: missing count"),
        ("a;b 1\n\nc;d 1.5\n", r"line 3: the count '1.5' is not a whole number"),
        ("a;b x12\n", r"line 1: the count 'x12' is not a whole number"),
        ("a;b 12x\n", r"line 1: the count '12x' is not a whole number"),
        ("a;b 1_000\n", r"line 1: the count '1_000' is not a whole number"),
        ("a;b ١٢\n", r"line 1: the count '١٢' is not a whole number"),
        ("a 99999999999999999999\n", r"line 1: the count 99999999999999999999 is too large"),
        ("a " + "9" * 5000 + "\n", r"line 1: the count 9{37}\.\.\. is too large$"),
        ("12\n", r"line 1: missing count"),
    ],
)
def test_bad_counts_name_the_line(text: str, message: str) -> None:
    with pytest.raises(ProfileFormatError, match=message):
        folded.decode(text)


def test_loads_names_the_source_and_line() -> None:
    with pytest.raises(ProfileFormatError, match=r"^stacks\.txt: folded stacks, line 1: missing count"):
        loads(b"main;work\n", source="stacks.txt")


def test_large_values_keep_exact_integers() -> None:
    big = (1 << 62) + 12345
    assert folded.decode(f"a;b {big}\n").samples[0].values == (big,)


# -- round trip -----------------------------------------------------------------

safe_names = st.text(min_size=1, max_size=10).filter(lambda n: not re.search(r"[;\r\n]", n))
plain_names = safe_names.filter(lambda n: folded._PYSPY.fullmatch(n) is None)
files = st.text(min_size=1, max_size=10).filter(lambda f: not re.search(r"[;\r\n()]", f))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.lists(plain_names, max_size=6), st.integers(-(1 << 59), 1 << 59)),
        max_size=10,
    )
)
def test_round_trip_of_names_and_values(rows: list[tuple[list[str], int]]) -> None:
    p = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    for names, value in rows:
        p.add([Frame(n, "", 0, guess_kind(n)) for n in names], [value])
    text = folded.encode(p, 0)
    back = folded.decode(text, allow_negative=True)  # the values may be a diff's
    assert expected_sums(back, 0) == expected_sums(p, 0)
    assert all(f.kind == guess_kind(f.name, f.file) for f in back.frames)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(safe_names, files, st.integers(0, 10**6)), min_size=1, max_size=6),
    st.integers(1, 10**12),
)
def test_round_trip_with_locations(frames: list[tuple[str, str, int]], value: int) -> None:
    p = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    p.add([Frame(n, f, line, guess_kind(n, f)) for n, f, line in frames], [value])
    back = folded.decode(folded.encode(p, 0, locations=True))
    assert back.stack_frames(back.samples[0]) == p.stack_frames(p.samples[0])
    assert back.samples[0].values == (value,)


def test_reads_real_py_spy_output() -> None:
    """tests/data/py-spy-0.4.3-raw.txt: ``py-spy record --format raw -r 200`` of a small script.

    The script's ``main`` calls ``Model.forward``, which loops in
    ``Model.layer`` for 1.5 s; py-spy reported "Samples: 281". Its first
    line, `` 1``, is a sample with an empty stack.
    """
    text = (DATA / "py-spy-0.4.3-raw.txt").read_text()
    p = folded.decode(text, sample_type="cpu/count")
    assert p.sample_types == [SampleType("cpu", "count")]
    assert p.totals() == {"cpu": 281}
    assert p.samples[0].stack == ()
    deepest = p.stack_frames(p.samples[1])
    assert [(f.name, f.file, f.kind) for f in deepest] == [
        ("Model.layer", "spyme.py", "python"),
        ("Model.forward", "spyme.py", "python"),
        ("main", "spyme.py", "python"),
        ("<module>", "spyme.py", "python"),
    ]
    assert {f.line for f in p.frames if f.name == "Model.layer"} == {7, 8}


def test_cpp_names_without_a_file_are_native() -> None:
    """The op and graph-node frames a snapshot gets (aten::mm) stay native through folded stacks."""
    assert guess_kind("aten::mm") == "native"
    assert guess_kind("torch::autograd::Engine::thread_main") == "native"
    assert guess_kind("LlamaMLP > forward") == "python"


@pytest.mark.subprocess
def test_gpuflames_own_folded_file_keeps_its_sample_type_and_anothers_reads_as_counts(tmp_path) -> None:
    """perf's CPU folded stacks must not read as memory; a file gpuflame wrote names its type and unit."""
    p = Profile(sample_types=[SampleType("peak_space", "bytes"), SampleType("alloc_space", "bytes")])
    p.add([Frame("LlamaMLP > forward"), Frame("<module>")], [4096, 8192])
    text = folded.encode(p, 1)
    assert text.splitlines()[0] == "# gpuflame folded stacks: alloc_space (bytes)"
    assert folded.decode(text).sample_types == [SampleType("alloc_space", "bytes")]
    (tmp_path / "perf.folded").write_text("main;compute;memcpy 120\nmain;idle 30\n")
    out = subprocess.run(
        [sys.executable, "-m", "gpuflame", "report", str(tmp_path / "perf.folded"), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert (doc["sample_type"], doc["unit"], doc["total"]) == ("samples", "count", 150)
    assert "peak" not in doc and "live at" not in out.stdout


@pytest.mark.subprocess
def test_a_real_perf_folded_file_reads_as_samples_not_memory() -> None:
    """perf's CPU folded stacks (tests/data/README.md): their numbers are sample weights."""
    path = DATA / "perf-folded-mojo-out.folded"
    lines = path.read_text().splitlines()
    total = sum(int(line.rsplit(" ", 1)[1]) for line in lines)
    out = subprocess.run(
        [sys.executable, "-m", "gpuflame", "report", str(path), "--json"], capture_output=True, text=True, check=True
    )
    doc = json.loads(out.stdout)
    assert (doc["sample_type"], doc["unit"], doc["total"]) == ("samples", "count", total)
    text = subprocess.run(
        [sys.executable, "-m", "gpuflame", "report", str(path)], capture_output=True, text=True, check=True
    ).stdout
    assert text.splitlines()[1].split()[:2] == ["samples", f"{total:,}"]
    assert " B " not in text.splitlines()[1] and "live at" not in text
