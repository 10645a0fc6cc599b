"""What the agent reads and keeps for a target is bounded, whatever the target makes (memory, not time).

These need no BPF: the code reader reads this test's own process through
/proc/self/mem, and the ELF reader a crafted file.
"""

from __future__ import annotations

import os
import struct
import sys
import tracemalloc
from pathlib import Path

import pytest

from gpuflame.agent.call_sites import DRIVER_FUNCTIONS
from gpuflame.agent.elf import MAX_SYMBOLS, read_elf
from gpuflame.agent.lru import LRU
from gpuflame.agent.py_offsets import OFFSETS
from gpuflame.agent.pyremote import CODE_CACHE_BYTES, CodeReader, Memory

MiB = 1 << 20
VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


def allocated_by(work) -> int:  # noqa: ANN001
    """Bytes still allocated by *work()* while its result lives (tracemalloc)."""
    tracemalloc.start()
    try:
        kept = work()
        current, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del kept
    return current


@pytest.mark.skipif(VERSION not in OFFSETS, reason=f"no offsets for Python {VERSION}")
def test_forged_code_objects_do_not_grow_the_cache():
    """800 code objects with 200 KiB line tables (one shared table here; read 800 times by the agent): the
    code cache keeps at most CODE_CACHE_BYTES of them."""
    table = bytes(200 << 10)
    codes = [compile("pass", f"/forged/{i}.py", "exec").replace(co_linetable=table) for i in range(800)]
    reader = CodeReader(Memory(os.getpid()), VERSION, OFFSETS[VERSION])

    def read_all() -> CodeReader:
        for code in codes:
            found = reader.code(id(code))
            assert found is not None and found.file == code.co_filename and len(found.linetable) == len(table)
        return reader

    kept = allocated_by(read_all)
    reader.memory.close()
    assert reader.cached_bytes <= CODE_CACHE_BYTES
    assert kept < CODE_CACHE_BYTES + 8 * MiB  # 160 MiB before the cache had a bound


def crafted_elf(path: Path, symbols: int, nul: bool = True) -> None:
    """An ELF file whose .dynsym holds *symbols* distinct names (a crafted ``libcuda.so.1``)."""
    names = b"".join(b"f%07d" % i + (b"\0" if nul else b"") for i in range(symbols))
    stride = 9 if nul else 8
    dynsym = bytes(24) + b"".join(
        struct.pack("<IBBHQQ", 1 + i * stride, 0x12, 0, 1, 0x1000 + i, 16) for i in range(symbols)
    )
    strtab = b"\0" + names
    shoff = 64 + len(dynsym) + len(strtab)
    header = (
        b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 56, 0, 64, 3, 0)
    )
    sections = [
        bytes(64),
        struct.pack("<IIQQQQIIQQ", 0, 11, 2, 0, 64, len(dynsym), 2, 1, 8, 24),
        struct.pack("<IIQQQQIIQQ", 0, 3, 2, 0, 64 + len(dynsym), len(strtab), 0, 0, 1, 0),
    ]
    path.write_bytes(header + dynsym + strtab + b"".join(sections))


@pytest.fixture(scope="module")
def crafted_libcuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("crafted") / "libcuda.so.1"
    crafted_elf(path, 700_000)  # 16 MB of symbols
    assert path.stat().st_size > 16 * MiB
    return path


def test_a_crafted_libcuda_keeps_only_the_driver_functions(crafted_libcuda):
    elf = allocated_by(lambda: read_elf(str(crafted_libcuda), full=False, wanted=DRIVER_FUNCTIONS).symbols)
    assert elf < MiB


def test_a_crafted_symbol_table_is_read_up_to_its_bound(crafted_libcuda):
    """Naming native frames reads every symbol: at most MAX_SYMBOLS of the 700,000."""
    found: dict = {}
    kept = allocated_by(lambda: found.update(read_elf(str(crafted_libcuda)).symbols))
    assert MAX_SYMBOLS - 1 <= len(found) <= MAX_SYMBOLS  # entry 0 is the null symbol
    assert kept < 200 * MAX_SYMBOLS  # 700,000 symbols (about 150 MB) before


def test_names_without_their_nul_are_not_read(tmp_path):
    """A string table without NULs: no name is taken (each lookup stops after MAX_NAME bytes, not at the end)."""
    crafted_elf(tmp_path / "libcuda.so.1", 1000, nul=False)
    assert read_elf(str(tmp_path / "libcuda.so.1")).symbols == {}


def test_lru_forgets_by_count_and_by_weight():
    cache: LRU[int, bytes] = LRU(3, budget=10, weigh=len)
    for i in range(5):
        cache[i] = b"x"
    assert len(cache) == 3 and 1 not in cache and cache.get(4) == b"x"
    cache[9] = bytes(9)
    assert cache.weight <= 10 and 9 in cache and len(cache) == 2


def test_stacks_beyond_the_limit_are_booked_under_one(start_target, agent_for):
    """A process making ever new stacks: the agent names only so many (here 3); the rest are booked under one
    synthetic stack, counted and said, and no byte is lost."""
    from tests.agent.agent_expected import replay, rows
    from tests.agent.agent_helpers import wait_for

    target = start_target("3.11")
    target.ready()
    agent = agent_for(target.pid)
    agent.max_stacks = 3
    target.run("basic")
    target.run("threads")
    want = sum(v[4] for v in replay(target.records).values())
    assert wait_for(lambda: agent.snapshot().totals()["alloc_space"] == want)
    profile = agent.snapshot()
    stacks = {key[2] for key in rows(profile)}
    assert len(stacks) <= 4 and (("<stacks beyond the agent's limit>", "", 0),) in stacks
    assert agent.stats()["stacks_over_limit"] > 0
    assert any("<stacks beyond the agent's limit>" in c for c in profile.comments)
