"""How deep a pickle nests its tuples, found by replaying its opcodes' stack effects.

CPython hashes a tuple (a dict key) by recursing into it unguarded, so a key
nested a few hundred thousand tuples deep would crash the interpreter while
unpickling. ``safe_pickle`` runs this exact, slow check on pickles with many
tuples before the C unpickler sees them. A damaged opcode stream raises
``ValueError``, ``IndexError`` or ``KeyError``, which the caller words.
"""

from __future__ import annotations

import pickletools

from gpuflame.errors import ProfileFormatError


def check(data: bytes, max_depth: int) -> None:
    """Simulate the unpickler's stack, tracking only how deep hashable containers nest.

    Slow (pure Python over every opcode), so ``safe_pickle.scan`` calls it only for
    pickles with many tuples; a real snapshot's tuples are flat pairs.
    """
    stack: list[int] = []  # nesting depth of tuples/frozensets in each slot; 0 for anything else
    marks: list[int] = []
    memo: dict[int, int] = {}
    for opcode, arg, pos in pickletools.genops(data):
        name = opcode.name
        if name == "MARK":
            marks.append(len(stack))
            continue
        depth = _nesting_effect(name, arg, stack, marks, memo)
        if depth > max_depth:
            raise ProfileFormatError(f"corrupt pickle (tuples nested more than {max_depth} deep at byte {pos})")


def _nesting_effect(name: str, arg: object, stack: list[int], marks: list[int], memo: dict[int, int]) -> int:
    """Apply one opcode's stack effect; return the depth of what it pushed (0 if nothing)."""
    if name in ("TUPLE1", "TUPLE2", "TUPLE3"):
        k = int(name[-1])
        items = stack[-k:]
        del stack[-k:]
        if len(items) < k:
            raise IndexError("stack underflow")
        stack.append(1 + max(items))
    elif name in ("TUPLE", "FROZENSET", "LIST", "DICT", "APPENDS", "SETITEMS", "ADDITEMS", "POP_MARK"):
        start = marks.pop()
        items = stack[start:]
        del stack[start:]
        if name in ("TUPLE", "FROZENSET"):
            stack.append(1 + max(items, default=0))
        elif name in ("LIST", "DICT"):
            stack.append(0)
    elif name in ("APPEND", "POP", "BUILD"):
        stack.pop()
    elif name == "SETITEM":
        del stack[-2:]
    elif name in ("REDUCE", "STACK_GLOBAL"):
        args = stack.pop()
        stack.pop()
        stack.append(args + 1)  # frozenset(items) nests its items once more
    elif name == "DUP":
        stack.append(stack[-1])
    elif name in ("GET", "BINGET", "LONG_BINGET"):
        stack.append(memo.get(int(arg), 0))  # type: ignore[call-overload]
    elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
        memo[int(arg)] = stack[-1]  # type: ignore[call-overload]
    elif name == "MEMOIZE":
        memo[len(memo)] = stack[-1]
    elif name in ("PROTO", "FRAME", "STOP"):
        pass
    elif name == "EMPTY_TUPLE":
        stack.append(1)
    else:  # every other opcode allowed here pushes one plain value
        stack.append(0)
    return stack[-1] if stack else 0
