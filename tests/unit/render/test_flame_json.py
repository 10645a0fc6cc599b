"""The flame tree as JSON: valid, exact, and the same tree the samples describe."""

from __future__ import annotations

import json
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflame.model import Frame, Profile, memory_sample_types
from gpuflame.model.functions import function_frames
from gpuflame.model.profile import NATIVE
from gpuflame.render.flame_json import FORMAT, encode
from gpuflame.render.writers import dumps
from tests.helpers.guide import guide_profile

FRAMES = [
    Frame("main", "app.py", 1),
    Frame('Quote "q" > back\\slash', "we ird/ü.py", 2),
    Frame("0x7f15", kind=NATIVE),
    Frame("leaf", "app.py", 9),
]


def paths_from_json(nodes, prefix=()) -> dict:
    out = {}
    for n in nodes:
        frame = Frame(n["name"], n["file"], n["line"], n["kind"], n["def_line"])
        path = prefix + (frame,)
        out[path] = (n["self"], n["total"])
        assert n["total"] == n["self"] + sum(c["total"] for c in n["children"])
        names = [(c["name"], c["file"], c["line"], c["kind"]) for c in n["children"]]
        assert names == sorted(names), "children in name order"
        out.update(paths_from_json(n["children"], path))
    return out


def paths_from_samples(profile: Profile, index: int) -> dict:
    nodes: dict = defaultdict(lambda: [0, 0])
    bars = function_frames(profile.frames)  # a bar is a function, at its def line
    for s in profile.samples:
        v = s.values[index]
        if not v:
            continue
        path = tuple(bars[i] for i in reversed(s.stack))
        for depth in range(1, len(path) + 1):
            nodes[path[:depth]][1] += v
        nodes[path][0] += v
    return {k: tuple(v) for k, v in nodes.items()}


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.sampled_from(FRAMES), min_size=1, max_size=6), st.integers(0, 2**58)),
        max_size=15,
    )
)
def test_json_tree_equals_the_samples_tree(rows):
    profile = Profile(sample_types=memory_sample_types(inuse=False, alloc=False))
    for stack, v in rows:
        profile.add(stack, [v, 1])
    data = json.loads(encode(profile, 0))
    assert data["format"] == FORMAT and data["sample_type"] == "peak_space" and data["unit"] == "bytes"
    assert data["total"] == sum(v for _, v in rows) == sum(r["total"] for r in data["roots"])
    assert data["totals"] == profile.totals()
    assert paths_from_json(data["roots"]) == paths_from_samples(profile, 0)


def test_guide_profile_json_via_formats():
    profile = guide_profile()
    index = profile.pick_type()
    data = json.loads(dumps(profile, "json", "inuse_space"))
    assert data["sample_type"] == "inuse_space"
    assert data["comments"] == profile.comments
    assert paths_from_json(data["roots"]) == paths_from_samples(profile, profile.type_index("inuse_space"))
    default = json.loads(dumps(profile, "json"))
    assert default["sample_type"] == profile.sample_types[index].type


def test_empty_profile():
    data = json.loads(encode(Profile(sample_types=memory_sample_types()), 0))
    assert data["roots"] == [] and data["total"] == 0
