"""Analysis: the flame tree with self/total, hotspots, call chains, and diffs by function.

The names below load on first use (PEP 562): the flame tree needs numpy, and
a command that only converts a file should not pay for importing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuflame.analysis.tree import FlameTree, Node, StackTable, build_table, build_tree

__all__ = ["FlameTree", "Node", "StackTable", "build_table", "build_tree"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from gpuflame.analysis import tree

        return getattr(tree, name)
    raise AttributeError(f"module 'gpuflame.analysis' has no attribute {name!r}")
