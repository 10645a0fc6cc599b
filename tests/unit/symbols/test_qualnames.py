"""Qualified names from (file, line, co_name), checked against CPython's own ``co_qualname``."""

from __future__ import annotations

import os
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from gpuflame.symbols import qualnames
from gpuflame.symbols.qualnames import Resolver, display, qualname
from gpuflame.symbols.source_index import index_source
from tests.helpers.paths import FIXTURES

TRICKY = textwrap.dedent(
    '''\
    import functools


    def deco(f):
        return f


    class Outer:
        """Nested classes, decorated methods, lambdas and comprehensions."""

        class Inner:
            def method(self):
                return [x for x in range(3)]

            class Deepest:
                def leaf(self):
                    return {k: v for k, v in {}.items()}

        @deco
        @functools.lru_cache(None)
        def cached(self, key=lambda v: v):
            def helper():
                return (y for y in range(2))

            return helper

        sorter = lambda self: 0  # noqa: E731

        async def coro(self):
            return {z for z in ()}


    def outer():
        class Local:
            def m(self):
                pass

        def inner():
            def innermost():
                return 1

            return innermost

        return lambda: inner


    def module_function():
        return sorted([3, 1], key=lambda t: t)


    VALUE = [n for n in range(2)]
    '''
)


def code_objects(source: str, filename: str) -> list[types.CodeType]:
    out = []
    stack = [compile(source, filename, "exec")]
    while stack:
        code = stack.pop()
        out.append(code)
        stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return out


def cpython_names(path: Path) -> list[tuple[int, str, str]]:
    """(line, co_name, co_qualname) for every line CPython can report, from the compiler itself.

    Lines where two code objects of the same name share a line (a
    comprehension inside a comprehension on one line) cannot be told apart
    from (file, line, co_name) and are left out.
    """
    source = path.read_text(encoding="utf-8")
    seen: dict[tuple[int, str], set[str]] = {}
    for code in code_objects(source, str(path)):
        for _, _, line in code.co_lines():
            if line is not None:
                seen.setdefault((line, code.co_name), set()).add(code.co_qualname)
    return [(line, name, next(iter(q))) for (line, name), q in sorted(seen.items()) if len(q) == 1]


needs_co_qualname = pytest.mark.skipif(sys.version_info < (3, 11), reason="co_qualname is new in 3.11")


@pytest.fixture
def tricky(tmp_path: Path) -> Path:
    path = tmp_path / "tricky.py"
    path.write_text(TRICKY, encoding="utf-8")
    return path


@needs_co_qualname
def test_every_line_of_a_tricky_file_matches_cpython(tricky: Path) -> None:
    names = cpython_names(tricky)
    assert len(names) > 20
    wrong = [
        (line, co, want, qualname(str(tricky), line, co))
        for line, co, want in names
        if qualname(str(tricky), line, co) != want
    ]
    assert not wrong


@needs_co_qualname
@pytest.mark.parametrize("module", ["torch.nn.modules.linear", "torch.nn.modules.module", "torch.optim.adam"])
def test_real_library_files_match_cpython(module: str) -> None:
    torch_file = pytest.importorskip(module).__file__
    path = Path(torch_file)
    names = cpython_names(path)
    wrong = [(line, co) for line, co, want in names if qualname(str(path), line, co) != want]
    assert not wrong, wrong[:10]


@needs_co_qualname
def test_the_fixture_model_matches_cpython() -> None:
    path = FIXTURES / "llama_like.py"
    for line, co, want in cpython_names(path):
        assert qualname(str(path), line, co) == want, (line, co)


def line_of(path: Path, text: str) -> int:
    return 1 + next(i for i, line in enumerate(path.read_text().splitlines()) if text in line)


def test_guide_table_names(tricky: Path) -> None:
    f = str(tricky)
    assert display(f, line_of(tricky, "return [x for x in range(3)]"), "method") == "Outer > Inner > method"
    assert display(f, line_of(tricky, "{k: v for k, v"), "leaf") == "Outer > Inner > Deepest > leaf"
    assert display(f, line_of(tricky, "return innermost"), "inner") == "outer > inner"
    assert display(f, line_of(tricky, "return 1"), "innermost") == "outer > inner > innermost"
    assert display(f, line_of(tricky, "pass"), "m") == "outer > Local > m"
    assert display(f, line_of(tricky, "return sorted"), "module_function") == "module_function"
    assert display(f, line_of(tricky, "return sorted"), "<lambda>") == "module_function > <lambda>"
    assert display(f, line_of(tricky, "VALUE ="), "<module>") == "<module>"
    assert display(f, line_of(tricky, "return {z for z"), "coro") == "Outer > coro"


def test_decorator_lines_map_to_the_decorated_function_and_its_scope(tricky: Path) -> None:
    f = str(tricky)
    for marker in ("@deco", "@functools.lru_cache", "def cached"):
        line = line_of(tricky, marker)
        # a frame of the function itself (its co_name) on any of its header lines
        assert qualname(f, line, "cached") == "Outer.cached"
        # a frame of the class body evaluating the decorators
        assert qualname(f, line, "Outer") == "Outer"
    # the default value's lambda runs in the class body, not in the method
    assert qualname(f, line_of(tricky, "def cached"), "<lambda>") == "Outer.<lambda>"


def test_llama_like_model_names() -> None:
    path = FIXTURES / "llama_like.py"
    f = str(path)
    assert display(f, line_of(path, "alloc: mlp-forward-gate"), "forward") == "LlamaMLP > forward"
    assert display(f, line_of(path, "alloc: mlp-gate"), "__init__") == "LlamaMLP > __init__"
    assert display(f, line_of(path, "alloc: runner-allocate-kv"), "_allocate_kv_cache_tensors") == (
        "GPUModelRunner > _allocate_kv_cache_tensors"
    )
    assert display(f, line_of(path, "alloc: rotate_half"), "rotate_half") == "rotate_half"
    # a decorated method: the decorator line and the def line
    assert display(f, line_of(path, "@torch.no_grad()"), "generate") == "LlamaForCausalLM > generate"


def test_torch_linear_init_at_its_real_line() -> None:
    torch = pytest.importorskip("torch")
    import inspect

    lines, first = inspect.getsourcelines(torch.nn.Linear.__init__)
    line = first + next(i for i, text in enumerate(lines) if "torch.empty(" in text)
    assert display(inspect.getsourcefile(torch.nn.Linear), line, "__init__") == "Linear > __init__"


# -- when the name disagrees ----------------------------------------------------


def test_name_defined_once_elsewhere_wins_over_the_line(tmp_path: Path) -> None:
    # the file changed since the profile: the line now falls in another function
    path = tmp_path / "moved.py"
    path.write_text("class A:\n    def f(self):\n        pass\n\n\nclass B:\n    def g(self):\n        pass\n")
    assert qualname(str(path), 3, "g") == "B.g"


def test_unknown_name_falls_back_to_the_innermost_def(tmp_path: Path) -> None:
    path = tmp_path / "edited.py"
    path.write_text("class A:\n    def f(self):\n        x = 1\n        return x\n")
    assert qualname(str(path), 3, "vanished") == "A.f"


def test_no_def_at_the_line_keeps_co_name(tmp_path: Path) -> None:
    path = tmp_path / "flat.py"
    path.write_text("x = 1\ny = 2\n")
    assert qualname(str(path), 2, "somefunc") == "somefunc"
    assert qualname(str(path), 99, "somefunc") == "somefunc"
    assert qualname(str(path), 0, "somefunc") == "somefunc"
    assert qualname(str(path), -5, "somefunc") == "somefunc"


# -- files that cannot be read ------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        None,  # missing
        b"def f(:\n    pass\n",  # syntax error
        b"def f():\n    return '\xe9\xff'\n",  # not UTF-8, no coding cookie
        b"\x00\x01\x02binary",
        b"",
    ],
)
def test_unreadable_sources_fall_back_to_co_name(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "src.py"
    if content is not None:
        path.write_bytes(content)
    assert qualname(str(path), 1, "f") == "f"
    assert display(str(path), 1, "f") == "f"
    assert Resolver().display(str(path), 1, "f") == "f"


def test_directories_and_pseudo_files_fall_back(tmp_path: Path) -> None:
    assert qualname(str(tmp_path), 1, "f") == "f"
    assert qualname("<string>", 1, "f") == "f"
    assert qualname("<frozen importlib._bootstrap>", 1, "_load") == "_load"
    assert qualname("", 1, "f") == "f"
    assert qualname("bad\x00path.py", 1, "f") == "f"


def test_latin1_file_with_a_coding_cookie_is_read(tmp_path: Path) -> None:
    path = tmp_path / "latin.py"
    path.write_bytes(b"# -*- coding: latin-1 -*-\nclass C:\n    def m(self):\n        return '\xe9'\n")
    assert qualname(str(path), 4, "m") == "C.m"


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() == 0, reason="root reads any file")
def test_unreadable_file_falls_back(tmp_path: Path) -> None:
    path = tmp_path / "secret.py"
    path.write_text("class C:\n    def m(self):\n        pass\n")
    path.chmod(0)
    assert qualname(str(path), 3, "m") == "m"


# -- caching ----------------------------------------------------------------------------


def test_each_file_is_parsed_once_and_again_when_it_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parses: list[str] = []
    real = qualnames._parse
    monkeypatch.setattr(qualnames, "_parse", lambda path, size, *store: parses.append(path) or real(path, size, *store))
    path = tmp_path / "m.py"
    path.write_text("class A:\n    def f(self):\n        pass\n")
    resolver = Resolver()
    for _ in range(1000):
        assert resolver.display(str(path), 3, "f") == "A > f"
        assert qualname(str(path), 3, "f") == "A.f"
    assert parses == [str(path)]
    # a different size and mtime: parsed again, new answer
    path.write_text("class Renamed:\n    def f(self):\n        pass\n\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert qualname(str(path), 3, "f") == "Renamed.f"
    assert len(parses) == 2


def test_resolver_memoizes_many_frames_cheaply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted, not timed (speed is bench/'s): 47,700 lookups parse the file once and index each line once."""
    path = tmp_path / "llama_like.py"  # a path no earlier test parsed
    path.write_bytes((FIXTURES / "llama_like.py").read_bytes())
    parses: list[str] = []
    real = qualnames._parse
    monkeypatch.setattr(qualnames, "_parse", lambda p, size, *store: parses.append(p) or real(p, size, *store))
    resolver = Resolver()
    lines = range(1, 160)
    first = [resolver.qualname(str(path), line, "forward") for line in lines]
    for _ in range(299):
        assert [resolver.qualname(str(path), line, "forward") for line in lines] == first
    assert parses == [str(path)]


def test_index_source_accepts_str_and_bytes() -> None:
    for source in (
        "class A:\n    def f(self):\n        pass\n",
        b"class A:\n    def f(self):\n        pass\n",
    ):
        assert index_source(source).qualname(3, "f") == "A.f"


def test_deep_nesting_does_not_hit_the_recursion_limit(tmp_path: Path) -> None:
    depth = 60  # below the parser's own limit, above what a recursive walk of ast likes in a thread
    lines = []
    for i in range(depth):
        lines.append("    " * i + f"def f{i}():")
    lines.append("    " * depth + "return 1")
    path = tmp_path / "deep.py"
    path.write_text("\n".join(lines) + "\n")
    expected = ".<locals>.".join(f"f{i}" for i in range(depth))
    assert qualname(str(path), depth + 1, f"f{depth - 1}") == expected
