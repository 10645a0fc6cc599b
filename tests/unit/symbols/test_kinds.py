"""Which files are Python (symbols/kinds.py): string methods that answer what the documented pattern answers."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflame.symbols.kinds import PYTHON, guess_kind, python_file

# The rule as first written, a regular expression (``$`` also matches before a final newline)
RULE = re.compile(r"\.(py|pyw|pyx|ipynb)$|^<(frozen |string|stdin|ipython)")

pieces = st.sampled_from(
    [
        "",
        ".py",
        ".pyw",
        ".pyx",
        ".ipynb",
        ".pyc",
        "py",
        "\n",
        "<",
        "<frozen ",
        "<string>",
        "<stdin>",
        "<ipython-",
        "a/b",
    ]
)
files = st.lists(pieces | st.text(max_size=4), max_size=5).map("".join)


@settings(max_examples=200, deadline=None)
@given(files)
def test_python_file_is_the_rule(file):
    assert python_file(file) == (RULE.search(file) is not None)


@settings(max_examples=100, deadline=None)
@given(files, st.sampled_from(["forward", "<module>", "<cached free blocks>", "0x7f00aa00", "aten::mm"]))
def test_guess_kind_calls_a_python_file_python(file, name):
    if RULE.search(file):
        assert guess_kind(name, file) == PYTHON
    else:
        assert guess_kind(name, file) != PYTHON or name == "<module>" or (not file and name == "forward")
