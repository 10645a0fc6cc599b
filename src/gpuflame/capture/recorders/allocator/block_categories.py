"""The CPU allocator hook's blocks split by category (the rules: capture/books/categories.py).

Tags are set at every optimizer step and every profile, in C++ (one tag byte a
live block); the rows are split when a profile is built. The hook's event
history keys each event by its site and its block's tag (``HistoryBooks`` in
native/cpu_hook.cpp: a block tagged later has its allocation rekeyed), so a
moment (``--at``, ``--between``) gives each block the category the profiles give
it (:meth:`HookCategories.history_labels`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol

from gpuflame.capture.books import categories
from gpuflame.capture.recorders.categories import data_ptr_key
from gpuflame.model.history import Labels


class HookRecorder(Protocol):
    """What the adapter reads of the allocator recorder that owns it (this package's)."""

    _hook: Any
    _stacks: list[Any]

    def _fetch_stacks(self, hook: Any) -> None: ...


class HookCategories:
    """The hook's blocks split by category (capture/books/categories.py): tags at each optimizer step and snapshot."""

    def __init__(self, recorder: HookRecorder) -> None:
        # weakly, both ways round: the recorder owns this adapter, and a cycle would keep each recorder
        # (its stacks, its blocks' copies) until a full collection of the garbage collector; a host that
        # records a window per test made one each, and the collections they caused cost more than the windows
        self.recorder = weakref.proxy(recorder)
        self.defaults: list[str] = []  # site -> the category its stack implies
        self.steps = categories.EventTagger(data_ptr_key, _tagger(self))
        # the hook's blocks when the window stopped (copied, as its rows are: the next window resets them):
        # live blocks, tagged ones gone since the peak, and since the run's joint peak
        self.frozen: (
            tuple[list[tuple[int, ...]], list[tuple[int, int, int, int]], list[tuple[int, int, int, int]]] | None
        )
        self.frozen = None
        self.frozen_roles: dict[int, str] = {}  # the object graph's roles when the window stopped

    def start(self) -> None:
        self.frozen = None
        self.frozen_roles = {}
        self.steps.install()

    def stop(self) -> None:
        """Stop tagging; read the graph and tag the live blocks, then copy them (cheap, in C++).

        The graph is read here, not when the profile is built, because the
        recorder hands the hook's history over right after: its events take
        these tags (a block's category at the end is its category at every moment).
        """
        self.steps.remove()
        hook = self.recorder._hook
        if hook is not None:
            self.frozen_roles = _walk()
            self.tag(self.frozen_roles)
            self.frozen = _hook_blocks(hook)

    def tag(self, roles: dict[int, str]) -> None:
        hook = self.recorder._hook
        if hook is not None and roles:
            hook.tag([(key, categories.TAG_OF[role]) for key, role in roles.items()])

    def rows(self, rows: list[tuple[int, ...]]) -> dict[tuple[int, str], list[int]]:
        """Per (site, category) rows, the live blocks classed by the object graph as it is now.

        *rows* are the hook's ``rows()``: ``(site, *row)``, the row of capture/books/site_row.py.
        """
        hook = self.recorder._hook
        assert hook is not None
        roles = self.frozen_roles if self.frozen is not None else _walk()
        self.tag(roles)
        live, gone, joint_gone = self.frozen if self.frozen is not None else _hook_blocks(hook)
        blocks = [categories.Block(k, n, s, bool(p), t, bool(j)) for k, n, s, p, t, j in live]
        by_site = {site: list(values) for site, *values in rows}
        self.recorder._fetch_stacks(hook)
        return categories.split_rows(by_site, self.default, blocks, gone, roles, joint_gone)

    def history_labels(self, key: int) -> Labels:
        """The labels of a history key (categories.history_key): its block's category, tagged or by its stack."""
        return ((categories.LABEL, categories.history_category(key, self.default)), ("device", "cpu"))

    def default(self, site: int) -> str:
        stacks = self.recorder._stacks
        while len(self.defaults) < len(stacks):
            self.defaults.append(categories.stack_category(stacks[len(self.defaults)]))
        return self.defaults[site]


def _tagger(kinds: HookCategories) -> Callable[[dict[int, str]], None]:
    """*kinds*' ``tag`` for its global torch hooks, holding it weakly (no cycle through its EventTagger)."""
    ref = weakref.ref(kinds)

    def tag(roles: dict[int, str]) -> None:
        alive = ref()
        if alive is not None:
            alive.tag(roles)

    return tag


def _walk() -> dict[int, str]:
    """The object graph's roles by data pointer; none when it cannot be read (blocks are classed by their stacks)."""
    try:
        return categories.graph_roles(data_ptr_key)
    except Exception:  # noqa: BLE001 - without the graph, blocks are classed by their stacks
        return {}


def _hook_blocks(
    hook: Any,
) -> tuple[list[tuple[int, ...]], list[tuple[int, int, int, int]], list[tuple[int, int, int, int]]]:
    """The hook's live blocks, and its tagged blocks gone since the peak and since the run's joint peak."""
    return hook.blocks(), hook.gone_tagged(), hook.gone_tagged(True)
