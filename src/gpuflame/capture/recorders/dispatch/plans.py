"""What each operator can do to memory, decided once per operator from its schema (the dispatch mode's plans).

Read by the dispatch mode (mode.py) for every operation; standard library
only: a plan is made from the operator object torch hands the mode.
"""

from __future__ import annotations

from typing import Any

# ops that may grow the storage of a tensor they write to
_RESIZING = frozenset({"aten::resize_", "aten::resize_as_", "aten::_resize_output_", "aten::set_"})

PASS = "pass"  # returns nothing new: views, in-place ops, scalars
FRESH = "fresh"  # returns new storages
FRESH_CHECK = "fresh-check"  # returns storages that may belong to an input
LIFT = "lift"  # lift_fresh: a tensor made below the dispatcher
HOP = "hop"  # a higher-order operator


class Resize:
    """An op that writes to tensors and may grow their storage (``resize_``, ``out=``)."""

    __slots__ = ("writes", "fresh")

    def __init__(self, writes: list[tuple[int, str]], fresh: str) -> None:
        self.writes = writes  # (position, name) of written arguments
        self.fresh = fresh  # PASS, FRESH or FRESH_CHECK for its returns

    def written(self, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> list[Any]:
        out: list[Any] = []
        for pos, name in self.writes:
            if pos < len(args):
                value = args[pos]
            elif kwargs and name in kwargs:
                value = kwargs[name]
            else:
                continue
            if isinstance(value, (list, tuple)):
                out.extend(value)
            else:
                out.append(value)
        return out


# id(op) -> plan. By id: OpOverload.__hash__ is Python code, too slow to run
# per op. The ops are kept alive in _OPS, so their ids stay theirs.
PLANS: dict[int, Any] = {}
_OPS: list[Any] = []


def plan_for(func: Any) -> Any:
    """The plan of one operator overload, from its schema's alias annotations."""
    plan = PLANS.get(id(func))
    if plan is None:
        plan = _make_plan(func)
        _OPS.append(func)
        PLANS[id(func)] = plan
    return plan


def _make_plan(func: Any) -> Any:
    schema = getattr(func, "_schema", None)
    if schema is None or not hasattr(func, "_op"):
        return HOP
    name = schema.name
    if name == "aten::lift_fresh":
        return LIFT
    if name == "aten::lift":
        return FRESH_CHECK
    returns_new = any(r.alias_info is None and "Tensor" in str(r.type) for r in schema.returns)
    short = name.split("::")[-1]
    fresh = PASS
    if returns_new:
        fresh = FRESH_CHECK if ("view" in short or "alias" in short) else FRESH
    writes = [
        (i, a.name)
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write and "Tensor" in str(a.type)
    ]
    if writes and (name in _RESIZING or any(schema.arguments[i].kwarg_only for i, _ in writes)):
        return Resize(writes, fresh)
    return fresh
