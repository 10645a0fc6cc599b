"""The restricted unpickler: plain data loads, nothing else does, nothing runs.

Malicious pickles are real ones, made by ``pickle.dumps`` of objects whose
``__reduce__`` would run a command that creates a sentinel file, and by hand
for opcodes the pickler never writes on its own; every test checks the
sentinel is still absent.
"""

from __future__ import annotations

import builtins
import copyreg
import os
import pickle
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gpuflame.errors import ProfileFormatError, UnsafePickleError
from gpuflame.formats import safe_pickle

PROTOCOLS = range(pickle.HIGHEST_PROTOCOL + 1)


@pytest.fixture
def sentinel(tmp_path: Path):
    """A path that only a successful attack would create; checked after each test."""
    path = tmp_path / "PWNED"
    yield path
    assert not path.exists(), "a pickle ran code"


class RunsCommand:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


class CallsEval:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (builtins.eval, (f"open({str(self.path)!r}, 'w').close()",))


class CallsSubprocess:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (subprocess.call, (["touch", str(self.path)],))


class PlainInstance:
    def __init__(self) -> None:
        self.value = 42


def snapshot_like(payload: object) -> dict:
    """A valid-looking snapshot dict with *payload* hidden deep inside a block."""
    return {
        "segments": [
            {
                "device": 0,
                "address": 0x7F0000000000,
                "total_size": 2 << 20,
                "stream": 0,
                "segment_pool_id": (0, 0),
                "blocks": [
                    {
                        "address": 0x7F0000000000,
                        "size": 2 << 20,
                        "requested_size": 100,
                        "state": "active_allocated",
                        "frames": [{"filename": "/app/x.py", "line": 3, "name": "f", "extra": payload}],
                    },
                ],
            }
        ],
        "device_traces": [[]],
    }


# -- plain data ---------------------------------------------------------------


PLAIN = {
    "ints": [0, 1, -1, 255, 256, 65535, 2**31 - 1, -(2**31), 2**63, -(2**70), 10**40],
    "floats": [0.0, -1.5, 1e300, float("inf")],
    "strings": ["", "x" * 300, "ünïcode ✓", "line\nbreak", "\x00"],
    "bytes": [b"", b"\x00\xff", b"y" * 300, bytearray(b"ba")],
    "containers": [(), (1,), (1, 2), (1, 2, 3), (1, (2, (3, 4))), [], {}, {1, 2}, frozenset({3}), set()],
    "consts": [None, True, False],
    "shared": None,
}
shared = {"filename": "/a.py", "line": 1, "name": "f"}
PLAIN["shared"] = [shared, shared, [shared]]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_plain_data_round_trips_in_every_protocol(protocol: int) -> None:
    loaded = safe_pickle.loads(pickle.dumps(PLAIN, protocol=protocol))
    assert loaded == PLAIN
    # memo references survive: one object, referenced three times
    assert loaded["shared"][0] is loaded["shared"][1] is loaded["shared"][2][0]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_snapshot_structure_loads(protocol: int) -> None:
    snap = snapshot_like("just a string")
    assert safe_pickle.loads(pickle.dumps(snap, protocol=protocol)) == snap


def test_many_flat_tuples_load_after_the_exact_nesting_check() -> None:
    # more tuples than the fast scan accepts unchecked: the exact check runs and passes
    data = {"segments": [{"segment_pool_id": (0, i)} for i in range(safe_pickle.HASHABLE_OPCODES_UNCHECKED + 5)]}
    assert safe_pickle.loads(pickle.dumps(data, protocol=4)) == data


@pytest.mark.parametrize(
    "unit",
    [
        b"\x8c\x02ab",
        b"C\x02ab",
        b"U\x02ab",
        b"X\x02\x00\x00\x00ab",
        b"B\x02\x00\x00\x00ab",
        b"T\x02\x00\x00\x00ab",
        b"I12\n",
        b"L12L\n",
        b"S'ab'\n",
        b"Vab\n",
        b"F1.5\n",
        b"Mab",
    ],
)
def test_runs_of_short_strings_and_text_arguments_stay_in_the_fast_path(unit: bytes) -> None:
    """One Python iteration per 3-byte string made a gigabyte of them take 7 minutes to scan."""
    body = (unit + b"0") * 1000  # each value pushed, then popped
    data = b"\x80\x02" + body + b"N."
    assert safe_pickle.fast_path_for(0).match(data, 2).end() == len(data) - 1  # all but STOP, in C
    assert safe_pickle.loads(data) is None


def test_stack_globals_allowed_globals_and_longs_stay_in_the_fast_path() -> None:
    """STACK_GLOBAL and the allowed GLOBALs do nothing in the scan: a run of them was one Python iteration a byte."""
    for run in (
        b"\x93" * 1000,
        b"cbuiltins\nset\n0" * 100,
        b"c_codecs\nencode\n0" * 100,
        b"\x8a\x1f" + bytes(31) + b"0",
        b"\x8b\x1f\x00\x00\x00" + bytes(31) + b"0",
    ):
        assert safe_pickle.fast_path_for(0).match(run + b".").end() == len(run)


@pytest.mark.parametrize("opcode, width", [(b"\x8c", 1), (b"X", 4), (b"\x8d", 8), (b"\x8a", 1)])
def test_the_narrow_fast_path_skips_short_arguments_and_the_wide_one_all_below_256_bytes(
    opcode: bytes, width: int
) -> None:
    def unit(size: int) -> bytes:
        return opcode + size.to_bytes(width, "little") + b"a" * size + b"0"

    narrow, wide = safe_pickle.fast_path_for(0), safe_pickle.fast_path_for(0, wide=True)
    below = unit(safe_pickle.NARROW - 1)
    assert narrow.match(below + b".").end() == len(below)
    assert narrow.match(unit(safe_pickle.NARROW) + b".").end() == 0
    for size in (safe_pickle.NARROW, safe_pickle.WIDE - 1):
        assert wide.match(unit(size) + b".").end() == len(unit(size))
    if width > 1:  # (a one-byte length cannot say 256)
        assert wide.match(unit(safe_pickle.WIDE) + b".").end() == 0


def _patterns_asked_for(monkeypatch, data: bytes) -> list[bool]:
    asked: list[bool] = []
    real = safe_pickle.fast_path_for

    def spy(n: int, wide: bool = False):
        asked.append(wide)
        return real(n, wide)

    monkeypatch.setattr(safe_pickle, "fast_path_for", spy)
    assert safe_pickle.loads(data) is None
    return asked


def test_a_pickle_of_many_longer_strings_widens_the_fast_path_once(monkeypatch) -> None:
    """Past WIDEN_AFTER strings of 32-255 bytes through the loop, the rest is skipped in C."""
    body = (b"\x8c\x64" + b"a" * 100 + b"0") * (safe_pickle.WIDEN_AFTER + 10)
    assert _patterns_asked_for(monkeypatch, b"\x80\x04" + body + b"N.") == [False, True]


def test_a_snapshot_with_a_few_long_names_keeps_the_narrow_fast_path(monkeypatch) -> None:
    """Real snapshots write each distinct name once: the wide pattern (20 ms to compile) is never needed."""
    names = [f"/site-packages/torch/nn/modules/module_{i}.py" for i in range(safe_pickle.WIDEN_AFTER - 1)]
    long = (b"X\x2c\x01\x00\x00" + b"b" * 300 + b"0") * 50  # 256 bytes or more: never skipped in C
    body = b"".join(b"\x8c" + bytes([len(n)]) + n.encode() + b"0" for n in names)
    assert _patterns_asked_for(monkeypatch, b"\x80\x04" + body + long + b"N.") == [False]


def test_memo_puts_of_large_pickles_stay_in_the_fast_path_when_their_size_allows_them() -> None:
    assert safe_pickle.fast_path_for(1 << 24).match(b"r\x00\x00\x01\x00").end() == 5
    assert safe_pickle.fast_path_for(10**7).match(b"p9999999\n").end() == 9
    assert safe_pickle.fast_path_for(10**7).match(b"p99999999\n").end() == 0


def test_tuples_past_the_limit_stop_the_scan_of_a_large_pickle_at_once(monkeypatch) -> None:
    """The tuple that makes the count too large for the check ends the scan: the rest is never walked."""
    from gpuflame.errors import ProfileFormatError

    data = b"\x80\x04" + b"N\x850" * (safe_pickle.HASHABLE_OPCODES_UNCHECKED + 1) + b"\xff" * 100 + b"."
    monkeypatch.setenv("GPUFLAME_MAX_PICKLE_TUPLE_CHECK_BYTES", "1000")
    with pytest.raises(ProfileFormatError, match="GPUFLAME_MAX_PICKLE_TUPLE_CHECK_BYTES"):
        safe_pickle.scan(data)
    monkeypatch.delenv("GPUFLAME_MAX_PICKLE_TUPLE_CHECK_BYTES")
    with pytest.raises(ProfileFormatError, match="unknown opcode 0xff"):
        safe_pickle.scan(data)


def test_memo_puts_past_the_small_index_leave_the_fast_path_and_are_checked() -> None:
    from gpuflame.errors import ProfileFormatError

    assert safe_pickle.fast_path_for(0).match(b"p999999\n").end() == 8
    assert safe_pickle.fast_path_for(0).match(b"p1000000\n").end() == 0
    assert safe_pickle.fast_path_for(0).match(b"r\x00\x00\x01\x00").end() == 0
    for data in (b"N" + b"p99999999\n" + b".", b"\x80\x02N" + b"r\x00\x00\x00\x7f" + b"."):
        with pytest.raises(ProfileFormatError, match="memo index"):
            safe_pickle.loads(data)


def test_many_tuples_in_a_large_pickle_are_refused_before_the_slow_check(monkeypatch) -> None:
    """The exact check is Python per opcode (~2 s a MB): a 1 MB gzip inflating to 1 GB with 10,001
    tuples would have taken half an hour. Past the size limit the pickle is refused at once."""
    from gpuflame.errors import ProfileFormatError

    data = pickle.dumps([(0, i) for i in range(safe_pickle.HASHABLE_OPCODES_UNCHECKED + 5)], protocol=4)
    checked = []
    monkeypatch.setattr(safe_pickle, "check_nesting", checked.append)
    monkeypatch.setenv("GPUFLAME_MAX_PICKLE_TUPLE_CHECK_BYTES", str(len(data) - 1))
    with pytest.raises(ProfileFormatError, match="GPUFLAME_MAX_PICKLE_TUPLE_CHECK_BYTES"):
        safe_pickle.loads(data)
    assert checked == []


# -- code and objects are refused ---------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("attack", [RunsCommand, CallsEval, CallsSubprocess])
def test_reduce_attacks_are_refused_and_never_run(sentinel: Path, protocol: int, attack: type) -> None:
    for payload in (attack(sentinel), snapshot_like(attack(sentinel))):
        data = pickle.dumps(payload, protocol=protocol)
        with pytest.raises(UnsafePickleError) as info:
            safe_pickle.loads(data)
        message = str(info.value)
        assert message.startswith("refusing to load: the pickle asks to import ")
        assert "plain data" in message
        wanted = {
            RunsCommand: ("system",),
            CallsEval: ("eval",),
            CallsSubprocess: ("subprocess.call", "commands.call"),
        }[attack]
        assert any(w in message for w in wanted), message


def test_os_system_is_named(sentinel: Path) -> None:
    with pytest.raises(UnsafePickleError, match=r"(os|posix|nt)\.system"):
        safe_pickle.loads(pickle.dumps(RunsCommand(sentinel)))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_class_instances_are_refused_with_the_class_named(protocol: int) -> None:
    for payload in (PlainInstance(), snapshot_like(PlainInstance())):
        with pytest.raises(UnsafePickleError, match="PlainInstance"):
            safe_pickle.loads(pickle.dumps(payload, protocol=protocol))


HAND_MADE = {
    # GLOBAL + REDUCE, protocol 0 spelling
    "global-reduce": b"cos\nsystem\n(S'touch SENTINEL'\ntR.",
    # STACK_GLOBAL + REDUCE, protocol 4 spelling
    "stack-global": b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x94(rewritten in the test)",
    # INST: import and call in one opcode
    "inst": b"(S'touch SENTINEL'\nios\nsystem\n.",
    # OBJ with a class from GLOBAL
    "obj": b"(cos\nsystem\nS'touch SENTINEL'\no.",
    # NEWOBJ_EX / NEWOBJ on an imported class
    "newobj-ex": b"\x80\x04\x8c\x08builtins\x8c\x06object\x93)}\x92.",
    "newobj": b"\x80\x02cbuiltins\nobject\n)\x81.",
    # BUILD on plain data (would call __setstate__ on an object)
    "build": b"\x80\x02}}b.",
    # persistent ids
    "persid": b"Pfoo\n.",
    "binpersid": b"\x80\x02X\x03\x00\x00\x00fooQ.",
    # an extension code (copyreg registry)
    "ext1": b"\x80\x02\x82\x01.",
    # out-of-band buffers (protocol 5)
    "next-buffer": b"\x80\x05\x97.",
    # an allowed name used to build an object
    "allowed-newobj": b"\x80\x02cbuiltins\nset\n)\x81.",
    # getattr is not plain data either
    "getattr": b"cbuiltins\ngetattr\n(cos\nS'system'\ntR.",
}


@pytest.mark.parametrize("name", sorted(HAND_MADE))
def test_hand_made_opcodes_are_refused(sentinel: Path, name: str) -> None:
    data = HAND_MADE[name].replace(b"SENTINEL", str(sentinel).encode())
    # keep length prefixes right after the substitution
    if name == "stack-global":
        cmd = f"touch {sentinel}".encode()
        data = b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x94\x8c" + bytes([len(cmd)]) + cmd + b"\x94\x85\x94R\x94."
    with pytest.raises(UnsafePickleError):
        safe_pickle.loads(data)


def test_registered_extension_codes_are_refused(sentinel: Path) -> None:
    copyreg.add_extension("os", "system", 0xF0)
    try:
        with pytest.raises(UnsafePickleError):
            safe_pickle.loads(b"\x80\x02\x82\xf0(S'touch " + str(sentinel).encode() + b"'\ntR.")
    finally:
        copyreg.remove_extension("os", "system", 0xF0)


def test_allowed_constructors_accept_only_plain_arguments() -> None:
    # bytes(10**12) and bytearray(10**12) would allocate a terabyte
    for name in (b"bytes", b"bytearray", b"set"):
        data = b"cbuiltins\n" + name + b"\n(L1000000000000L\ntR."
        with pytest.raises(ProfileFormatError):
            safe_pickle.loads(data)
    with pytest.raises(ProfileFormatError):  # _codecs.encode with another codec
        safe_pickle.loads(b"c_codecs\nencode\n(Vx\nVrot13\ntR.")


# -- damaged pickles -----------------------------------------------------------


def plain_errors_only(data: bytes) -> str:
    """Load *data*; any failure must be ProfileFormatError."""
    try:
        safe_pickle.loads(data)
    except ProfileFormatError:
        return "rejected"
    return "loaded"


def test_every_truncation_is_a_format_error() -> None:
    data = pickle.dumps(snapshot_like([1, 2.5, "x" * 40, b"b" * 300, (1, 2)]), protocol=4)
    for cut in range(len(data)):
        assert plain_errors_only(data[:cut]) == "rejected", cut


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x80",
        b"\x80\x04\x95",  # FRAME without its length
        b"\x80\x04X\xff\xff\xff\x7f",  # BINUNICODE of 2 GiB
        b"\x80\x04\x8d" + struct.pack("<Q", 1 << 60) + b"ab.",  # BINUNICODE8 of an exabyte
        b"\x80\x04\x8e" + struct.pack("<Q", 1 << 62) + b".",  # BINBYTES8
        b"\x80\x05\x96" + struct.pack("<Q", 1 << 62) + b".",  # BYTEARRAY8
        b"\x80\x02\x8b\xff\xff\xff\x7f.",  # LONG4 of 2 GiB
        b"\x80\x02\x8b\xff\xff\xff\xff.",  # LONG4 with a negative length
        b"\x80\x02T\xff\xff\xff\xff.",  # BINSTRING with a negative length
        b"\x80\x04}r\xf0\xff\xff\xff.",  # LONG_BINPUT asking for a 4-billion-slot memo
        b"(p4294967295\n.",  # PUT, the same in text
        b"\x80\x04h\x05.",  # BINGET of nothing
        b"\x80\x04K\x01K\x02s.",  # SETITEM with no dict
        b"\x80\x04e.",  # APPENDS with no mark
        b"\x80\x04\xff.",  # unknown opcode
        b"\x80\x04N",  # no STOP
        b"I12x\n.",  # bad INT
        b"L" + b"9" * 5000 + b"L\n.",  # an int too long to convert
        b"\x80\x04]" + b"\x94" * 10,
        b"not a pickle at all",
    ],
)
def test_damaged_pickles_are_format_errors(data: bytes) -> None:
    assert plain_errors_only(data) == "rejected"


def test_deep_lists_load_or_fail_plainly() -> None:
    depth = 200_000  # far past the recursion limit; the unpickler is iterative
    data = b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b"."
    assert plain_errors_only(data) in ("loaded", "rejected")


@pytest.mark.subprocess
def test_deeply_nested_tuple_keys_are_refused_before_they_crash_the_interpreter() -> None:
    # hashing a dict key nested 300k tuples deep overflows CPython's C stack;
    # run it in a child so that a crash fails the test instead of killing pytest
    code = (
        "from gpuflame.formats import safe_pickle\n"
        "from gpuflame.errors import ProfileFormatError\n"
        "data = b'\\x80\\x04}' + b')' + b'\\x85' * 300000 + b'K\\x01s.'\n"
        "try:\n"
        "    safe_pickle.loads(data)\n"
        "except ProfileFormatError as exc:\n"
        "    print('rejected:', exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "rejected: corrupt pickle (tuples nested more than" in done.stdout


def test_moderately_nested_tuples_still_load() -> None:
    value: tuple = ()
    for _ in range(50):
        value = (value, 1)
    assert safe_pickle.loads(pickle.dumps({value: 1}, protocol=4)) == {value: 1}


def test_random_mutations_load_or_fail_plainly(sentinel: Path) -> None:
    rng = random.Random("safe-pickle")
    seeds = [pickle.dumps(snapshot_like([1, "x", (2, 3)]), protocol=p) for p in (2, 4, 5)] + [
        pickle.dumps(snapshot_like(RunsCommand(sentinel)), protocol=4)
    ]
    outcomes = {"loaded": 0, "rejected": 0}
    for seed in seeds:
        for _ in range(400):
            buf = bytearray(seed)
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(len(buf))
                buf[i] = rng.randrange(256)
            outcomes[plain_errors_only(bytes(buf))] += 1
    assert outcomes["loaded"] and outcomes["rejected"], outcomes


def test_memory_bomb_fails_fast() -> None:
    # 4 billion memo slots would be 32 GiB; the scan refuses before the unpickler sizes its table
    with pytest.raises(ProfileFormatError, match="memo index"):
        safe_pickle.loads(b"\x80\x04}r\xf0\xff\xff\xff.")
