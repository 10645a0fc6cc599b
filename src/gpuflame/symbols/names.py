"""Frame names per the seed's table, and search that accepts both spellings.

| label                     | meaning                                   |
| ------------------------- | ----------------------------------------- |
| ``Foo > bar``             | method ``bar`` of class ``Foo``           |
| ``Foo > __init__``        | constructor of ``Foo``                    |
| ``bar``                   | module-level function ``bar``             |
| ``<module>``              | a script's or module's top level          |
| ``<interpreter trampoline>`` | CPython's own dispatch, ignorable      |
| ``0x7f151…``              | native code with no symbol                |
"""

from __future__ import annotations

import re

SEPARATOR = " > "
MODULE = "<module>"
TRAMPOLINE = "<interpreter trampoline>"
CACHED_FREE = "<cached free blocks>"
OUTSIDE_FRAMEWORK = "<outside framework>"
UNKNOWN = "<unknown>"

_LOCALS = ".<locals>."


def display_name(qualname: str) -> str:
    """``LlamaMLP.forward`` -> ``LlamaMLP > forward``.

    Functions defined inside functions keep their enclosing function as the
    owner (``outer.<locals>.inner`` -> ``outer > inner``), since that is how a
    reader finds them in the source. Names in angle brackets (``<module>``,
    ``<lambda>``, ``<listcomp>``) keep their dots.
    """
    if not qualname or "." not in qualname:
        return qualname
    parts = [p for p in qualname.replace(_LOCALS, ".").split(".") if p]
    return SEPARATOR.join(parts) if parts else qualname


def native_address_name(address: int) -> str:
    """A native frame with no symbol is shown as its raw address, like the seed."""
    return f"0x{address:x}"


_SPACES_AROUND_GT = re.compile(r"\s*>\s*")


def normalize(name: str) -> str:
    """One spelling for search: ``Foo > bar``, ``Foo>bar`` and ``Foo.bar`` all become ``foo.bar``."""
    return _SPACES_AROUND_GT.sub(".", name.strip()).casefold()


def matches(name: str, query: str) -> bool:
    """Substring search on normalized names, so ``Foo.bar`` finds ``Foo > bar``."""
    return normalize(query) in normalize(name)


def matches_exactly(name: str, query: str) -> bool:
    """Whole-name match, either spelling; or the last part (``bar`` finds ``Foo > bar``)."""
    n, q = normalize(name), normalize(query)
    return n == q or n.endswith("." + q)


def compile_query(query: str) -> re.Pattern[str]:
    """A regular expression over normalized names; plain text is matched literally.

    Users type ``LlamaMLP.forward`` far more often than regexes, so a query is
    taken as a regex only when it compiles and contains regex syntax other than
    the dot.
    """
    q = normalize(query)
    if re.search(r"[\\^$*+?{}\[\]|()]", q):
        try:
            return re.compile(q)
        except re.error:
            pass
    return re.compile(re.escape(q))
