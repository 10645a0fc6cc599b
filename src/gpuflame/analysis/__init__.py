"""Analysis: the flame tree with self/total, hotspots, call chains, and diffs by function."""

from gpuflame.analysis.tree import FlameTree, Node, StackTable, build_table, build_tree

__all__ = ["FlameTree", "Node", "StackTable", "build_table", "build_tree"]
