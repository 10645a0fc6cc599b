"""A page of 50,000 distinct functions: search, focus, sandwich and the top table exact on every frame.

The page ships its stacks as a prefix tree in binary arrays and sums the
tree from it (render/html.py, viewer.js); every figure here is computed in
Python from the generated call tree and compared to the page's, so a lost
or double-counted frame anywhere in the tree shows. No timing is asserted:
speed is bench/bench_viewer.py's.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gpuflame.cli.main import main
from gpuflame.formats import save
from gpuflame.model import Profile
from tests.browser.chrome_pipe import Chrome
from tests.browser.viewer_page import choose, open_viewer, search, settle
from tests.helpers.large_profile import function_frame, tree_parents, tree_profile

FUNCTIONS = 50_000
QUERY = "Class1.method_3"  # Class1, Class10..19, Class100..: matches nested in matches


class Expected:
    """Every function's self (its one sample) and subtree total, from the generator's call tree."""

    def __init__(self, profile: Profile) -> None:
        self.parent = tree_parents(FUNCTIONS, random.Random(1))
        self.names = [function_frame(i).name for i in range(FUNCTIONS)]
        self.self = [s.values[0] for s in profile.samples]  # sample i ends in function i
        self.total = list(self.self)
        for i in range(FUNCTIONS - 1, 0, -1):  # callers come before callees
            self.total[self.parent[i]] += self.total[i]

    def path(self, i: int) -> list[str]:
        out = []
        while i >= 0:
            out.append(self.names[i])
            i = self.parent[i]
        return out[::-1]

    def matched(self, query: str) -> int:
        """Bytes under functions whose name holds *query*, counted once per stack (the viewer's search)."""
        q = normalize(query)
        hit = [q in normalize(n) for n in self.names]
        return sum(self.total[i] for i in range(FUNCTIONS) if hit[i] and not self.hit_above(i, hit))

    def hit_above(self, i: int, hit: list[bool]) -> bool:
        i = self.parent[i]
        while i >= 0:
            if hit[i]:
                return True
            i = self.parent[i]
        return False


def normalize(name: str) -> str:
    """As the viewer and symbols/names.py spell a name for search."""
    return ".".join(part.strip() for part in name.strip().split(">")).lower()


@pytest.fixture(scope="module")
def profile() -> Profile:
    return tree_profile(FUNCTIONS)


@pytest.fixture(scope="module")
def expected(profile: Profile) -> Expected:
    return Expected(profile)


@pytest.fixture(scope="module")
def large_html(tmp_path_factory: pytest.TempPathFactory, profile: Profile) -> Path:
    folder = tmp_path_factory.mktemp("large")
    save(profile, folder / "large.pb.gz")
    assert main(["view", str(folder / "large.pb.gz")]) == 0
    return folder / "large.html"


@pytest.fixture
def large(chrome: Chrome, large_html: Path) -> Chrome:
    state = open_viewer(chrome, large_html)
    assert state["error"] is None, state["error"]
    return chrome


def test_every_function_is_one_bar_and_the_total_is_exact(large: Chrome, expected: Expected) -> None:
    s = settle(large)
    assert s["nodes"] == FUNCTIONS + 1 and s["functions"] == FUNCTIONS  # the root, then a bar a function
    assert s["total"] == sum(expected.self)
    choose(large, "label-select", str(1))  # device=cuda:1: the odd functions' samples
    s = settle(large)
    assert s["total"] == sum(expected.self[1::2])
    # hiding trampolines takes the path that walks every stack frame by frame: the same tree here
    large.evaluate(
        "(() => { const c = document.getElementById('hide-trampolines'); c.checked = true; "
        "c.dispatchEvent(new Event('change')); })()"
    )
    s = settle(large)
    assert s["total"] == sum(expected.self[1::2]) and s["hideTrampolines"]


def test_search_share_is_exact(large: Chrome, expected: Expected) -> None:
    s = search(large, QUERY)
    assert s["matchTotal"] == expected.matched(QUERY)


def test_top_table_focus_and_sandwich_are_exact(large: Chrome, expected: Expected) -> None:
    large.evaluate("document.getElementById('table-toggle').click()")
    s = settle(large)
    order = sorted(range(FUNCTIONS), key=lambda i: (-expected.self[i], -expected.total[i], expected.names[i]))
    assert s["tableRows"] == [expected.names[i] for i in order[:200]]
    top = order[0]
    large.evaluate("document.querySelector('#top-table tbody tr').click()")
    s = settle(large)
    assert s["focusPath"] == expected.path(top)
    bar = large.evaluate(f"window.gpuflameBar({json.dumps(expected.names[top])})")
    assert bar["total"] == expected.total[top]
    large.evaluate("document.querySelector('#top-table tbody tr button.sandwich').click()")
    s = settle(large)
    assert s["sandwich"] == expected.names[top] and s["sandwichTotal"] == expected.total[top]
    assert s["sandwichCallers"] == [{"name": expected.names[expected.parent[top]], "total": expected.total[top]}]
    children = sorted((i for i in range(FUNCTIONS) if expected.parent[i] == top), key=lambda i: expected.names[i])
    children.sort(key=lambda i: -expected.total[i])
    assert s["sandwichCallees"] == [{"name": expected.names[i], "total": expected.total[i]} for i in children]


def test_the_page_lets_go_of_its_payload_text_once_read(large: Chrome) -> None:
    """The base64 payload is read once and dropped from the DOM: at a million frames it is 24 MB the renderer keeps."""
    assert large.evaluate("document.getElementById('gpuflame-data').textContent.length") == 0
    assert settle(large)["total"] > 0  # the page drew from what it read
