"""What both torch recorders and torch-cuda share to class blocks by the object graph.

The rules live in capture/books/categories.py; each recorder's adapter lives in
its own package (``allocator/block_categories.py``, ``dispatch/block_categories.py``) and
keys storages its own way with the functions here. torch-cuda marks the blocks
of a live snapshot (:func:`mark_categories`).
"""

from __future__ import annotations

from typing import Any

from gpuflame.capture.books import categories
from gpuflame.model.categories import BLOCK_CATEGORY_KEY, CATEGORIES_KEY


def mark_categories(snapshot: dict[str, Any]) -> None:
    """torch-cuda: mark each active block of a live snapshot the object graph classes (see formats/torch_snapshot).

    A block's address is its storage's data pointer. Blocks live at the peak
    and freed since are classed by their stacks (the snapshot keeps no tags).
    """
    try:
        roles = categories.graph_roles(data_ptr_key)
    except Exception:  # noqa: BLE001 - without the graph, blocks are classed by their stacks
        roles = {}
    for segment in snapshot.get("segments") or []:
        for block in segment.get("blocks") or []:
            address = block.get("address") if isinstance(block, dict) else None
            role = roles.get(address) if isinstance(address, int) else None
            if role is not None:
                block[BLOCK_CATEGORY_KEY] = role
    snapshot[CATEGORIES_KEY] = True


def data_ptr_key(storage: Any) -> int:
    """A storage's key where blocks are known by address (the CPU hook, torch-cuda's snapshot)."""
    return int(storage.data_ptr())


def cdata_key(storage: Any) -> int:
    """A storage's key where storages are known by their C object (the dispatch ledger)."""
    return int(storage._cdata)
