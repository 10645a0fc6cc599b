"""malloc_reuse: while a one-shot command works, glibc maps no block of its own and keeps freed ones for reuse.

Asked of glibc itself: ``mallinfo2().hblks`` counts the blocks malloc has
mapped from the kernel. A 64 MiB block is mapped by default, and is not
while the reuse is on. Skipped where the C library is not glibc.

Each check runs in a fresh interpreter: a test run earlier in the same
worker can leave a free chunk of 64 MiB or more inside the heap, and glibc
serves the next 64 MiB from it without mapping anything, whatever the
settings (a fresh-clone CI failed so).
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflame import malloc_reuse
from gpuflame.formats import save
from gpuflame.model import Frame, Profile
from gpuflame.model.profile import SampleType


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    ]


def _libc() -> ctypes.CDLL | None:
    libc = ctypes.CDLL(None)
    try:
        libc.mallinfo2.restype = MallInfo2
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
    except AttributeError:
        return None
    return libc


LIBC = _libc()
GLIBC_ONLY = pytest.mark.skipif(LIBC is None, reason="the C library is not glibc (no mallinfo2)")
BIG = 64 << 20


def mapped_by_malloc() -> bool:
    """Whether malloc maps a new 64 MiB block from the kernel (else it comes from the heap)."""
    assert LIBC is not None
    before = LIBC.mallinfo2().hblks
    block = LIBC.malloc(BIG)
    assert block
    try:
        return LIBC.mallinfo2().hblks > before
    finally:
        LIBC.free(block)


@pytest.fixture(autouse=True)
def defaults_after() -> Iterator[None]:
    yield
    malloc_reuse.release_freed_memory()


def in_fresh_interpreter(body: str, tmp_path: Path) -> None:
    """Run ``body`` (which asserts with this module's helpers) in a new Python, whose heap no other test touched."""
    script = tmp_path / "check.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_malloc_reuse import malloc_reuse, mapped_by_malloc\n"
        "from gpuflame.cli.common import load_profile\nfrom gpuflame.cli.main import main\n" + textwrap.dedent(body)
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@GLIBC_ONLY
@pytest.mark.subprocess
def test_reuse_keeps_blocks_in_the_heap_and_release_gives_the_defaults_back(tmp_path: Path) -> None:
    in_fresh_interpreter(
        """
        assert mapped_by_malloc()  # glibc's default
        malloc_reuse.reuse_freed_memory()
        assert not mapped_by_malloc()
        malloc_reuse.release_freed_memory()
        assert mapped_by_malloc()
        """,
        tmp_path,
    )


@GLIBC_ONLY
@pytest.mark.subprocess
def test_a_command_reading_a_profile_turns_it_on_and_main_turns_it_off(tmp_path: Path) -> None:
    profile = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    profile.add([Frame("leaf", "a.py", 3)], [4096])
    save(profile, tmp_path / "p.pb.gz")
    in_fresh_interpreter(
        f"""
        load_profile([{str(tmp_path / "p.pb.gz")!r}])
        assert not mapped_by_malloc()  # what one-shot commands read through
        assert main(["report", {str(tmp_path / "p.pb.gz")!r}]) == 0
        assert mapped_by_malloc()  # the command returned: the defaults again
        """,
        tmp_path,
    )


def test_a_c_library_other_than_glibc_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """musl has a ``mallopt`` that does nothing and no ``malloc_trim``: neither call touches it or fails."""
    calls = []

    class Musl:
        def mallopt(self, *args: int) -> int:
            calls.append(args)
            return 0

    monkeypatch.setattr(malloc_reuse.ctypes, "CDLL", lambda _name: Musl())
    malloc_reuse.reuse_freed_memory()
    malloc_reuse.release_freed_memory()
    assert calls == []
