"""The x86-64 length decoder that return sites are verified with, against objdump on real libraries.

Every instruction boundary objdump finds in a function must be one the decoder
finds (decoding from the function's start), or a return site could be refused
(harmless) or, worse, a site inside an instruction accepted.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from gpuflame.agent import x86


def mapped_library(name: str) -> str | None:
    """A library this process maps (libc, libpython or the interpreter): real compiler output."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split(None, 5)[-1].strip()
            if re.search(name, path):
                return path
    return None


def text_of(path: str) -> tuple[int, bytes]:
    sections = subprocess.run(["readelf", "-SW", path], capture_output=True, text=True, check=True).stdout
    m = re.search(r"\.text\s+PROGBITS\s+([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)", sections)
    assert m, sections
    vaddr, offset, size = (int(x, 16) for x in m.groups())
    with open(path, "rb") as f:
        f.seek(offset)
        return vaddr, f.read(size)


@pytest.mark.skipif(shutil.which("objdump") is None or shutil.which("readelf") is None, reason="no binutils")
@pytest.mark.parametrize("library", [r"/libc\.so", r"/libffi\.so|/_ctypes"])
def test_lengths_match_objdump(library):
    path = mapped_library(library)
    if path is None:
        import ctypes  # noqa: F401 - maps libffi

        path = mapped_library(library)
    if path is None:
        pytest.skip(f"no library matching {library} mapped here")
    vaddr, code = text_of(path)
    listing = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", "-j", ".text", path], capture_output=True, text=True, check=True
    ).stdout
    starts = [int(a, 16) for a in re.findall(r"^\s+([0-9a-f]+):\s+\S", listing, re.M)]
    assert len(starts) > 1000
    wrong = [hex(a) for a, b in zip(starts, starts[1:], strict=False) if x86.length(code, a - vaddr) != b - a]
    # objdump lists inter-function padding its own way (a few bytes of zeros after a jump): allow a handful
    assert len(wrong) <= len(starts) // 10_000, wrong[:10]


@pytest.mark.parametrize(
    ("code", "size", "call"),
    [
        (b"\xe8\x00\x00\x00\x00", 5, "direct"),
        (b"\x41\xff\xd3", 3, "indirect"),  # call *%r11 (libffi)
        (b"\xff\x15\x00\x10\x00\x00", 6, "indirect"),  # call *slot(%rip) (-fno-plt)
        (b"\xff\x54\x24\x08", 4, "indirect"),  # call *8(%rsp)
        (b"\xb8\xff\xd0\x90\x90", 5, None),  # mov $0x9090d0ff, %eax: holds ff d0 but is no call
        (b"\xc5\xf8\x77", 3, None),  # vzeroupper (VEX without ModRM)
        (b"\x62\xf1\x7c\x48\x10\x44\x24\x01", 8, None),  # vmovups 0x40(%rsp), %zmm0 (EVEX, compressed disp8)
        (b"\xf3\x0f\x1e\xfa", 4, None),  # endbr64
        (b"\x48\xb8" + bytes(8), 10, None),  # movabs $imm64, %rax
    ],
)
def test_one_instruction(code, size, call):
    assert x86.length(code, 0) == size
    assert x86.call_at(code, 0, size) == call


def test_cut_off_or_unknown_is_none():
    assert x86.length(b"\xe8\x00\x00", 0) is None
    assert x86.length(b"\x06", 0) is None  # push %es: not in 64-bit mode
