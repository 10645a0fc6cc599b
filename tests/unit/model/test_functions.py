"""A bar is a function: the table of bars as columns agrees with the Frame-per-bar reading."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflame.model import Frame
from gpuflame.model.function_table import FunctionTable, function_table
from gpuflame.model.functions import function_frames
from gpuflame.model.profile import FRAME_KINDS, NATIVE, PYTHON

DECORATED = "import functools\n\n\n@functools.cache\ndef cached():\n    return 1\n"


def bars_of(table: FunctionTable) -> list[Frame]:
    """Row i of *table* as the Frame that :func:`function_frames` gives for it."""
    columns = zip(table.names, table.file.tolist(), table.line.tolist(), table.kind.tolist(), strict=True)
    return [Frame(name, table.files[f], line, table.kinds[k], line) for name, f, line, k in columns]


def expected(groups: list[list[Frame]]) -> tuple[list[Frame], list[list[int]]]:
    """The distinct bars of every group sorted, and each frame's row, the Frame-per-bar way."""
    shown = [function_frames(g) for g in groups]
    bars = sorted({b for group in shown for b in group})
    index = {b: i for i, b in enumerate(bars)}
    return bars, [[index[b] for b in group] for group in shown]


frames = st.builds(
    Frame,
    name=st.sampled_from(["f", "A > g", "é", "B > g", "z", ""]),
    file=st.sampled_from(["m.py", "n.py", "", "<string>", "lib.so"]),
    line=st.integers(0, 9),
    kind=st.sampled_from(FRAME_KINDS),
    start_line=st.integers(0, 5),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(frames, max_size=12), min_size=1, max_size=3))
def test_the_table_is_the_sorted_bars_of_each_group(groups):
    table = function_table(groups)
    bars, rows = expected(groups)
    assert bars_of(table) == bars
    assert table.files == sorted(table.files) and table.kinds == sorted(table.kinds)
    first = 0
    for group_rows in rows:
        assert table.row[first : first + len(group_rows)].tolist() == group_rows
        first += len(group_rows)


def test_a_function_is_settled_within_its_group():
    """The same function with another definition line in another profile (a diff) is another bar."""
    new, old = Frame("step", "t.py", 9, PYTHON, 4), Frame("step", "t.py", 7, PYTHON, 2)
    table = function_table([[new, new._replace(line=12)], [old]])
    assert bars_of(table) == [Frame("step", "t.py", 2, PYTHON, 2), Frame("step", "t.py", 4, PYTHON, 4)]
    assert table.row.tolist() == [1, 1, 0]


def test_decorated_functions_are_named_at_their_def(tmp_path: Path):
    source = tmp_path / "deco.py"
    source.write_text(DECORATED)
    frames = [Frame("cached", str(source), 6, PYTHON, 4), Frame("cached", str(source), 6, NATIVE, 4)]
    table = function_table([frames])
    assert bars_of(table) == sorted(function_frames(frames))
    assert sorted(table.line.tolist()) == [4, 5]  # the Python one moves to its def; a native frame keeps its line


def test_no_frames_give_an_empty_table():
    table = function_table([[], []])
    assert table.names == [] and len(table.row) == 0
