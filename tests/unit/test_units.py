"""Byte counts read the same in the terminal as in the viewer.

The expected strings are what the viewer's ``formatBytes`` (JavaScript's
``toFixed``, a tie rounded up) printed for the same numbers under Node 20;
Python's own format rounds a tie to even, so 4.125 MiB read "4.12 MiB" in
the report and "4.13 MiB" in the flame graph beside it.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflame.units import _fixed, format_bytes

AS_THE_VIEWER_SHOWS = {
    4_325_376: "4.13 MiB",  # 4.125 MiB: a tie
    10_747_904: "10.3 MiB",  # 10.25 MiB: a tie at one decimal
    1029.12: "1.00 KiB",  # 1.00499...: below the tie in binary, as in JavaScript
    1536: "1.50 KiB",
    2_872_259_379.2: "2.67 GiB",
    1023: "1023 B",
    104_805_171.2: "100.0 MiB",
    1_052_680: "1.00 MiB",
}


@pytest.mark.parametrize(("n", "shown"), AS_THE_VIEWER_SHOWS.items())
def test_format_bytes_rounds_as_the_viewer(n, shown):
    assert format_bytes(n) == shown
    assert format_bytes(-n) == "-" + shown
    assert format_bytes(n, signed=True) == "+" + shown


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=0, max_value=1024, allow_nan=False), st.sampled_from([1, 2]))
def test_a_tie_is_rounded_up_on_the_floats_exact_value(value: float, digits: int) -> None:
    """Decimal's half-up rounding of the exact binary value is the oracle (the reader imports no decimal)."""
    exact = Decimal(value).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    assert _fixed(value, digits) == str(exact)
