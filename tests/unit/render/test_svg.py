"""The static SVG flame graph: geometry against the samples, escaping, size, and the CLI.

The picture is parsed with the standard library's XML parser and read back
as geometry only: each bar's place in the tree is found from where it is
drawn (its caller is the bar one row further from the roots that spans it),
and its width is checked against sums taken directly over the samples.
"""

from __future__ import annotations

import colorsys
import json
import os
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflame.formats import save
from gpuflame.model import Frame, Profile, SampleType
from gpuflame.model.profile import NATIVE, SYNTHETIC, TRAMPOLINE_KIND
from gpuflame.render.svg import CHAR_WIDTH, FRAME_HEIGHT, SIDE_PAD, TEXT_PAD, encode
from gpuflame.render.writers import dumps
from gpuflame.units import format_bytes
from tests.helpers.cli import run
from tests.helpers.guide import GUIDE_KV_CHAIN, guide_profile

SVG_NS = "{http://www.w3.org/2000/svg}"
ALLOWED = {"svg", "g", "rect", "text", "title", "style"}
WIDTH = 1200
USABLE = WIDTH - 2 * SIDE_PAD

FRAMES = [
    Frame("<module>", "/app/train.py", 1),
    Frame("main", "/app/train.py", 5),
    Frame("Model > __init__", "/app/model.py", 10),
    Frame("LlamaMLP > forward", "/app/llama.py", 99),
    Frame("0x7f151", kind=NATIVE),
    Frame("<interpreter trampoline>", kind=TRAMPOLINE_KIND),
]

HOSTILE = [
    "<img src=x onerror=alert(1)>",
    "]]>&\"'",
    "<script>alert(1)</script>",
    "&amp; &lt; &#60;",
    "</title></g><svg onload=alert(1)>",
    "<!-- x --><?pi x?>",
]


# -- reading the picture back ----------------------------------------------------


def local(tag: str) -> str:
    return tag.removeprefix(SVG_NS)


def parse(text: str) -> ET.Element:
    return ET.fromstring(text.encode("utf-8"))


def bars(root: ET.Element) -> list[dict]:
    """Every frame bar: the ``<g>`` with a tooltip, a rect and maybe a name."""
    out = []
    for g in root.iter(f"{SVG_NS}g"):
        title, rect = g.find(f"{SVG_NS}title"), g.find(f"{SVG_NS}rect")
        text = g.find(f"{SVG_NS}text")
        out.append(
            {
                "tooltip": title.text,
                "name": title.text.split("\n")[0],
                "x": float(rect.get("x")),
                "y": float(rect.get("y")),
                "w": float(rect.get("width")),
                "text": None if text is None else (text.text or ""),
                "rect": rect,
            }
        )
    return out


def paths_from_geometry(drawn: list[dict], icicle: bool = False) -> dict[tuple[str, ...], dict]:
    """Each bar's stack (root first), found from where it is drawn alone.

    Depth is the row counted from the roots' row (the bottom one, or the top
    one for an icicle); a bar's caller is the bar one row nearer the roots
    that spans the bar's centre.
    """
    ys = sorted({b["y"] for b in drawn}, reverse=not icicle)
    for b in drawn:
        b["depth"] = ys.index(b["y"])
        assert abs(abs(b["y"] - ys[0]) - b["depth"] * FRAME_HEIGHT) < 1e-6, "rows are evenly spaced"
    by_depth = defaultdict(list)
    for b in drawn:
        by_depth[b["depth"]].append(b)
    out: dict[tuple[str, ...], dict] = {}
    for depth in sorted(by_depth):
        for b in by_depth[depth]:
            if depth == 0:
                b["path"] = (b["name"],)
            else:
                centre = b["x"] + b["w"] / 2
                (parent,) = [p for p in by_depth[depth - 1] if p["x"] <= centre <= p["x"] + p["w"]]
                assert parent["x"] - 0.011 <= b["x"] and b["x"] + b["w"] <= parent["x"] + parent["w"] + 0.011
                b["path"] = parent["path"] + (b["name"],)
            assert b["path"] not in out
            out[b["path"]] = b
    return out


def sums_from_samples(profile: Profile, index: int) -> dict[tuple[str, ...], list[int]]:
    """``path -> [self, total]`` by walking every sample, independent of the tree code."""
    nodes: dict = defaultdict(lambda: [0, 0])
    for s in profile.samples:
        v = s.values[index]
        if not v:
            continue
        path = tuple(f.name for f in reversed(profile.stack_frames(s)))
        for depth in range(1, len(path) + 1):
            nodes[path[:depth]][1] += v
        nodes[path][0] += v
    return dict(nodes)


def elements(root: ET.Element) -> set[str]:
    return {local(e.tag) for e in root.iter()}


def one_type_profile(stacks: list[tuple[list[Frame], int]]) -> Profile:
    """Stacks given root first, as a flame graph is read bottom-up."""
    p = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    for frames, value in stacks:
        p.add(frames[::-1], [value])
    return p


# -- geometry ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.sampled_from(FRAMES), min_size=1, max_size=6), st.integers(1, 1000)),
        min_size=1,
        max_size=15,
    ),
    st.booleans(),
)
def test_every_bar_is_where_the_samples_put_it_and_as_wide_as_its_total(rows, icicle):
    profile = one_type_profile(rows)
    drawn = bars(parse(encode(profile, 0, min_width_px=0, icicle=icicle)))
    found = paths_from_geometry(drawn, icicle)
    expected = sums_from_samples(profile, 0)
    whole = sum(v for _, v in rows)
    assert set(found) == set(expected)
    for path, (self_value, total) in expected.items():
        bar = found[path]
        assert bar["w"] == pytest.approx(total * USABLE / whole, abs=0.006)
        assert f"self: {format_bytes(self_value)} ({100 * self_value / whole:.2f}%)" in bar["tooltip"]
        assert f"total: {format_bytes(total)} ({100 * total / whole:.2f}%)" in bar["tooltip"]
    roots = [b for b in drawn if b["depth"] == 0]
    assert min(b["x"] for b in roots) == SIDE_PAD
    assert sum(b["w"] for b in roots) == pytest.approx(USABLE, abs=0.05)


def test_guide_profile_root_at_the_bottom_and_icicle_on_top():
    profile = guide_profile()
    index = profile.type_index("peak_space")
    flame = {b["name"]: b for b in bars(parse(encode(profile, index)))}
    chain = GUIDE_KV_CHAIN
    ys = [flame[name]["y"] for name in chain]
    assert ys == sorted(ys, reverse=True), "callers below callees"
    assert all(a - b == FRAME_HEIGHT for a, b in zip(ys, ys[1:], strict=False))
    icicle = {b["name"]: b for b in bars(parse(encode(profile, index, icicle=True)))}
    assert [icicle[name]["y"] for name in chain] == sorted(ys)
    expected = sums_from_samples(profile, index)
    whole = profile.totals()["peak_space"]
    kv = expected[tuple(chain)][1]
    assert flame[chain[-1]]["w"] == pytest.approx(kv * USABLE / whole, abs=0.006)
    assert flame[chain[-1]]["text"] == chain[-1]


def test_children_start_at_the_left_edge_and_self_is_the_gap_on_the_right():
    a, b, c = (Frame(n, "/app/x.py", i) for i, n in enumerate(["a", "b", "c"], 1))
    profile = one_type_profile([([a], 500), ([a, b], 300), ([a, c], 200)])
    drawn = {d["name"]: d for d in bars(parse(encode(profile, 0)))}
    assert drawn["b"]["x"] == drawn["a"]["x"] == SIDE_PAD
    assert drawn["c"]["x"] == pytest.approx(SIDE_PAD + USABLE * 0.3, abs=0.006)
    assert drawn["c"]["x"] + drawn["c"]["w"] == pytest.approx(SIDE_PAD + USABLE * 0.5, abs=0.01)


def test_narrow_frames_are_dropped_and_their_bytes_stay_in_the_caller():
    main_, big, tiny, under_tiny = (Frame(n, "/app/x.py", i) for i, n in enumerate(["main", "big", "tiny", "deep"]))
    # tiny is 0.4 px wide: under the default 0.5 px
    tiny_bytes = 4
    big_bytes = round(tiny_bytes * USABLE / 0.4) - tiny_bytes
    profile = one_type_profile([([main_, big], big_bytes), ([main_, tiny, under_tiny], tiny_bytes)])
    drawn = {d["name"]: d for d in bars(parse(encode(profile, 0)))}
    assert set(drawn) == {"main", "big"}
    assert drawn["main"]["w"] == pytest.approx(USABLE, abs=0.006)
    assert drawn["big"]["w"] == pytest.approx(USABLE * big_bytes / (big_bytes + tiny_bytes), abs=0.006)
    assert USABLE - drawn["big"]["w"] == pytest.approx(0.4, abs=0.011), "the gap keeps tiny's bytes"
    everything = {d["name"] for d in bars(parse(encode(profile, 0, min_width_px=0)))}
    assert everything == {"main", "big", "tiny", "deep"}


@pytest.mark.slow
def test_output_size_follows_the_picture_not_the_profile():
    root = Frame("main", "/app/x.py", 1)
    rows = [([root, Frame(f"leaf_{i}", "/app/x.py", i + 2)], 1) for i in range(20_000)]
    text = encode(one_type_profile(rows), 0)
    assert len(bars(parse(text))) == 1 and len(text) < 10_000
    wide = encode(one_type_profile(rows), 0, width=20_000 // 2 * 2 + 2 * SIDE_PAD)
    assert len(bars(parse(wide))) == 20_001


def test_a_diff_profile_draws_absolute_sizes(rich_profile):
    index = rich_profile.type_index("peak_space")
    text = encode(rich_profile, index, min_width_px=0)
    root = parse(text)
    drawn = bars(root)
    paths_from_geometry(drawn)  # every bar inside its caller
    assert "negative values" in "".join(root.itertext())
    assert sum(d["w"] for d in drawn if d["depth"] == 0) == pytest.approx(USABLE, abs=0.05)


def test_empty_profile_says_so():
    profile = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    root = parse(encode(profile, 0))
    assert bars(root) == [] and "(no samples)" in "".join(root.itertext())


# -- names, colours, header --------------------------------------------------------------


def test_long_names_are_cut_to_fit_with_an_ellipsis():
    long = Frame("VeryLongClassName > a_method_with_a_really_long_name_" + "x" * 80, "/app/x.py", 1, start_line=1)
    other = Frame("other", "/app/x.py", 2)
    profile = one_type_profile([([long], 100), ([other], 1900)])
    bar = next(d for d in bars(parse(encode(profile, 0))) if d["name"] == long.name)
    assert bar["text"].endswith("…") and long.name.startswith(bar["text"][:-1])
    assert len(bar["text"]) * CHAR_WIDTH <= bar["w"] - 2 * TEXT_PAD
    assert bar["tooltip"].split("\n")[-1] == "/app/x.py:1"


def hue(fill: str) -> float:
    r, g, b = (int(fill[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return colorsys.rgb_to_hls(r, g, b)[0] * 360


def test_colours_tell_python_native_trampoline_and_synthetic_apart():
    profile = guide_profile()
    profile.add([Frame("<outside framework>", kind=SYNTHETIC)], [1 << 30] * 6)
    drawn = {d["name"]: d["rect"] for d in bars(parse(encode(profile, profile.type_index("peak_space"))))}
    python = [r for n, r in drawn.items() if not n.startswith(("<", "0x"))] + [drawn["<module>"]]
    assert python and all(0 <= hue(r.get("fill")) <= 60 for r in python), "warm hues"
    assert 180 <= hue(drawn["0x7f151"].get("fill")) <= 240
    classes = {n: r.get("class").split() for n, r in drawn.items()}
    assert "p" in classes["<interpreter trampoline>"]
    assert "c" in classes["<cached free blocks>"] and "o" in classes["<outside framework>"]
    same = one_type_profile([([Frame("main", "a.py", 1)], 1)]), one_type_profile([([Frame("main", "b.py", 9)], 5)])
    fills = [bars(parse(encode(p, 0)))[0]["rect"].get("fill") for p in same]
    assert fills[0] == fills[1], "a name keeps its colour from picture to picture"


def test_header_has_the_type_the_total_and_every_comment():
    profile = guide_profile()
    profile.comments += [f"comment {i}" for i in range(10)]
    root = parse(dumps(profile, "svg", "inuse_space").decode("utf-8"))
    header = [t for t in root.findall(f"{SVG_NS}text")]
    words = "\n".join("".join(t.itertext()) for t in header)
    assert "inuse_space/bytes" in words
    assert f"total {format_bytes(profile.totals()['inuse_space'])}" in words
    assert "trace ring buffer overflowed; peak only over the recorded window" in words
    assert "comment 0" in words and "comment 9" in words  # the last ones in the "more" line's tooltip


# -- safety ----------------------------------------------------------------------------


def hostile_profile() -> Profile:
    p = Profile(sample_types=[SampleType("peak_space", "bytes")])
    for name in HOSTILE:
        frame = Frame(name, '/app/"><svg onload=alert(1)>.py', 3, start_line=3)
        p.add([frame], [1000], {"device": "<b onmouseover=x>"})
    p.comments = ["</text><script>alert(1)</script>", "]]>&\"'"]
    return p


def assert_inert(text: str) -> ET.Element:
    """Parses, holds only drawing elements, and refers to nothing outside itself."""
    root = parse(text)
    assert elements(root) <= ALLOWED
    assert "<!DOCTYPE" not in text and "<script" not in text.lower()
    for e in root.iter():
        for key, value in e.attrib.items():
            assert not key.lower().startswith("on") and "href" not in key
            assert "url(" not in value and "javascript:" not in value
    lowered = text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "http:" not in lowered and "https:" not in lowered and "@import" not in lowered
    return root


def test_hostile_names_stay_text():
    profile = hostile_profile()
    for group_by in (None, "device"):
        root = assert_inert(encode(profile, 0, width=6000, group_by=group_by, title="<svg onload=alert(1)>"))
        drawn = bars(root)
        names = {d["name"] for d in drawn}
        assert set(HOSTILE) <= names
        for d in drawn:
            if d["name"] in HOSTILE:
                assert d["text"] == d["name"], "the whole name, as text"
                assert d["tooltip"].endswith('/app/"><svg onload=alert(1)>.py:3')
        words = "".join(root.itertext())
        assert "<svg onload=alert(1)>" in words and "</text><script>alert(1)</script>" in words
    assert "device=<b onmouseover=x>" in {d["name"] for d in bars(parse(encode(profile, 0, group_by="device")))}


def test_characters_xml_cannot_carry_become_replacement_characters():
    profile = one_type_profile([([Frame("a\x00b\x1b[31m\udcff\r\nc", "/app/x.py", 1)], 10)])
    root = assert_inert(encode(profile, 0))
    (bar,) = bars(root)
    assert bar["text"] == "a\ufffdb\ufffd[31m\ufffd\r\nc"


# -- command line --------------------------------------------------------------------------


@pytest.fixture
def guide_file(tmp_path) -> Path:
    path = tmp_path / "guide.pb.gz"
    save(guide_profile(), path)
    return path


@pytest.mark.parametrize("explicit", [True, False])
def test_export_writes_svg(capsys, tmp_path, guide_file, explicit):
    out_path = tmp_path / "flame.svg"
    fmt = ["--format", "svg"] if explicit else []
    rc, out, err = run(capsys, "export", guide_file, *fmt, "--type", "inuse", "-o", out_path)
    assert rc == 0, err
    assert out.startswith(f"wrote {out_path} (svg, inuse_space, ")
    root = assert_inert(out_path.read_text(encoding="utf-8"))
    assert "GPUModelRunner > _allocate_kv_cache_tensors" in {d["name"] for d in bars(root)}
    assert "trace ring buffer overflowed" in "".join(root.itertext())


def test_export_svg_applies_the_filters(capsys, tmp_path, guide_file):
    out_path = tmp_path / "f.svg"
    rc, _, err = run(capsys, "export", guide_file, "--no-cached", "--focus", "Worker.load_model", "-o", out_path)
    assert rc == 0, err
    names = {d["name"] for d in bars(parse(out_path.read_text(encoding="utf-8")))}
    assert names == {"Worker > load_model", "LlamaForCausalLM > __init__", "LlamaMLP > __init__"}


def test_flame_writes_the_same_filtered_profile_as_svg(capsys, tmp_path, guide_file):
    out_path = tmp_path / "flame.svg"
    rc, out, err = run(capsys, "flame", guide_file, "--no-cached", "--svg", out_path)
    assert rc == 0 and err == ""
    assert "EngineCore > __init__" in out and f"wrote {out_path} (svg)" in out
    names = {d["name"] for d in bars(assert_inert(out_path.read_text(encoding="utf-8")))}
    assert "LlamaMLP > __init__" in names and "<cached free blocks>" not in names
    rc, out, err = run(capsys, "flame", guide_file, "--json", "--svg", tmp_path / "again.svg")
    assert rc == 0 and json.loads(out)["sample_type"] == "peak_space"
    assert parse((tmp_path / "again.svg").read_text(encoding="utf-8")) is not None


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "{f}", "-o", "{dir}/missing-folder/out.svg"],
        ["export", "{f}", "--format", "svg", "-o", "{dir}"],
        ["flame", "{f}", "--svg", "{dir}/missing-folder/out.svg"],
        ["flame", "{f}", "--json", "--svg", "{dir}"],
    ],
)
def test_unwritable_output_is_one_line_and_exit_2(capsys, tmp_path, guide_file, argv):
    outdir = tmp_path / "out"
    outdir.mkdir()
    rc, out, err = run(capsys, *[a.format(f=guide_file, dir=outdir) for a in argv])
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "cannot write" in err and "Traceback" not in err
    assert os.listdir(outdir) == []


@pytest.mark.parametrize(
    "devices, heading",
    [
        (["cpu"], "CPU memory flame graph: peak_space"),
        (["cuda:0", "cuda:1"], "GPU memory flame graph: peak_space"),
        ([], "Memory flame graph: peak_space"),
        (["cpu", "cuda:0"], "Memory (cpu, cuda:0) flame graph: peak_space"),
    ],
)
def test_the_heading_names_the_memory_the_profile_measured(capsys, tmp_path, devices, heading):
    p = Profile(sample_types=[SampleType("peak_space", "bytes")])
    for device in devices or [None]:
        p.add([Frame("main", "/app/x.py", 1)], [100], {"device": device} if device else None)
    assert heading in "".join(parse(encode(p, 0)).itertext())
    path = tmp_path / "p.pb.gz"
    save(p, path)
    rc, _, err = run(capsys, "flame", path, "--svg", tmp_path / "f.svg")
    assert rc == 0, err
    assert heading in "".join(parse((tmp_path / "f.svg").read_text()).itertext())
