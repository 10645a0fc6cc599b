"""Text from a profile, a file or a server, made safe to print on a terminal.

A profile is untrusted input: a frame name, a file name, a comment or a label
can hold ESC sequences (clear the screen, set the window title, hide text), a
carriage return or a newline (a fake line), C1 controls (``\\x9b`` is CSI on
some terminals), bidi overrides (text that reads differently from what it
is), or a lone surrogate (a file name read with ``surrogateescape``, which
would make the write itself fail). :func:`printable` shows each of those as
its Python escape (``\\x1b``, ``\\u202e``): the reader sees that something
odd is there and which character it was, which U+FFFD would hide. Every other
character, accents, CJK and emoji included, is left as it is, and so are
backslashes (Windows paths stay readable; the escapes are for a human, not
to be parsed back).

Standard library only: the in-process side (``ship/``) prints server answers
through it too. One regular expression of one character class: linear time.
"""

from __future__ import annotations

import re

# C0 and DEL, C1, the Arabic letter mark, LRM/RLM, the bidi embeddings and overrides, the bidi isolates,
# the line and paragraph separators, and surrogates (never valid on their own)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
ELLIPSIS = "…"


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _SHORT.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(text: str, limit: int | None = None) -> str:
    """*text* with every control, bidi and separator character shown as its escape; at most *limit* characters of it.

    *limit* bounds an excerpt of something large (a server's answer): the
    first *limit* characters, escaped, then ``…`` when there was more.
    """
    cut = limit is not None and len(text) > limit
    if cut:
        text = text[:limit]
    shown = _UNSAFE.sub(_escape, text)
    return shown + ELLIPSIS if cut else shown


def encodable(text: str) -> str:
    """*text* as it can be written as UTF-8: each lone surrogate becomes U+FFFD (the rest is kept).

    A reader of JSON (``"\\ud800"``) or of a pickle can hand over a lone
    surrogate, which every writer's ``encode("utf-8")`` refuses; fixed where
    the text enters, once per distinct string.
    """
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)
