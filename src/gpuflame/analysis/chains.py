"""Why a function allocates: the call chains that lead to it, read bottom-up.

The AKS flame-graph reading guide reads a stack from the bottom (the entry point) up to the frame that
allocates. ``explain`` does that for every distinct path into a function:
each chain runs from a root to the function's outermost appearance on that
path (recursion above it belongs to the same chain), with the self and total
of every step, and a summary of what the function itself calls.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import numpy as np

from gpuflame.analysis.tree import FlameTree, Node, chunk_rows, frame_dict
from gpuflame.errors import GpuflameError
from gpuflame.model.profile import Frame
from gpuflame.symbols.names import compile_query, matches_exactly, normalize
from gpuflame.units import percent

# Callees listed under each chain; the rest are summed.
CALLEES = 3


class NoSuchFunctionError(GpuflameError):
    """No frame of the profile matches the name the user gave."""


@dataclass(frozen=True)
class Step:
    """One frame of a chain: a node of the flame tree, with the lines it ran on this chain.

    ``frame`` is the function bar (its line: where it is defined); ``lines``
    are the lines of the function this chain went through, widest first:
    where it made the call that leads on (pprof's ``Line.line``), or
    allocated.
    """

    frame: Frame
    self: int
    total: int
    lines: tuple[tuple[int, int], ...] = ()

    @property
    def line(self) -> int:
        """The widest line this step ran on the chain (0 when unknown)."""
        return self.lines[0][0] if self.lines else 0

    def to_dict(self) -> dict[str, object]:
        return {
            **frame_dict(self.frame),
            "line": self.line,
            "lines": [{"line": line, "total": total} for line, total in self.lines],
            "self": self.self,
            "total": self.total,
        }


@dataclass(frozen=True)
class Chain:
    """Entry point first, the matched function last; ``callees`` are what it calls."""

    steps: list[Step]
    percent: float
    callees: list[Step]
    other_callees: int

    @property
    def total(self) -> int:
        return self.steps[-1].total

    @property
    def self(self) -> int:
        return self.steps[-1].self

    def to_dict(self) -> dict[str, object]:
        return {
            "total": self.total,
            "self": self.self,
            "percent": round(self.percent, 3),
            "steps": [s.to_dict() for s in self.steps],
            "callees": [c.to_dict() for c in self.callees],
            "other_callees": self.other_callees,
        }


@dataclass(frozen=True)
class Explanation:
    """All the ways into the functions matching a query, widest chain first."""

    query: str
    functions: list[Frame]
    total: int
    self: int  # at the chains' ends: what the matched functions the chains end in allocate themselves
    percent: float
    chains: list[Chain]
    more_chains: int
    more_total: int
    nested_self: int = 0  # self of matched functions called from a chain's end (within its total, not its self)

    def to_dict(self) -> dict[str, object]:
        return {
            "query": self.query,
            "functions": [frame_dict(f) for f in self.functions],
            "total": self.total,
            "self": self.self,
            "percent": round(self.percent, 3),
            "chains": [c.to_dict() for c in self.chains],
            "more_chains": self.more_chains,
            "more_total": self.more_total,
            "nested_self": self.nested_self,
        }


def match_functions(frames: list[Frame], query: str, present: set[int] | None = None) -> list[int]:
    """Codes (1-based) of the frames *query* names, among the codes *present* (default: all).

    A whole-name match (either spelling, or the last part: ``forward`` finds
    ``LlamaMLP > forward``) wins; otherwise the query is searched inside
    names, as the filters do. Only frames that hold bytes count, so a frame
    a filter removed (``adam`` under ``--prune-framework``) cannot shadow the
    ones still shown (``Adam > _init_group``).
    """
    codes = [i + 1 for i in range(len(frames)) if present is None or i + 1 in present]
    exact = [c for c in codes if matches_exactly(frames[c - 1].name, query)]
    if exact:
        return exact
    regex = compile_query(query)
    return [c for c in codes if regex.search(normalize(frames[c - 1].name))]


def no_match_message(frames: list[Frame], query: str) -> str:
    """One line for a query that matched nothing, with the closest names if any."""
    by_normal = {normalize(f.name): f.name for f in frames}
    close = difflib.get_close_matches(normalize(query), list(by_normal), n=3, cutoff=0.5)
    if close:
        return f"no function matches {query!r}; did you mean " + ", ".join(repr(by_normal[c]) for c in close) + "?"
    return f"no function matches {query!r} (see `gpuflame top` for the names in this profile)"


def explain(tree: FlameTree, query: str, limit: int = 5) -> Explanation:
    """The chains into the functions matching *query*, the *limit* widest in full."""
    if not query.strip():
        raise NoSuchFunctionError("the function name is empty (it would match every function)")
    present = set(np.unique(tree.table.codes).tolist()) - {0}
    codes = match_functions(tree.frames, query, present)
    if not codes:
        raise NoSuchFunctionError(no_match_message(tree.frames, query))
    hit = np.zeros(len(tree.frames) + 1, dtype=bool)
    hit[codes] = True
    rows, depths = _outermost_hits(tree, hit)
    nodes, totals = _chain_nodes(tree, rows, depths)
    order = np.argsort(-totals, kind="stable")
    chains = [_chain(tree, nodes[i]) for i in order[:limit].tolist()]
    table = tree.table
    total = int(table.values[rows].sum())
    # self as the chains show it: at their ends; a matched function that one of them calls (two classes'
    # `forward` named alike when the source is missing) holds the rest, within the chains' totals
    self_ = sum(tree.node_self(n) for n in nodes)
    every_self = int(table.values[hit[table.leaf_codes()]].sum())
    return Explanation(
        query=query,
        functions=[tree.frames[c - 1] for c in codes],
        total=total,
        self=self_,
        percent=percent(total, tree.total),
        chains=chains,
        more_chains=max(0, len(nodes) - limit),
        more_total=int(totals[order[limit:]].sum()),
        nested_self=every_self - self_,
    )


def _outermost_hits(tree: FlameTree, hit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows that pass through a matched function, and the depth of its outermost frame."""
    rows, depths = [], []
    codes = tree.table.codes
    step = chunk_rows(codes.shape[1])
    for start in range(0, tree.table.rows, step):
        mask = hit[codes[start : start + step].astype(np.intp)]
        found = np.flatnonzero(mask.any(axis=1))
        rows.append(found + start)
        depths.append(mask[found].argmax(axis=1))
    if not rows:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp)
    return np.concatenate(rows), np.concatenate(depths)


def _chain_nodes(tree: FlameTree, rows: np.ndarray, depths: np.ndarray) -> tuple[list[Node], np.ndarray]:
    """The distinct tree nodes where the chains end, with their totals.

    Every row under such a node passes through it, so the nodes split the
    function's total without overlap.
    """
    nodes: list[Node] = []
    totals: list[np.ndarray] = []
    for depth in np.unique(depths).tolist():
        level = tree.level(depth)
        at = np.unique(np.searchsorted(level.start, rows[depths == depth], side="right") - 1)
        nodes.extend(Node(depth, i) for i in at.tolist())
        totals.append(level.total[at])
    return nodes, np.concatenate(totals) if totals else np.zeros(0, dtype=np.int64)


def _steps(tree: FlameTree, path: list[Node]) -> list[Step]:
    """The steps of a path from a root, each with the lines it ran on the path's rows."""
    end = path[-1]
    level = tree.level(end.depth)
    lines = tree.table.row_lines(int(level.start[end.index]), int(level.end[end.index]), end.depth)
    steps = []
    for node, at in zip(path, lines, strict=True):
        ranked = tuple(sorted(((ln, v) for ln, v in at.items() if v), key=lambda lv: (-abs(lv[1]), lv[0])))
        steps.append(Step(tree.frame(node), tree.node_self(node), tree.node_total(node), ranked))
    return steps


def _chain(tree: FlameTree, node: Node) -> Chain:
    path = tree.path(node)
    steps = _steps(tree, path)
    widest = sorted(tree.children(node), key=lambda c: -tree.node_total(c))[:CALLEES]
    shown = [_steps(tree, path + [c])[-1] for c in widest]
    other = steps[-1].total - steps[-1].self - sum(c.total for c in shown)
    return Chain(steps, percent(steps[-1].total, tree.total), shown, other)
