"""The raw control, C1 and bidi characters no command may print from an untrusted profile."""

from __future__ import annotations

import re

# Everything a terminal may act on, except the newline between lines: C0, DEL, C1, bidi controls, line separators.
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
