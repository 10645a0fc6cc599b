"""Frames from (code object, offset) pairs, resolved once per process (capture/code_frames.py)."""

from __future__ import annotations

import gc

from gpuflame.capture import code_frames
from gpuflame.capture.code_frames import CodeFrames


def make_code(name: str, body_lines: int = 1) -> object:
    """A fresh code object of a method ``Model.<name>`` defined at line 1 of model.py."""
    source = "class Model:\n    def " + name + "(self):\n" + "        x = 1\n" * body_lines
    namespace: dict[str, object] = {}
    exec(compile(source, "/somewhere/model.py", "exec"), namespace)  # noqa: S102 - a test's own source
    return getattr(namespace["Model"], name).__code__


def test_a_later_recorder_gets_the_frames_already_named() -> None:
    code = make_code("forward")
    first = CodeFrames().frame(code, 0)
    again = CodeFrames().frame(code, 0)  # another recorder, another window: the same Frame, not named anew
    assert first is again
    assert (first.name, first.file, first.start_line) == ("Model > forward", "/somewhere/model.py", 2)


def test_a_dead_code_object_leaves_the_cache() -> None:
    code = make_code("gone")
    CodeFrames().frame(code, 0)
    key = id(code)
    assert key in code_frames._RESOLVED
    del code
    gc.collect()
    assert key not in code_frames._RESOLVED


def test_an_id_reused_by_another_code_object_is_named_afresh() -> None:
    """A stale entry under a reused id (planted here: CPython's reuse of an id cannot be forced) is not trusted."""
    old, new = make_code("old_method"), make_code("new_method")
    frames = CodeFrames()
    frames.frame(old, 0)
    code_frames._RESOLVED[id(new)] = code_frames._RESOLVED[id(old)]
    assert frames.frame(new, 0).name == "Model > new_method"
    assert frames.frame(old, 0).name == "Model > old_method"


def test_gpuflames_own_frames_are_dropped() -> None:
    assert CodeFrames().frame(code_frames.code_name.__code__, 0) is None
    assert CodeFrames().frame(None, 0) is None


def test_python_frames_names_a_stack_as_frame_does_pair_by_pair() -> None:
    forward, backward = make_code("forward", 3), make_code("backward")
    ours = code_frames.code_name.__code__
    stack = [(forward, 0), (None, 0x7F00), (ours, 0), (backward, 0), (forward, 6), (forward, 0)]
    frames = CodeFrames()
    expected = [f for f in (frames.frame(c, i) for c, i in stack if c is not None) if f is not None]
    assert [f.name for f in expected] == ["Model > forward", "Model > backward", "Model > forward", "Model > forward"]
    assert expected[0].line != expected[2].line  # two offsets, two lines
    assert CodeFrames().python_frames(stack) == expected
    assert CodeFrames().python_frames([(make_code("fresh"), 0)])[0].name == "Model > fresh"  # not named before
