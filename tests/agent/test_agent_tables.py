"""The agent's tables and decoders, without BPF: CPython offsets and line tables per version,
the constants shared with the BPF side, the ledger's peak, ELF symbols."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuflame.agent import events
from gpuflame.agent.build import BPF_DIR
from gpuflame.agent.elf import read_elf
from gpuflame.agent.ledger import HANDLE, Ledger
from gpuflame.agent.py_offsets import DEBUG_POSITIONS, OFFSETS
from gpuflame.agent.pyremote import line_for
from tests.agent.agent_helpers import VERSIONS, cuda_include, python_for

SOURCE = Path(__file__).resolve().parents[2] / "src" / "gpuflame" / "agent" / "py_offsets.c"


def include_dir(version: str) -> Path | None:
    python = python_for(version)
    if python is None:
        return None
    out = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"], capture_output=True, text=True
    )
    path = Path(out.stdout.strip())
    return path if (path / "internal" / "pycore_frame.h").exists() or version == "3.10" else None


@pytest.mark.parametrize("version", VERSIONS)
def test_offsets_match_each_versions_own_headers(version, tmp_path):
    """py_offsets.py is what py_offsets.c prints when built against that version's internal headers."""
    include = include_dir(version)
    if include is None or not (include / "internal").is_dir():
        pytest.skip(f"no headers of Python {version} here")
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    exe = tmp_path / "offsets"
    # the folder above: a Debian-style layout keeps pyconfig.h under <multiarch>/pythonX.Y there
    subprocess.run(
        ["gcc", f"-I{include}", f"-I{include / 'internal'}", f"-I{include.parent}", str(SOURCE), "-o", str(exe)],
        check=True,
    )
    printed = json.loads(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)
    assert printed.pop("version") == version
    assert DEBUG_POSITIONS.get(version) == printed.pop("debug", None)
    assert OFFSETS[version] == printed


LINES_SCRIPT = r"""
import json, sys, types
out = []
def walk(code):
    table = list(code.co_lines())
    out.append([code.co_linetable.hex(), code.co_firstlineno, table])
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            walk(c)
import argparse, json as j, threading, ast
for mod in (argparse, threading, ast, j.decoder):
    src = open(mod.__file__).read()
    walk(compile(src, mod.__file__, "exec"))
print(json.dumps(out))
"""


@pytest.mark.parametrize("version", VERSIONS)
def test_line_tables_read_as_the_interpreter_reads_them(version):
    """Every instruction of several stdlib modules: line_for == the interpreter's own co_lines()."""
    python = python_for(version)
    if python is None:
        pytest.skip(f"no Python {version} here")
    codes = json.loads(subprocess.run([python, "-c", LINES_SCRIPT], capture_output=True, text=True, check=True).stdout)
    checked = 0
    for table_hex, first, ranges in codes:
        table = bytes.fromhex(table_hex)
        for start, end, line in ranges:
            for lasti in range(start, end, 2):
                assert line_for(table, first, lasti, version) == line, (version, first, lasti)
                checked += 1
    assert checked > 10_000


def test_constants_match_agent_h():
    """events.py mirrors bpf/agent.h: every #define with a number there has the same value here."""
    defines = dict(re.findall(r"^#define (\w+) (-?\d+)\b", (BPF_DIR / "agent.h").read_text(), re.M))
    shared = {k: int(v) for k, v in defines.items() if hasattr(events, k)}
    assert len(shared) >= 30
    assert {k: getattr(events, k) for k in shared} == shared
    # the struct layouts: event header 64 bytes, struct proc 16 + 4 per offset field
    assert events.HEADER.size == 64
    fields = re.search(r"struct py_offsets \{(.*?)\};", (BPF_DIR / "agent.h").read_text(), re.S).group(1)
    assert tuple(re.findall(r"__s32 (\w+);", fields)) == events.OFFSET_FIELDS
    assert all(set(events.OFFSET_FIELDS) <= set(OFFSETS[v]) for v in OFFSETS)


def test_every_ptsz_and_v2_variant_in_cuda_h_is_probed():
    """cuda.h renames calls (cuMemAlloc -> cuMemAlloc_v2; the async ones -> *_ptsz under
    CUDA_API_PER_THREAD_DEFAULT_STREAM): every such name of a function we probe is probed too."""
    include = cuda_include()
    if include is None:
        pytest.skip("no cuda.h here")
    text = (include / "cuda.h").read_text(errors="replace")
    probed = set(events.ALLOCS) | set(events.FREES)

    def base(name: str) -> str:
        return re.sub(r"(_v\d+)?(_ptsz)?$", "", name)

    variants = {name + "_ptsz" for name in re.findall(r"__CUDA_API_PTSZ\((\w+)\)", text)}
    variants |= set(re.findall(r"#define \w+\s+(\w+_v\d+)\b", text))
    wanted = {v for v in variants if base(v) in {base(p) for p in probed}}
    assert {"cuMemAllocAsync_ptsz", "cuMemFreeAsync_ptsz", "cuMemAlloc_v2"} <= wanted
    assert wanted <= probed, sorted(wanted - probed)


@pytest.mark.parametrize("version", VERSIONS)
def test_code_dealloc_found_by_symbol_and_by_pycode_types_pointer(version):
    """code_dealloc: by its symbol where the build keeps it, else PyCode_Type.tp_dealloc read through the
    file's relocation: both say the same function."""
    from gpuflame.agent import procs
    from gpuflame.agent.elf import pointer_at

    python = python_for(version)
    if python is None:
        pytest.skip(f"no Python {version} here")
    out = subprocess.run(
        [
            python,
            "-c",
            "import sysconfig; print(sysconfig.get_config_var('LDLIBRARY'), sysconfig.get_config_var('LIBDIR'))",
        ],
        capture_output=True,
        text=True,
    ).stdout.split()
    lib = Path(out[1]) / out[0]
    path = str(lib) if lib.exists() and lib.suffix != ".a" else python
    elf = read_elf(path)
    if "code_dealloc" not in elf.symbols:
        pytest.skip(f"{path} has no code_dealloc symbol to compare with")
    assert (
        pointer_at(path, elf, elf.symbols["PyCode_Type"].value + procs.TP_DEALLOC) == elf.symbols["code_dealloc"].value
    )
    assert procs.code_dealloc(path) == elf.file_offset(elf.symbols["code_dealloc"].value)


def test_code_dealloc_of_a_stripped_interpreter():
    """Debian's python3 keeps no .symtab: code_dealloc is found through PyCode_Type's relocation."""
    from gpuflame.agent import procs

    stripped = next(
        (
            p
            for p in ("/usr/bin/python3.11", "/usr/bin/python3.12", "/usr/bin/python3.13")
            if os.path.exists(p) and "code_dealloc" not in read_elf(os.path.realpath(p)).symbols
        ),
        None,
    )
    if stripped is None:
        pytest.skip("no stripped system Python here")
    offset = procs.code_dealloc(os.path.realpath(stripped))
    assert offset > 0
    elf = read_elf(os.path.realpath(stripped))
    vaddr = elf.vaddr_of_offset(offset)
    assert vaddr is not None and any(s.vaddr <= vaddr < s.vaddr + s.filesz and s.flags & 1 for s in elf.segments)


@pytest.mark.parametrize("version", sorted(OFFSETS))
def test_frame_fields_sit_in_the_bytes_read_per_frame(version):
    """The walk reads FRAME_BYTES of each frame at once; every field it takes must be inside."""
    o = OFFSETS[version]
    assert o["frame_previous"] + 8 <= events.FRAME_BYTES and o["frame_code"] + 8 <= events.FRAME_BYTES
    assert o["frame_instr"] + o["frame_instr_size"] <= events.FRAME_BYTES
    assert o["frame_owner"] < events.FRAME_BYTES
    for name in ("frame_previous", "frame_code", "frame_instr"):
        assert o[name] % 8 == 0 or (name == "frame_instr" and o[name] % 4 == 0)


def naive_peak(ops):
    """A full copy of every stack's in-use at each new high (the definition)."""
    live, inuse, total, high, at_high = {}, {}, 0, 0, {}
    for op, stack, key, size in ops:
        if op == "alloc":
            live[key] = (stack, size)
            inuse[stack] = inuse.get(stack, 0) + size
            total += size
        elif key in live:
            s, sz = live.pop(key)
            inuse[s] -= sz
            total -= sz
        if total > high:
            high, at_high = total, dict(inuse)
    return at_high, inuse


@pytest.mark.parametrize(
    ("release", "refused"),
    [
        ("5.10.0-33-amd64", True),
        ("5.14.21", True),
        ("5.15.0-1068-azure", False),
        ("5.16.20", False),
        ("6.1.0-28-amd64", False),
        ("6.18.44-fc-v1045", False),
    ],
)
def test_the_kernel_floor_is_one_line(release, refused):
    """AKS's Ubuntu 22.04 GPU nodes run 5.15, the floor (uprobe attach cookies): older kernels get one line."""
    from gpuflame.agent.procs import below_kernel_floor

    line = below_kernel_floor(release)
    assert (line is not None) is refused
    if refused:
        assert line.startswith(f"Linux {release} is older than the agent's floor, 5.15") and "\n" not in line


@pytest.mark.parametrize("seed", range(20))
def test_ledger_peak_equals_the_definition(seed):
    rng = random.Random(seed)
    ledger, ops, live = Ledger(), [], []
    for i in range(400):
        if live and rng.random() < 0.45:
            key = live.pop(rng.randrange(len(live)))
            ops.append(("free", None, key, 0))
            ledger.free(1, key)
        else:
            key, stack, size = i, rng.randrange(6), rng.randrange(1, 5000)
            live.append(key)
            ops.append(("alloc", stack, key, size))
            ledger.alloc(1, "cuda", stack, key, size)
    at_high, inuse = naive_peak(ops)
    got = {stack: values for (_, stack, values) in ledger.rows()}
    assert {s: v[0] for s, v in got.items() if v[0]} == {s: v for s, v in at_high.items() if v}
    assert {s: v[2] for s, v in got.items()} == {s: inuse.get(s, 0) for s in got}


def test_ledger_books_a_free_at_its_entry_and_undoes_a_refused_one():
    """Thread A frees X (booked at the call's entry, before the driver can hand X out again), thread B gets X:
    B's block is B's. A free the driver refuses is undone: the block in use again, not allocated again, and
    the peak it makes again counted."""
    ledger = Ledger()
    ledger.alloc(7, "cuda", 0, 0x1000, 100)
    assert ledger.free(7, 0x1000, tid=11)  # A's free, at its entry
    ledger.alloc(7, "cuda", 1, 0x1000, 30)  # B: X again, A's free still in the driver
    assert {stack: v[2] for _, stack, v in ledger.rows()} == {0: 0, 1: 30}
    ledger.alloc(7, "cuda", 0, 0x2000, 50)
    assert ledger.free(7, 0x2000, tid=12)
    ledger.alloc(7, "cuda", 1, 0x3000, 40)
    assert ledger.undo(7, 12, 0x2000)  # the driver refused thread 12's free of 0x2000
    rows = {stack: v for _, stack, v in ledger.rows()}
    assert rows[0] == (50, 1, 50, 1, 150, 2)  # in use again, at the new peak (120), allocated once
    assert rows[1] == (70, 2, 70, 2, 70, 2)
    assert not ledger.undo(7, 12, 0x2000) and ledger.undo_missed == 1  # nothing left to undo: counted
    assert not ledger.free(7, 0x9999, tid=13) and ledger.unmatched_frees == 1
    assert ledger.undo(7, 13, 0x9999) and ledger.unmatched_frees == 0  # a refused free of nothing known


def test_ledger_undoes_a_refused_release_and_unmap():
    """VMM: a release and an unmap drop a reference at their entry; refused, they take it back (the memory, if
    it went with it, in use again)."""
    ledger = Ledger()
    handle = HANDLE | 0x55
    ledger.alloc(7, "cuda:0", 0, handle, 1 << 20)
    ledger.map(7, 0x7D0000000000, 1 << 20, 0x55)  # two references
    ledger.release(7, 0x55, tid=21)
    ledger.unmap(7, 0x7D0000000000, 1 << 20, tid=22)  # the last: the memory goes
    assert {stack: v[2] for _, stack, v in ledger.rows()} == {0: 0}
    assert ledger.undo(7, 22, 0x7D0000000000)  # the unmap refused: mapped and held again
    assert ledger.undo(7, 21, handle)  # the release refused: two references again
    assert {stack: v[2] for _, stack, v in ledger.rows()} == {0: 1 << 20}
    ledger.release(7, 0x55)
    assert {stack: v[2] for _, stack, v in ledger.rows()} == {0: 1 << 20}  # the mapping still holds it
    ledger.unmap(7, 0x7D0000000000, 1 << 20)
    assert {stack: v[2] for _, stack, v in ledger.rows()} == {0: 0}
    assert ledger.undo_missed == ledger.unmatched_frees == 0


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/usr/lib/x86_64-linux-gnu/libpython3.13t.so.1.0", "free-threaded"),
        ("/usr/bin/python3.14t", "free-threaded"),
        ("/opt/py/lib/libpython3.12d.so.1.0", "debug build"),
        ("/usr/bin/python3.12", None),
        ("/usr/bin/python3.14d", None),  # 3.13+ publishes its own offsets: a debug build is read like any other
    ],
)
def test_free_threaded_and_debug_builds_are_refused_by_name(path, why):
    from gpuflame.agent import procs
    from gpuflame.agent.py_layout import build_refused

    named = procs.LIBPYTHON.search(path) or procs.PYTHON_EXE.search(path)
    refused = build_refused(named.group(4), f"{named.group(2)}.{named.group(3)}")
    assert (refused is None) if why is None else why in refused


def test_ledger_exit_and_unknown_frees():
    ledger = Ledger()
    ledger.alloc(7, "cuda", 0, 0x1000, 100)
    ledger.alloc(7, "host", 1, 0x2000, 50)
    assert not ledger.free(7, 0x9999)  # from before the agent: ignored, counted
    assert ledger.unmatched_frees == 1
    assert sorted(ledger.exit(7)) == [0x1000, 0x2000]
    rows = {(g, s): v for g, s, v in ledger.rows()}
    assert rows[((7, "cuda"), 0)] == (100, 1, 0, 0, 100, 1)
    assert rows[((7, "host"), 1)] == (50, 1, 0, 0, 50, 1)


def test_ledger_drops_an_ended_process():
    ledger = Ledger()
    ledger.alloc(7, "cuda", 0, 0x1000, 100)
    ledger.alloc(8, "cuda", 0, 0x1000, 30)
    ledger.drop(7)
    assert [(g, v) for g, _, v in ledger.rows()] == [((8, "cuda"), (30, 1, 30, 1, 30, 1))]
    assert 7 not in ledger.blocks


def test_elf_symbols_and_offsets():
    """The driver functions are placed by file offset; pyenv's libpython exports _PyRuntime."""
    python = python_for("3.11")
    if python is None:
        pytest.skip("no Python 3.11 here")
    lib = next(Path(python).resolve().parents[1].glob("lib/libpython3.11*.so*"), None)
    path = str(lib) if lib else python
    elf = read_elf(path, full=False)
    runtime = elf.symbols["_PyRuntime"]
    assert runtime.value and runtime.size > 1000
    nm = subprocess.run(["nm", "-D", path], capture_output=True, text=True)
    if nm.returncode == 0:
        line = next(entry for entry in nm.stdout.splitlines() if entry.endswith(" _PyRuntime"))
        assert int(line.split()[0], 16) == runtime.value
    func = elf.symbols["PyEval_EvalCode"]
    assert elf.function_at(func.value + 1).name == "PyEval_EvalCode"
    assert elf.file_offset(func.value) == func.value - next(
        s.vaddr - s.offset for s in elf.segments if s.vaddr <= func.value < s.vaddr + s.filesz
    )


@pytest.mark.parametrize(
    ("release", "risky"),
    [
        ("6.10.14", False),
        ("6.11.0-1-generic", True),
        ("6.12.44", True),
        ("6.13.2", True),
        ("6.14.0", False),
        ("6.18.44-fc", False),
    ],
)
def test_kernels_where_uretprobes_meet_seccomp(release, risky):
    from gpuflame.agent.procs import uretprobe_seccomp_kernel

    assert uretprobe_seccomp_kernel(release) is risky


ALLOW_ALL_FILTER = r"""
import ctypes, sys, time
class Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]
allow = (Filter * 1)(Filter(0x06, 0, 0, 0x7fff0000))  # BPF_RET|BPF_K, SECCOMP_RET_ALLOW
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(Prog(1, allow)), 0, 0) == 0, ctypes.get_errno()  # SECCOMP_MODE_FILTER
print("filtered", flush=True)
sys.stdin.readline()
"""


def test_seccomp_filtered_processes_are_seen():
    from gpuflame.agent.procs import seccomp_filtered

    proc = subprocess.Popen(
        [sys.executable, "-c", ALLOW_ALL_FILTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "filtered"
        assert seccomp_filtered(proc.pid) is True
        assert seccomp_filtered(os.getpid()) is False
    finally:
        proc.stdin.close()
        proc.wait()


@pytest.mark.parametrize("version", sorted(DEBUG_POSITIONS))
def test_offsets_read_from_the_process_itself_agree_with_the_table(version):
    """3.13+ publishes its layout at the start of _PyRuntime (cookie xdebugpy): the agent reads it there, and for a
    stock build it says what the table (from the headers) says."""
    from gpuflame.agent.procs import interpreter
    from gpuflame.agent.py_layout import offsets_for
    from gpuflame.agent.pyremote import Memory

    python = python_for(version)
    if python is None:
        pytest.skip(f"no Python {version} here")
    proc = subprocess.Popen(
        [python, "-c", "import sys; print('ready', flush=True); sys.stdin.readline()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        found = interpreter(proc.pid)
        assert found is not None and found.version == version
        memory = Memory(proc.pid)
        try:
            read = offsets_for(version, found.runtime, memory)
        finally:
            memory.close()
    finally:
        proc.stdin.close()
        proc.wait()
    assert read == OFFSETS[version]


class _Blob:
    """A process's memory as py_layout reads it: one _PyRuntime at address 0."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def read(self, addr: int, size: int) -> bytes:
        return self.raw[addr : addr + size].ljust(size, b"\0")


@pytest.mark.parametrize(
    ("version", "hexversion", "free_threaded", "why"),
    [
        ("3.14", 0x030E00F0, 1, "free-threaded"),
        ("3.13", 0x030E00F0, 0, "its debug offsets are Python 3.14's, its files say 3.13"),
        ("3.14", 0x030E00F0, 0, "beyond any CPython structure"),
    ],
)
def test_published_offsets_that_cannot_be_walked_are_refused(version, hexversion, free_threaded, why):
    """A free-threaded build, a version other than the files', absurd offsets: refused in words, never walked."""
    from gpuflame.agent.py_layout import offsets_for

    raw = bytearray(1024)
    raw[:24] = b"xdebugpy" + hexversion.to_bytes(8, "little") + free_threaded.to_bytes(8, "little")
    raw[DEBUG_POSITIONS[version]["frame_previous"] : DEBUG_POSITIONS[version]["frame_previous"] + 8] = (
        1 << 40
    ).to_bytes(8, "little")
    got = offsets_for(version, 0, _Blob(bytes(raw)))  # type: ignore[arg-type]
    assert isinstance(got, str) and why in got
    assert offsets_for(version, 0, _Blob(b"\0" * 1024)) == (  # type: ignore[arg-type]
        "its _PyRuntime does not start with CPython's debug offsets"
    )


def test_every_variant_cuda_h_calls_resolve_to_is_probed(tmp_path):
    """What a program's call compiles to, per cuda.h (the _v2 names always, the _ptsz/_ptds ones under
    CUDA_API_PER_THREAD_DEFAULT_STREAM), is probed for every driver function the agent probes."""
    from gpuflame.agent.events import ALLOCS, FREES, VMM

    include = cuda_include()
    if include is None or shutil.which("gcc") is None:
        pytest.skip("no cuda.h or no gcc here")
    probed = set(ALLOCS) | set(FREES) | set(VMM)
    bases = sorted({re.sub(r"(_v\d+)?(_pt[sd][zs])?$", "", name) for name in probed})
    source = tmp_path / "calls.c"
    source.write_text("#include <cuda.h>\ngpuflame_calls: " + " ".join(bases) + "\n")
    called = set()
    for flags in ([], ["-DCUDA_API_PER_THREAD_DEFAULT_STREAM"]):
        out = subprocess.run(
            ["gcc", "-E", "-P", f"-I{include}", *flags, str(source)], capture_output=True, text=True, check=True
        ).stdout
        line = next(x for x in out.splitlines() if x.startswith("gpuflame_calls:"))
        called |= set(line.split()[1:])
    assert len(called) > len(bases)  # the _v2 and _ptsz names really came out of cuda.h
    assert called - probed == set()
