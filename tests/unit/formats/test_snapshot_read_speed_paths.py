"""The shortcuts that make reading a snapshot cheaper keep its meaning (speed itself is bench/'s)."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from gpuflame.errors import ProfileFormatError
from gpuflame.formats import torch_snapshot
from gpuflame.formats.snapshot_stacks import Stacks
from gpuflame.formats.snapshot_trace import _times_within
from gpuflame.model.profile import Profile
from gpuflame.symbols.qualnames import Resolver
from tests.helpers.paths import DATA

SMALL = DATA / "torch-snapshot-silmont2000-mem_snapshot.pickle.gz"


def test_the_collector_stays_paused_from_the_read_to_the_end_of_the_conversion(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Re-enabled between them, it walked every object of the snapshot just read."""
    monkeypatch.setenv("GPUFLAME_CACHE_DIR", str(tmp_path))
    seen: list[bool] = []
    real = torch_snapshot.from_snapshot

    def spy(snapshot: Any, **kwargs: Any) -> Profile:
        seen.append(gc.isenabled())
        return real(snapshot, **kwargs)

    monkeypatch.setattr(torch_snapshot, "from_snapshot", spy)
    assert gc.isenabled()
    profile = torch_snapshot.decode(SMALL.read_bytes())
    assert seen == [False]
    assert gc.isenabled()  # and given back
    assert profile.samples


@pytest.mark.parametrize(
    ("times", "ok"),
    [
        ((5, 6, 7), True),
        ((5,), True),
        ((4, 6), False),  # before the window
        ((5, 11), False),  # after it
        ((5, True), False),  # a bool is not a time
        ((5, 6.0), False),
        ((5, None), False),
        ((5, 2**70), False),
    ],
)
def test_times_within_the_window(times: tuple[Any, ...], ok: bool) -> None:
    assert _times_within(times, 5, 10) is ok


def _frame(name: str, line: int) -> dict[str, object]:
    return {"filename": f"/nowhere/{name}.py", "line": line, "name": name}


def _stacks() -> Stacks:
    return Stacks(Profile(sample_types=[]), Resolver())


def _stacks_counting_reads() -> tuple[Stacks, list[object]]:
    """Stacks whose every call of :meth:`Stacks.stack` (a list read, or looked up by identity) is listed."""
    stacks = _stacks()
    read: list[object] = []
    real = stacks.stack
    stacks.stack = lambda f: read.append(f) or real(f)  # type: ignore[method-assign]
    return stacks, read


def _named(stacks: Stacks, found: list[tuple[int, ...]]) -> list[list[str]]:
    return [[stacks.profile.frames[i].name for i in stack] for stack in found]


def test_many_gives_each_list_the_stack_that_stack_gives_it() -> None:
    """Shared lists, equal lists of other dicts, lists that share the frames the key is made of but differ
    elsewhere, and empty or missing frames, all in one call."""
    a, m, b = _frame("a", 1), _frame("m", 2), _frame("b", 3)
    shared = [a, m, b]
    lists: list[Any] = [
        shared,
        [a, m, b],  # equal, another list
        [_frame("a", 1), _frame("m", 2), _frame("b", 3)],  # equal, other dicts
        [a, _frame("x", 9), m, _frame("y", 9), b],  # leaf, middle and root as the next one's
        [a, _frame("z", 8), m, _frame("w", 8), b],
        shared,
        [],
        None,
        [b, a],
    ]
    stacks = _stacks()
    found = stacks.many(lists)
    one_by_one = [stacks.stack_of(f) for f in lists]
    assert found == one_by_one
    assert _named(stacks, found)[3] != _named(stacks, found)[4]
    assert _named(stacks, found)[2] == ["a", "m", "b"]
    assert found[6] == found[7] == stacks.no_stack


def test_many_reads_one_list_per_distinct_stack() -> None:
    """A trace holds a frames list per event and a few hundred stacks among them: reading each list was
    most of converting a large trace."""
    frames = [_frame(f"f{i}", i) for i in range(6)]
    shapes = [frames[0:3], frames[2:6], frames[1:5]]
    lists = [list(shapes[i % 3]) for i in range(3000)]  # a list per event, frame dicts shared
    stacks, read = _stacks_counting_reads()
    found = stacks.many(lists)
    assert len(read) == 3
    assert _named(stacks, found[:3]) == [["f0", "f1", "f2"], ["f2", "f3", "f4", "f5"], ["f1", "f2", "f3", "f4"]]
    assert found[3:] == found[:3] * 999


@pytest.mark.parametrize("bad", [[[_frame("a", 1)], {"filename": "x"}], [[_frame("a", 1)], ["not a frame"]]])
def test_many_refuses_what_stack_refuses(bad: list[Any]) -> None:
    with pytest.raises(ProfileFormatError):
        _stacks().many(bad)


def test_many_keeps_the_stack_depth_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLAME_MAX_STACK_DEPTH", "2")
    with pytest.raises(ProfileFormatError, match="GPUFLAME_MAX_STACK_DEPTH"):
        _stacks().many([[_frame("a", 1)], [_frame("a", 1), _frame("b", 2), _frame("c", 3)]])


def test_many_reads_lists_that_differ_where_the_key_does_not_look_once_per_stack() -> None:
    """Model code's stacks share their leaf, middle and root and differ in one line (half of a real trace's
    lists did): each such stack is still read once, not once per list."""
    leaf, mid, root = _frame("leaf", 1), _frame("mid", 2), _frame("root", 3)
    lines = [_frame("forward", 160), _frame("forward", 163)]
    lists = [[leaf, lines[i % 2], mid, _frame("x", 4), root] for i in range(1000)]
    for frames in lists:  # the frame dicts shared, as torch shares them
        frames[3] = lists[0][3]
    stacks, read = _stacks_counting_reads()
    found = stacks.many(lists)
    assert len(read) == 2
    assert [stacks.profile.frames[s[1]].line for s in found[:4]] == [160, 163, 160, 163]
