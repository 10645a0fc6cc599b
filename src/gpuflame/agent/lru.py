"""A bounded cache: what the agent keeps on a target's behalf never grows with what the target makes.

A process can create code objects, stacks, mapped files and containers
without end (800 forged code objects with 1 MiB line tables once took the
agent 803 MiB); every cache of things read from a target is an :class:`LRU`
with a fixed number of entries and, where entries differ in size, a budget
of bytes. Forgetting only costs a second read while the target lives.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most *entries* entries and *budget* weight (``weigh(value)``, e.g. bytes); the least recently used go."""

    # weigh is never given None (a remembered miss weighs nothing), which V (often X | None) cannot say
    def __init__(self, entries: int, budget: int = 0, weigh: Callable[[Any], int] | None = None) -> None:
        self.entries = entries
        self.budget = budget
        self._weigh = weigh
        self.weight = 0
        self._items: OrderedDict[K, V] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K, default: V | None = None) -> V | None:
        if key not in self._items:
            return default
        self._items.move_to_end(key)
        return self._items[key]

    def __setitem__(self, key: K, value: V) -> None:
        if key in self._items:
            self._forget(key)
        self._items[key] = value
        self.weight += self._weight(value)
        while len(self._items) > self.entries or (self.budget and self.weight > self.budget and self._items):
            self._forget(next(iter(self._items)))

    def pop(self, key: K) -> V | None:
        return self._forget(key) if key in self._items else None

    def _forget(self, key: K) -> V:
        value = self._items.pop(key)
        self.weight -= self._weight(value)
        return value

    def _weight(self, value: V) -> int:
        return self._weigh(value) if self._weigh is not None and value is not None else 0
