"""Lengths of x86-64 instructions: enough to tell whether an address is an instruction boundary.

A return-site uprobe is a breakpoint written over the first byte of an
instruction in every process that maps the file; placed inside an
instruction (an immediate that happens to read ``ff d0``) it would change
what other programs compute. So the agent decodes from a function's start
to the return address and accepts it only if an instruction ends exactly
there. Only lengths are decoded (prefixes, REX, VEX/EVEX, ModRM, SIB,
displacement, immediate); an opcode not known here ends the decoding, and
the site is not probed.
"""

from __future__ import annotations

MAX_LENGTH = 15
_PREFIXES = frozenset(b"\x26\x2e\x36\x3e\x64\x65\x66\x67\xf0\xf2\xf3")


def _bits(*spans: tuple[int, int]) -> frozenset[int]:
    return frozenset(b for lo, hi in spans for b in range(lo, hi + 1))


# one-byte opcodes that take a ModRM byte
_MODRM_1 = _bits(
    (0x00, 0x03),
    (0x08, 0x0B),
    (0x10, 0x13),
    (0x18, 0x1B),
    (0x20, 0x23),
    (0x28, 0x2B),
    (0x30, 0x33),
    (0x38, 0x3B),
    (0x63, 0x63),
    (0x69, 0x69),
    (0x6B, 0x6B),
    (0x80, 0x8F),
    (0xC0, 0xC1),
    (0xC6, 0xC7),
    (0xD0, 0xD3),
    (0xD8, 0xDF),
    (0xF6, 0xF7),
    (0xFE, 0xFF),
)
_IMM8_1 = _bits(
    (0x04, 0x04),
    (0x0C, 0x0C),
    (0x14, 0x14),
    (0x1C, 0x1C),
    (0x24, 0x24),
    (0x2C, 0x2C),
    (0x34, 0x34),
    (0x3C, 0x3C),
    (0x6A, 0x6A),
    (0x6B, 0x6B),
    (0x70, 0x7F),
    (0x80, 0x80),
    (0x83, 0x83),
    (0xA8, 0xA8),
    (0xB0, 0xB7),
    (0xC0, 0xC1),
    (0xC6, 0xC6),
    (0xCD, 0xCD),
    (0xE0, 0xE7),
    (0xEB, 0xEB),
)
_IMMZ_1 = _bits(
    (0x05, 0x05),
    (0x0D, 0x0D),
    (0x15, 0x15),
    (0x1D, 0x1D),
    (0x25, 0x25),
    (0x2D, 0x2D),
    (0x35, 0x35),
    (0x3D, 0x3D),
    (0x68, 0x69),
    (0x81, 0x81),
    (0xA9, 0xA9),
    (0xC7, 0xC7),
)
# not valid in 64-bit mode (or not decoded here): the decoding stops
_INVALID_1 = frozenset(b"\x06\x07\x0e\x16\x17\x1e\x1f\x27\x2f\x37\x3f\x60\x61\x82\x9a\xce\xd4\xd5\xd6\xea")
# two-byte (0f xx) opcodes without a ModRM byte
_NO_MODRM_2 = frozenset(
    b"\x05\x06\x07\x08\x09\x0b\x0e\x30\x31\x32\x33\x34\x35\x37\x77\xa0\xa1\xa2\xa8\xa9\xaa"
) | _bits((0x80, 0x8F), (0xC8, 0xCF))
_IMM8_2 = frozenset(b"\x70\x71\x72\x73\xa4\xac\xba\xc2\xc4\xc5\xc6\x0f")


def length(code: bytes, pos: int) -> int | None:
    """The length of the instruction at *pos*, or None (unknown, invalid, or cut off)."""
    start, rex_w, opsize, addr32 = pos, False, False, False
    while pos < len(code) and code[pos] in _PREFIXES:
        opsize |= code[pos] == 0x66
        addr32 |= code[pos] == 0x67
        pos += 1
    if pos < len(code) and 0x40 <= code[pos] <= 0x4F:
        rex_w = bool(code[pos] & 8)
        pos += 1
    if pos >= len(code):
        return None
    op = code[pos]
    if op in (0xC4, 0xC5, 0x62):
        end = _vex(code, pos)
    elif op == 0x0F:
        end = _two_byte(code, pos + 1)
    elif op in _INVALID_1:
        return None
    else:
        end = _one_byte(code, pos, rex_w, opsize, addr32)
    if end is None or end - start > MAX_LENGTH or end > len(code):
        return None
    return end - start


def _one_byte(code: bytes, pos: int, rex_w: bool, opsize: bool, addr32: bool) -> int | None:
    op, pos = code[pos], pos + 1
    immz = 2 if opsize else 4
    imm = 1 if op in _IMM8_1 else immz if op in _IMMZ_1 else 0
    if op in (0xE8, 0xE9):
        imm = 4
    elif 0xB8 <= op <= 0xBF:
        imm = 8 if rex_w else immz
    elif 0xA0 <= op <= 0xA3:
        imm = 4 if addr32 else 8
    elif op in (0xC2, 0xCA):
        imm = 2
    elif op == 0xC8:
        imm = 3
    if op in _MODRM_1:
        if pos >= len(code):
            return None
        if op in (0xF6, 0xF7) and (code[pos] >> 3) & 7 in (0, 1):  # test r/m, imm
            imm = 1 if op == 0xF6 else immz
        end = _modrm(code, pos)
        return None if end is None else end + imm
    return pos + imm


def _two_byte(code: bytes, pos: int) -> int | None:
    if pos >= len(code):
        return None
    op, pos = code[pos], pos + 1
    if op == 0x38:
        return _modrm(code, pos + 1)
    if op == 0x3A:
        end = _modrm(code, pos + 1)
        return None if end is None else end + 1
    if op in _NO_MODRM_2:
        return pos + (4 if 0x80 <= op <= 0x8F else 0)
    end = _modrm(code, pos)
    return None if end is None else end + (1 if op in _IMM8_2 else 0)


def _vex(code: bytes, pos: int) -> int | None:
    """VEX (c4, c5) and EVEX (62): the map says which opcodes take an imm8; all but vzero* take a ModRM."""
    first = code[pos]
    if first == 0xC5:
        vmap, pos = 1, pos + 2
    elif first == 0xC4:
        if pos + 1 >= len(code):
            return None
        vmap, pos = code[pos + 1] & 0x1F, pos + 3
    else:
        if pos + 1 >= len(code):
            return None
        vmap, pos = code[pos + 1] & 0x07, pos + 4
    if pos >= len(code) or vmap not in (1, 2, 3, 5, 6):
        return None
    op, pos = code[pos], pos + 1
    if vmap == 1 and op == 0x77 and first != 0x62:  # vzeroupper, vzeroall
        return pos
    end = _modrm(code, pos)
    if end is None:
        return None
    return end + (1 if vmap == 3 or (vmap == 1 and op in _IMM8_2) else 0)


def _modrm(code: bytes, pos: int) -> int | None:
    """The end of a ModRM byte with its SIB and displacement."""
    if pos >= len(code):
        return None
    modrm, pos = code[pos], pos + 1
    mod, rm = modrm >> 6, modrm & 7
    if mod == 3:
        return pos
    if rm == 4:
        if pos >= len(code):
            return None
        base, pos = code[pos] & 7, pos + 1
        if mod == 0 and base == 5:
            return pos + 4
    elif mod == 0 and rm == 5:  # rip-relative
        return pos + 4
    return pos + (1 if mod == 1 else 4 if mod == 2 else 0)


def call_at(code: bytes, pos: int, size: int) -> str | None:
    """``direct`` (``e8 rel32``) or ``indirect`` (``ff /2``) if the instruction at *pos* is a near call."""
    end = pos + size
    while pos < end and code[pos] in _PREFIXES:
        pos += 1
    if pos < end and 0x40 <= code[pos] <= 0x4F:
        pos += 1
    if pos < end and code[pos] == 0xE8 and end - pos == 5:
        return "direct"
    if pos + 1 < end and code[pos] == 0xFF and (code[pos + 1] >> 3) & 7 == 2:
        return "indirect"
    return None
