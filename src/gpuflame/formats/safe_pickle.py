"""A pickle reader that accepts plain data only and never runs code.

PyTorch writes memory snapshots with ``pickle.dump`` of a dict built from
dicts, lists, tuples, strings, ints, floats, bools and None; nothing in a
snapshot needs a class. A pickle, though, can import and call anything, so a
snapshot from someone else is read here in two steps:

1. :func:`scan` walks the opcode stream once, without building anything. It
   rejects opcodes that construct objects or reach outside the data (BUILD,
   INST, OBJ, NEWOBJ, EXT, persistent ids, an import of anything but the few
   plain types below), reports truncation with a byte offset, and rejects memo
   indices larger than the pickle itself (CPython's unpickler sizes its memo
   table by the largest index, so a 20-byte pickle could otherwise ask for
   tens of GiB; indices below 10**6, a 16 MB memo at most, pass
   unchecked), and pickles that would build more lists and dicts than
   :data:`gpuflame.limits.PICKLE_CONTAINERS` (a byte each; 56 bytes or
   more each once built).
2. CPython's C unpickler builds the data, with :meth:`find_class` allowing
   only ``set``, ``frozenset``, ``bytes``, ``bytearray`` and
   ``_codecs.encode`` (how protocols 0-2 spell sets and bytes), each through a
   wrapper that accepts only plain arguments. Everything it could raise on a
   damaged pickle becomes :class:`ProfileFormatError`.

The C unpickler is iterative, so deeply nested lists cannot exhaust the
Python stack, and lengths are checked against the bytes present before
anything is allocated. Deeply nested tuples are the exception: CPython
hashes a tuple (a dict key) by recursing into it unguarded, so a key nested a
few hundred thousand tuples deep would crash the interpreter mid-load. A
pickle with few tuple opcodes cannot nest that deep; one with many (more than
any snapshot has) gets an exact, slower check of tuple nesting first, if it
is small enough for that check to stay quick
(:data:`gpuflame.limits.PICKLE_TUPLE_CHECK_BYTES`).
"""

from __future__ import annotations

import functools
import io
import pickle
import re
import sys
from collections.abc import Callable
from typing import NoReturn

from gpuflame import limits
from gpuflame.errors import ProfileFormatError, UnsafePickleError
from gpuflame.formats import pickle_nesting
from gpuflame.gcpause import gc_paused

PLAIN_DATA = "a memory snapshot contains only plain data (dicts, lists, strings, numbers)"


def loads(data: bytes) -> object:
    """Unpickle *data* if it is plain data; never imports or calls anything else."""
    scan(data)
    try:
        with gc_paused():
            return _PlainUnpickler(io.BytesIO(data)).load()
    except (UnsafePickleError, ProfileFormatError):
        raise
    except MemoryError:
        raise ProfileFormatError("the pickle is too large to load (out of memory)") from None
    except RecursionError:
        raise ProfileFormatError("the pickle is nested too deeply") from None
    except EOFError:
        raise ProfileFormatError("the pickle is truncated (the file was cut short)") from None
    except Exception as exc:  # any other failure of the C unpickler means damaged data
        raise ProfileFormatError(f"corrupt pickle ({_short(exc)})") from None


def _short(exc: BaseException) -> str:
    return one_line(str(exc) or type(exc).__name__, 120)


# -- allowed globals -----------------------------------------------------------


def _plain_set(items: object = ()) -> set[object]:
    if not isinstance(items, (list, tuple, set, frozenset)):
        _refuse("set")
    return set(items)


def _plain_frozenset(items: object = ()) -> frozenset[object]:
    if not isinstance(items, (list, tuple, set, frozenset)):
        _refuse("frozenset")
    return frozenset(items)


def _plain_bytes(value: object = b"") -> bytes:
    # bytes(10**12) would allocate a terabyte: only copies of bytes are allowed
    if not isinstance(value, (bytes, bytearray)):
        _refuse("bytes")
    return bytes(value)


def _plain_bytearray(value: object = b"") -> bytearray:
    if not isinstance(value, (bytes, bytearray)):
        _refuse("bytearray")
    return bytearray(value)


def _latin1_encode(text: object, encoding: object = "latin1") -> bytes:
    """How protocols 0-2 pickle ``bytes``: ``_codecs.encode(str, 'latin1')``."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        _refuse("_codecs.encode")
    return text.encode("latin1")


def _require(ok: bool, what: str) -> None:
    if not ok:
        _refuse(what)


def _refuse(what: str) -> NoReturn:
    raise ProfileFormatError(f"corrupt pickle ({what} called with arguments that are not plain data)")


_ALLOWED: dict[tuple[str, str], Callable[..., object]] = {}
for _module in ("builtins", "__builtin__"):
    _ALLOWED[(_module, "set")] = _plain_set
    _ALLOWED[(_module, "frozenset")] = _plain_frozenset
    _ALLOWED[(_module, "bytes")] = _plain_bytes
    _ALLOWED[(_module, "bytearray")] = _plain_bytearray
_ALLOWED[("_codecs", "encode")] = _latin1_encode


def refuse_import(module: str, name: str, purpose: str = "") -> NoReturn:
    raise UnsafePickleError(
        f"refusing to load: the pickle asks to import {one_line(module)}.{one_line(name)}{purpose} — {PLAIN_DATA}"
    )


def one_line(text: str, limit: int = 80) -> str:
    """A name taken from the pickle, safe for a one-line message: printable, at most *limit* characters."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_COPYREG = ("copy_reg", "copyreg")
_NEXT_GLOBAL = re.compile(rb"c([\w.]+)\n([\w.]+)\n")


def _built_class(data: bytes, pos: int) -> str:
    """Protocols 0-1 build an instance through copyreg; name the class it is given, for the message."""
    m = _NEXT_GLOBAL.search(data, pos, pos + 512)
    return f" (to build a {m[1].decode()}.{m[2].decode()})" if m else ""


class _PlainUnpickler(pickle.Unpickler):
    """The C unpickler, with imports limited to plain-data constructors."""

    def find_class(self, module: str, name: str) -> Callable[..., object]:
        allowed = _ALLOWED.get((module, name))
        if allowed is None:
            refuse_import(module, name)
        return allowed

    def persistent_load(self, pid: object) -> NoReturn:
        raise UnsafePickleError(
            f"refusing to load: the pickle refers to an external object ({_short(ValueError(repr(pid)))}) — "
            f"{PLAIN_DATA}"
        )


# -- the opcode scan -----------------------------------------------------------

# Runs of harmless opcodes are skipped in C by one regular expression; only
# long strings, memo indices that need checking and the opcodes to check reach
# the Python loop, so each of its iterations stands for 256 bytes or more (32
# until the pattern widens, below), or ends the scan (a refusal), or is
# counted (tuples). Possessive repetition
# keeps the regex from saving a backtrack point per opcode, which makes it
# several times faster on long runs. Before strings below 256 bytes, protocol
# 0's text arguments and memo puts went through the loop, a pickle of nothing
# but 3-byte strings took 0.4 s a MB (7 minutes for a gzip bomb's gigabyte).


def _short_sized(opcodes: bytes, width: int, longest: int) -> bytes:
    """One of *opcodes*, a little-endian length below *longest* in *width* bytes, then that many bytes."""
    pad = re.escape(b"\x00" * (width - 1))
    lengths = b"|".join(re.escape(bytes([k])) + pad + (rb".{%d}" % k if k else b"") for k in range(longest))
    return b"[" + re.escape(opcodes) + b"](?:" + lengths + b")"


# The fast path skips strings, bytes and LONG1/LONG4 integers shorter than
# NARROW bytes (checked only for their length); longer ones reach the loop.
# Real snapshots hold a few hundred of those (each distinct string is written
# once, then fetched from the memo), so the pattern every read compiles first
# is the narrow one: 2 ms to compile, where one taking up to 255 bytes in C
# takes 20 ms, a tenth of converting a small snapshot. A pickle that sends
# WIDEN_AFTER strings of NARROW to 255 bytes through the loop gets that wide
# pattern for the rest (a gigabyte of 40-byte strings would otherwise take
# minutes in the loop).
NARROW = 32
WIDE = 256
WIDEN_AFTER = 2000
# the GLOBALs find_class allows (protocols 0-2 spell sets and bytes so)
_ALLOWED_GLOBALS = rb"c(?:builtins|__builtin__)\n(?:set|frozenset|bytes|bytearray)\n|c_codecs\nencode\n"
# (Python 3.10 has no possessive repetition: runs are capped there instead, so
# the saved backtrack points stay few.)
_RUN = rb"*+" if sys.version_info >= (3, 11) else rb"{0,4096}"
# a protocol-0 text argument (a line); on 3.10 a longer one than the cap reaches the loop
_TEXT_ARGUMENTS = rb"[ILSVFg][^\n]" + _RUN + rb"\n"


@functools.lru_cache(maxsize=8)
def _fast_path(put_digits: int, binput_bytes: int, longest: int) -> re.Pattern[bytes]:
    """The fast path for a pickle in which any PUT of *put_digits* digits and any LONG_BINPUT
    whose index fits in *binput_bytes* bytes is within the memo the pickle's size allows,
    skipping sized arguments shorter than *longest* bytes.

    Compiled on first use, never at import: its length alternatives take milliseconds
    to compile (tens for the wide one), which every command importing a reader would pay."""
    puts = rb"p[0-9]{1,%d}\n|r.{%d}%s" % (put_digits, binput_bytes, re.escape(b"\x00" * (4 - binput_bytes)))
    sized = b"|".join(
        (
            _short_sized(b"\x8cCU\x8a", 1, longest),
            _short_sized(b"XBT\x8b", 4, longest),
            _short_sized(b"\x8d\x8e\x96", 8, longest),
        )
    )
    # sre tries the alternatives in order, so the commonest opcodes of real
    # snapshots come first: memo fetches (LONG_BINGET, BINGET: over half of
    # them), one-byte opcodes, small ints, short strings and LONG1
    return re.compile(
        rb"(?:j....|h.|[\x94\x88\x89N\)\]\}\(eusal0d12\x8f\x90R\x93]|[qK\x80].|"
        + sized
        + rb"|M..|J....|G.{8}|\x95.{8}|"
        + b"|".join((_TEXT_ARGUMENTS, _ALLOWED_GLOBALS, puts))
        + rb")"
        + _RUN,
        re.S,
    )


def fast_path_for(n: int, wide: bool = False) -> re.Pattern[bytes]:
    """The fast path for a pickle of *n* bytes: memo indices below 10**6 and 2**16 always (the memo
    they ask for stays small), larger ones when the pickle is larger than any index they can spell;
    sized arguments below NARROW bytes, or below WIDE (256) when *wide*."""
    put_digits = max(6, len(str(n)) - 1)
    binput_bytes = 4 if n >= 1 << 32 else 3 if n >= 1 << 24 else 2
    return _fast_path(put_digits, binput_bytes, WIDE if wide else NARROW)


# opcode -> width of its length prefix, for length-prefixed arguments
_SIZED = {
    0x8C: 1,  # SHORT_BINUNICODE
    0x43: 1,  # SHORT_BINBYTES
    0x55: 1,  # SHORT_BINSTRING
    0x8A: 1,  # LONG1
    0x58: 4,  # BINUNICODE
    0x42: 4,  # BINBYTES
    0x54: 4,  # BINSTRING
    0x8B: 4,  # LONG4
    0x8D: 8,  # BINUNICODE8
    0x8E: 8,  # BINBYTES8
    0x96: 8,  # BYTEARRAY8
}
# fixed-size opcodes the fast path skips (width of their argument): the loop
# sees one only when a run was cut short (truncated data) or capped (3.10)
_FIXED = {op: 0 for op in b"\x94\x88\x89N)]}(eusal0d12\x8f\x90R"}
_FIXED.update({ord("h"): 1, ord("q"): 1, ord("K"): 1, 0x80: 1, ord("M"): 2, ord("J"): 4, ord("j"): 4})
_FIXED.update({ord("G"): 8, 0x95: 8})
# opcodes with one newline-terminated text argument (protocol 0)
_LINE = frozenset(b"ILSVFg")
# opcodes that build objects or reach outside the data: never in a snapshot
_CONSTRUCTORS = {
    ord("b"): "BUILD",
    ord("o"): "OBJ",
    0x81: "NEWOBJ",
    0x92: "NEWOBJ_EX",
    0x82: "EXT1",
    0x83: "EXT2",
    0x84: "EXT4",
    ord("P"): "PERSID",
    ord("Q"): "BINPERSID",
    ord("i"): "INST",
}
_BUFFERS = frozenset((0x97, 0x98))  # NEXT_BUFFER, READONLY_BUFFER: out-of-band data

# TUPLE, TUPLE1-3, FROZENSET: the hashable containers. CPython hashes a tuple
# by recursing into it with no depth guard, so a dict key nested a few hundred
# thousand tuples deep crashes the interpreter while it unpickles. A pickle
# with few such opcodes cannot nest deeply; one with many is checked exactly.
_HASHABLE_BUILDERS = frozenset((ord("t"), 0x85, 0x86, 0x87, 0x91))
HASHABLE_OPCODES_UNCHECKED = 10_000
MAX_HASHABLE_DEPTH = 100


class _Scan:
    """State of one walk over the opcodes; see :func:`scan`."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.n = len(data)

    def truncated(self, pos: int) -> NoReturn:
        raise ProfileFormatError(f"the pickle is truncated at byte {pos} of {self.n} (the file was cut short)")

    def sized(self, pos: int, op: int, width: int) -> int:
        """Skip a length-prefixed argument; return the position after it."""
        start = pos + 1 + width
        if start > self.n:
            self.truncated(self.n)
        size = int.from_bytes(self.data[pos + 1 : start], "little", signed=width == 4)
        if size < 0:
            raise ProfileFormatError(f"corrupt pickle (negative length at byte {pos})")
        end = start + size
        if end > self.n:
            self.truncated(self.n)
        return end

    def line(self, pos: int) -> tuple[bytes, int]:
        end = self.data.find(b"\n", pos)
        if end < 0:
            self.truncated(self.n)
        return self.data[pos:end], end + 1

    def memo_index(self, index: int, pos: int) -> None:
        # a real pickle numbers its memo entries in order, so no index can
        # exceed the number of opcodes, let alone the number of bytes
        if index > self.n:
            raise ProfileFormatError(f"corrupt pickle (memo index {index} at byte {pos} is out of range)")

    def global_name(self, pos: int) -> tuple[str, str, int]:
        module, pos = self.line(pos)
        name, pos = self.line(pos)
        return module.decode("utf-8", "replace"), name.decode("utf-8", "replace"), pos

    def refuse_constructor(self, op: int, pos: int) -> NoReturn:
        what = _CONSTRUCTORS[op]
        if op == ord("i"):
            module, name, _ = self.global_name(pos + 1)
            refuse_import(module, name)
        if what.startswith("EXT"):
            detail = f"a class registered with copyreg (opcode {what})"
        elif what.endswith("PERSID"):
            detail = "an external object (persistent id)"
        elif (named := _last_stack_global(self.data, pos)) is not None:
            detail = f"an object of {one_line(named[0])}.{one_line(named[1])} (opcode {what})"
        else:
            detail = f"an object (opcode {what})"
        raise UnsafePickleError(f"refusing to load: the pickle asks to construct {detail} — {PLAIN_DATA}")


_NAMING_BYTES = 1 << 20  # how far into a refused pickle its class is looked for (Python per opcode)


def _last_stack_global(data: bytes, pos: int) -> tuple[str, str] | None:
    """The module and name the last STACK_GLOBAL before *pos* imports, for a refusal's message.

    Only on the refusal path, and only in the first MB: the scan's fast path
    skips strings, so they are read again here, opcode by opcode.
    """
    if pos > _NAMING_BYTES:
        return None
    import pickletools  # here: only a refusal reads the opcodes again (every read would pay for the import)

    strings: list[str] = []
    found = None
    try:
        for opcode, arg, _ in pickletools.genops(data[:pos]):
            if isinstance(arg, str) and opcode.name.endswith("UNICODE"):
                strings = [*strings[-1:], arg]
            elif opcode.name == "STACK_GLOBAL" and len(strings) == 2:
                found = (strings[0], strings[1])
    except Exception:  # the prefix ends without STOP, or is damaged: what was found stands
        pass
    return found


def scan(data: bytes) -> None:
    """Walk the opcodes of *data* without building anything; raise if unsafe or damaged."""
    if not data:
        raise ProfileFormatError("the pickle is empty")
    check_containers(data)
    s = _Scan(data)
    n = s.n
    pos = 0
    hashables = 0
    # past this many tuples in a pickle too large to check them, the scan stops at once
    tuples_refused_at = HASHABLE_OPCODES_UNCHECKED + 1 if n > limits.PICKLE_TUPLE_CHECK_BYTES.value() else -1
    match = fast_path_for(n).match
    narrow_left = WIDEN_AFTER  # sized arguments the wide pattern would have skipped, until it is compiled
    while True:
        pos = match(data, pos).end()  # type: ignore[union-attr]  # the fast path also matches nothing: never None
        if pos >= n:
            s.truncated(n)
        op = data[pos]
        width = _SIZED.get(op)
        if width is not None:
            start = pos
            pos = s.sized(pos, op, width)
            if pos - start <= WIDE + width:  # shorter than WIDE: the wide pattern skips it
                narrow_left -= 1
                if not narrow_left:
                    match = fast_path_for(n, wide=True).match
        elif op in _HASHABLE_BUILDERS:
            hashables += 1
            pos += 1
            if hashables == tuples_refused_at:
                _refuse_tuples(hashables)
        elif op == 0x2E:  # STOP
            if hashables > HASHABLE_OPCODES_UNCHECKED:
                check_nesting(data)
            return
        elif op in _LINE:
            pos = s.line(pos + 1)[1]
        elif op == ord("p"):  # PUT
            text, pos = s.line(pos + 1)
            s.memo_index(_decimal(text, pos), pos)
        elif op == ord("r"):  # LONG_BINPUT
            if pos + 5 > n:
                s.truncated(n)
            s.memo_index(int.from_bytes(data[pos + 1 : pos + 5], "little"), pos)
            pos += 5
        elif op == ord("c"):  # GLOBAL: the name is right here
            module, name, pos = s.global_name(pos + 1)
            if (module, name) not in _ALLOWED:
                refuse_import(module, name, _built_class(data, pos) if module in _COPYREG else "")
        elif op == 0x93:  # STACK_GLOBAL: checked by find_class when loading
            pos += 1
        elif op in _CONSTRUCTORS:
            s.refuse_constructor(op, pos)
        elif op in _FIXED:
            pos += 1 + _FIXED[op]
            if pos > n:
                s.truncated(n)
        elif op in _BUFFERS:
            raise UnsafePickleError(f"refusing to load: the pickle refers to out-of-band buffers — {PLAIN_DATA}")
        else:
            raise ProfileFormatError(f"corrupt pickle (unknown opcode 0x{op:02x} at byte {pos})")


# EMPTY_LIST, EMPTY_DICT, EMPTY_SET and MARK (protocols 0-1 build lists and
# dicts after one): one byte of pickle, a 56-byte object or more in memory
_CONTAINER_BYTES = b"]}\x8f("


def check_containers(data: bytes) -> None:
    """Refuse a pickle that would build more containers than :data:`limits.PICKLE_CONTAINERS`.

    Counted as bytes (string contents included, so it over-counts) by one
    C pass, and only when the pickle is longer than the limit: a shorter one
    cannot hold that many. Real snapshots have one per 25-60 bytes.
    """
    cap = limits.PICKLE_CONTAINERS.value()
    if len(data) > cap and len(data) - len(data.translate(None, _CONTAINER_BYTES)) > cap:
        raise limits.PICKLE_CONTAINERS.exceeded("the number of lists and dicts in the pickle")


def _refuse_tuples(count: int) -> NoReturn:
    raise limits.PICKLE_TUPLE_CHECK_BYTES.exceeded(
        f"a pickle with more than {count:,} tuples (a snapshot has a few dozen) must be checked for "
        "deep nesting opcode by opcode; its size"
    )


def check_nesting(data: bytes) -> None:
    """Refuse tuples nested deeper than :data:`MAX_HASHABLE_DEPTH` (:mod:`pickle_nesting` walks the opcodes)."""
    try:
        pickle_nesting.check(data, MAX_HASHABLE_DEPTH)
    except (ValueError, IndexError, KeyError) as exc:
        raise ProfileFormatError(f"corrupt pickle ({_short(exc)})") from None


def _decimal(text: bytes, pos: int) -> int:
    try:
        return int(text)
    except ValueError:
        raise ProfileFormatError(f"corrupt pickle (bad number before byte {pos})") from None
