"""The dispatch recorder's ledger split by category (the rules: capture/books/categories.py).

Storages are keyed by their ``_cdata``; tags are set at every optimizer step
and every profile, the rows split when a profile is built.
"""

from __future__ import annotations

from typing import Any, Protocol

from gpuflame.capture.books import categories
from gpuflame.capture.recorders.categories import cdata_key
from gpuflame.capture.recorders.dispatch.ledger import Ledger
from gpuflame.capture.recorders.dispatch.stacks import Stacks


class LedgerRecorder(Protocol):
    """What the adapter reads of the dispatch recorder that owns it (this package's)."""

    ledger: Ledger
    site_keys: list[Any]
    stacks: Stacks


class LedgerCategories:
    """The dispatch recorder's ledger split by category; storages are keyed by their ``cdata_key``."""

    def __init__(self, recorder: LedgerRecorder) -> None:
        self.recorder = recorder
        self.defaults: list[str] = []  # site -> the category its stack implies
        self.steps = categories.EventTagger(cdata_key, self.tag)

    def start(self) -> None:
        self.steps.install()

    def stop(self) -> None:
        self.steps.remove()

    def tag(self, roles: dict[int, str]) -> None:
        """Tag the live storages, and move each one's allocation in the history's log to its category.

        The queue is replayed first, under the ledger's lock, so the storages
        made so far are logged (a storage is tagged as soon as it is
        registered, long before the queue's next replay); its free is logged
        at the key its allocation has then.
        """
        ledger = self.recorder.ledger
        tracked = ledger.tracked
        with ledger.lock:
            ledger._process()
            for cdata, role in roles.items():
                ref = tracked.get(cdata)
                if ref is None:
                    continue
                tag = ref.tag = categories.TAG_OF[role]
                if ref.seq > 0:  # else not queued yet (made by another thread this instant): logged untagged
                    key = categories.history_key(ref.site, tag)
                    if key != ref.key:
                        ledger.log.rekey(ref.event, ref.key, key, ref.nbytes)
                        ref.key = key

    def history_labels(self, key: int) -> tuple[tuple[str, str], ...]:
        """The labels of a history key (categories.history_key): its block's category, and its device."""
        device = self.recorder.site_keys[categories.history_site(key)][1]
        return ((categories.LABEL, categories.history_category(key, self.default)), ("device", device))

    def rows(self) -> dict[tuple[int, str], list[int]]:
        """Per (site, category) rows, the live storages classed by the object graph as it is now."""
        try:
            roles = categories.graph_roles(cdata_key)
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
