"""The flame tree as JSON, for scripts and web viewers.

    {"format": "gpuflame-flame-tree", "version": 1,
     "sample_type": "peak_space", "unit": "bytes", "total": 123,
     "totals": {"peak_space": 123, "inuse_space": 99, ...},
     "comments": [...],
     "roots": [{"name": "<module>", "file": "run.py", "line": 1, "kind": "python",
                "self": 0, "total": 123, "children": [...]}, ...]}

Roots are the outermost callers; children are what a node called, in name
order. Values are exact integers in the sample type's unit.

A large profile has millions of nodes, so the text is written level by
level from the tree's arrays rather than through a dict per node.
"""

from __future__ import annotations

import json

from gpuflame.analysis.tree import FlameTree, build_tree, frame_dict
from gpuflame.model.profile import Frame, Profile

FORMAT = "gpuflame-flame-tree"
VERSION = 1


def encode(profile: Profile, type_index: int) -> str:
    """The flame tree of *profile* for the sample type at *type_index*, as JSON text."""
    tree = build_tree(profile, type_index)
    sample_type = profile.sample_types[type_index]
    head = {
        "format": FORMAT,
        "version": VERSION,
        "sample_type": sample_type.type,
        "unit": sample_type.unit,
        "total": tree.total,
        "totals": profile.totals(),
        "comments": list(profile.comments),
    }
    text = json.dumps(head)
    return text[:-1] + ', "roots": [' + ", ".join(_node_texts(tree)) + "]}\n"


def frame_fields(frame: Frame) -> str:
    """The JSON members that describe a frame, without braces."""
    return json.dumps(frame_dict(frame))[1:-1]


def _node_texts(tree: FlameTree) -> list[str]:
    """The JSON text of every root, built from the deepest level down.

    A node's text needs its children's texts, and all nodes of one depth are
    listed in name order with their children contiguous in the next level,
    so each level is joined from slices of the level above it.
    """
    if not tree.depth:
        return []
    fields = [""] + [frame_fields(f) for f in tree.frames]
    above: list[str] = []
    for depth in range(tree.depth - 1, -1, -1):
        level = tree.level(depth)
        selfs = tree.level_self(depth).tolist()
        totals = level.total.tolist()
        codes = level.codes.tolist()
        if above:
            lo, hi = (a.tolist() for a in tree.children_range(depth))
        else:
            lo = hi = [0] * len(codes)
        above = [
            f'{{{fields[c]}, "self": {s}, "total": {t}, "children": [{", ".join(above[a:b])}]}}'
            for c, s, t, a, b in zip(codes, selfs, totals, lo, hi, strict=True)
        ]
    return above
