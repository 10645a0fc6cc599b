"""Each torch recorder's blocks split by category (the rules live in capture/books/categories.py).

One adapter per recorder, so the recorders' own modules change by a few
lines: tags are set at every optimizer step and every profile, the rows
split when a profile is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuflame.capture.books import categories
from gpuflame.model.categories import BLOCK_CATEGORY_KEY, CATEGORIES_KEY

if TYPE_CHECKING:
    from gpuflame.capture.recorders.allocator import TorchAllocatorRecorder
    from gpuflame.capture.recorders.dispatch import Ledger, TorchTensorRecorder


class HookCategories:
    """The hook's blocks split by category (capture/books/categories.py): tags at each optimizer step and snapshot."""

    def __init__(self, recorder: TorchAllocatorRecorder) -> None:
        self.recorder = recorder
        self.defaults: list[str] = []  # site -> the category its stack implies
        self.steps = categories.EventTagger(_data_ptr, self.tag)
        # the hook's blocks when the window stopped (copied, as its rows are: the next window resets them):
        # live blocks, tagged ones gone since the peak, and since the run's joint peak
        self.frozen: (
            tuple[list[tuple[int, ...]], list[tuple[int, int, int, int]], list[tuple[int, int, int, int]]] | None
        )
        self.frozen = None

    def start(self) -> None:
        self.frozen = None
        self.steps.install()

    def stop(self) -> None:
        """Stop tagging; copy the blocks (cheap, in C++): the graph is read when the profile is built."""
        self.steps.remove()
        hook = self.recorder._hook
        if hook is not None:
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
        try:
            roles = categories.graph_roles(_data_ptr)
        except Exception:  # noqa: BLE001 - without the graph, blocks are classed by their stacks
            roles = {}
        self.tag(roles)
        live, gone, joint_gone = self.frozen if self.frozen is not None else _hook_blocks(hook)
        blocks = [categories.Block(k, n, s, bool(p), t, bool(j)) for k, n, s, p, t, j in live]
        by_site = {site: list(values) for site, *values in rows}
        self.recorder._fetch_stacks(hook)
        return categories.split_rows(by_site, self.default, blocks, gone, roles, joint_gone)

    def default(self, site: int) -> str:
        stacks = self.recorder._stacks
        while len(self.defaults) < len(stacks):
            self.defaults.append(categories.stack_category(stacks[len(self.defaults)]))
        return self.defaults[site]


def _hook_blocks(
    hook: Any,
) -> tuple[list[tuple[int, ...]], list[tuple[int, int, int, int]], list[tuple[int, int, int, int]]]:
    """The hook's live blocks, and its tagged blocks gone since the peak and since the run's joint peak."""
    return hook.blocks(), hook.gone_tagged(), hook.gone_tagged(True)


class LedgerCategories:
    """The dispatch recorder's ledger split by category; storages are keyed by their ``_cdata``."""

    def __init__(self, recorder: TorchTensorRecorder) -> None:
        self.recorder = recorder
        self.defaults: list[str] = []  # site -> the category its stack implies
        self.steps = categories.EventTagger(_cdata, self.tag)

    def start(self) -> None:
        self.steps.install()

    def stop(self) -> None:
        self.steps.remove()

    def tag(self, roles: dict[int, str]) -> None:
        ledger = self.recorder.ledger
        tracked = ledger.tracked
        for key, role in roles.items():
            ref = tracked.get(key)
            if ref is not None:
                ref.tag = categories.TAG_OF[role]

    def rows(self) -> dict[tuple[int, str], list[int]]:
        """Per (site, category) rows, the live storages classed by the object graph as it is now."""
        try:
            roles = categories.graph_roles(_cdata)
        except Exception:  # noqa: BLE001 - without the graph, storages are classed by their stacks
            roles = {}
        self.tag(roles)
        ledger = self.recorder.ledger
        rows = ledger.rows()
        with ledger.lock:
            blocks, gone, joint_gone = _ledger_blocks(ledger)
        return categories.split_rows(rows, self.default, blocks, gone, roles, joint_gone)

    def default(self, site: int) -> str:
        keys = self.recorder.site_keys
        while len(self.defaults) < len(keys):
            node, _device = keys[len(self.defaults)]
            self.defaults.append(categories.stack_category(self.recorder.stacks.frames(node)))
        return self.defaults[site]


def _ledger_blocks(
    ledger: Ledger,
) -> tuple[list[categories.Block], list[tuple[int, int, int, int]], list[tuple[int, int, int, int]]]:
    peak_seq = ledger.peak_seq
    joint_seq, site_device = ledger.joint_seq, ledger.site_device
    blocks = [
        categories.Block(
            key,
            ref.nbytes,
            ref.site,
            ref.seq <= peak_seq,
            getattr(ref, "tag", 0),
            ref.seq <= joint_seq.get(site_device[ref.site], 0),
        )
        for key, ref in list(ledger.tracked.items())
        if ref.seq > 0
    ]
    gone = [(site, tag, g[1], g[2]) for (site, tag), g in ledger.gone_tagged.items() if g[0] == peak_seq and g[2]]
    joint_gone = [(site, tag, g[0], g[1]) for (site, tag), g in ledger.joint_gone_tagged.items() if g[1]]
    return blocks, gone, joint_gone


def mark_categories(snapshot: dict[str, Any]) -> None:
    """torch-cuda: mark each active block of a live snapshot the object graph classes (see formats/torch_snapshot).

    A block's address is its storage's data pointer. Blocks live at the peak
    and freed since are classed by their stacks (the snapshot keeps no tags).
    """
    try:
        roles = categories.graph_roles(_data_ptr)
    except Exception:  # noqa: BLE001 - without the graph, blocks are classed by their stacks
        roles = {}
    for segment in snapshot.get("segments") or []:
        for block in segment.get("blocks") or []:
            address = block.get("address") if isinstance(block, dict) else None
            role = roles.get(address) if isinstance(address, int) else None
            if role is not None:
                block[BLOCK_CATEGORY_KEY] = role
    snapshot[CATEGORIES_KEY] = True


def _data_ptr(storage: Any) -> int:
    return int(storage.data_ptr())


def _cdata(storage: Any) -> int:
    return int(storage._cdata)
