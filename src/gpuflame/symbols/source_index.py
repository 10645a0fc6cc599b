"""What a Python source text's functions are: the line spans of its code objects.

Parsed once with :mod:`ast` into the spans of its functions, methods, lambdas,
comprehensions and class bodies, each with its ``__qualname__``; a lookup picks the
innermost span holding a line whose name is the frame's ``co_name``. Text in, index
out: reading files and keeping indexes is :mod:`gpuflame.symbols.qualnames`' (per
process) and :mod:`gpuflame.symbols.index_cache`'s (across processes).
"""

from __future__ import annotations

import ast
import threading
from itertools import accumulate
from typing import NamedTuple

from gpuflame.symbols.names import MODULE

# Files beyond this are not parsed: generated code, minified bundles.
MAX_SOURCE_BYTES = 8 * 1024 * 1024

_COMPREHENSIONS = {
    ast.ListComp: "<listcomp>",
    ast.SetComp: "<setcomp>",
    ast.DictComp: "<dictcomp>",
    ast.GeneratorExp: "<genexpr>",
}


class Span(NamedTuple):
    """Lines ``start..end`` (decorators included) of one code object."""

    start: int
    end: int
    depth: int
    name: str
    qualname: str
    parent: int  # index of the enclosing span, -1 at module level


class FileIndex:
    """The spans of one source file, for line lookups.

    Spans nest, so each line's innermost span is painted into one array
    (deeper spans over shallower ones) and the rest of the chain follows
    parent links: a lookup costs the nesting depth, not the file's size.
    """

    def __init__(self, spans: list[Span]) -> None:
        self.spans = spans
        last = max((s.end for s in spans), default=0)
        self._innermost = [-1] * (last + 2)
        for i in sorted(range(len(spans)), key=lambda k: spans[k].depth):
            s = spans[i]
            self._innermost[s.start : s.end + 1] = [i] * (s.end - s.start + 1)
        self._by_name: dict[str, list[Span]] = {}
        for s in spans:
            self._by_name.setdefault(s.name, []).append(s)

    def named(self, name: str) -> list[Span]:
        """Every span of the code objects called *name* in this file."""
        return self._by_name.get(name, [])

    def containing(self, line: int) -> list[Span]:
        """Spans holding *line*, innermost first."""
        i = self._innermost[line] if 0 < line < len(self._innermost) else -1
        out = []
        while i >= 0:
            span = self.spans[i]
            out.append(span)
            i = span.parent
        return out

    def qualname(self, line: int, co_name: str) -> str:
        """The qualname of the code object *co_name* running at *line* (see :meth:`span`)."""
        if co_name == MODULE:
            return MODULE
        span = self.span(line, co_name)
        return span.qualname if span is not None else co_name

    def span(self, line: int, co_name: str) -> Span | None:
        """The span of the code object *co_name* running at *line*.

        The innermost span holding the line with a matching name wins (a
        frame on a decorator line belongs to the enclosing scope, whose name
        is what the frame says). If none matches, the file has likely changed
        since the profile was taken: a name defined exactly once in the file
        is taken from there; otherwise the innermost span holding the line
        (whose name then differs from *co_name*).
        """
        hits = self.containing(line)
        for span in hits:
            if span.name == co_name:
                return span
        # siblings can share a line (a lambda in a comprehension's first
        # iterable): look at every span holding it, not just one chain
        around = [s for s in self.spans if s.start <= line <= s.end and s.name == co_name]
        if around:
            return max(around, key=lambda s: s.depth)
        same_name = self._by_name.get(co_name, ())
        if len(same_name) == 1:
            return same_name[0]
        return hits[0] if hits else None


# Lambdas and comprehensions can only sit on lines holding these words; an
# expression on other lines holds no code object and is not walked (most of a
# file's nodes are such expressions).
_NESTED_CODE_WORDS = (b"lambda", b"for")
_WORD_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


# Nodes that hold no statement body: a code object inside one (a lambda, a
# comprehension) must sit on a marked line, so unmarked ones are skipped whole.
_LEAF_NODES = (
    ast.expr,
    ast.Expr,
    ast.Assign,
    ast.AugAssign,
    ast.AnnAssign,
    ast.Return,
    ast.Raise,
    ast.Assert,
    ast.Delete,
    ast.Pass,
    ast.Break,
    ast.Continue,
    ast.Import,
    ast.ImportFrom,
    ast.Global,
    ast.Nonlocal,
)


# CPython 3.11's AST constructor keeps its recursion depth per interpreter, not per thread: two threads
# parsing at once can fail with "SystemError: AST constructor recursion depth mismatch" (seen in the suite)
_PARSE_LOCK = threading.Lock()


def index_source(source: str | bytes) -> FileIndex:
    """Index Python source text; raises SyntaxError/ValueError on bad input."""
    with _PARSE_LOCK:
        tree = ast.parse(source)
    raw = source.encode("utf-8", "replace") if isinstance(source, str) else source
    spans: list[Span] = []
    _collect(tree, spans, _line_marks(raw))
    return FileIndex(spans)


def _line_marks(source: bytes) -> list[int]:
    """Prefix counts of lines that may hold a lambda or comprehension (the words, found in C)."""
    hits = []
    find = source.find
    for word in _NESTED_CODE_WORDS:
        pos = find(word)
        while pos >= 0:
            end = pos + len(word)
            if (pos == 0 or source[pos - 1] not in _WORD_BYTES) and source[end : end + 1] not in _WORD_TAILS:
                hits.append(pos)
            pos = find(word, end)
    hits.sort()
    marks = [0] * (source.count(b"\n") + 3)
    line, last = 1, 0
    count = source.count
    for pos in hits:
        line += count(b"\n", last, pos)
        last = pos
        marks[line] = 1
    return list(accumulate(marks))


_WORD_TAILS = frozenset(bytes([b]) for b in _WORD_BYTES)


def _collect(tree: ast.AST, spans: list[Span], marks: list[int]) -> None:
    """Name every code object as CPython's ``__qualname__`` does.

    Iterative (a generated file can nest deeper than the recursion limit).
    Decorators, default values, annotations, class bases and a
    comprehension's first iterable run in the enclosing scope, so they are
    walked with the outer prefix; bodies get the inner one.
    """
    functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    top = len(marks) - 1
    # (node to visit, qualname prefix of its scope, depth of its scope, index of its span)
    stack: list[tuple[ast.AST, str, int, int]] = [(c, "", 0, -1) for c in ast.iter_child_nodes(tree)]
    while stack:
        node, prefix, depth, parent = stack.pop()
        if isinstance(node, _LEAF_NODES):
            first = min(node.lineno, top)
            last = min(getattr(node, "end_lineno", None) or first, top)
            if marks[last] == marks[first - 1]:
                continue
        span = _span_of(node, prefix, depth + 1, parent)
        if span is None:
            stack.extend((c, prefix, depth, parent) for c in ast.iter_child_nodes(node))
            continue
        here = len(spans)
        spans.append(span)
        # functions and lambdas add <locals> for what they hold; class bodies
        # and comprehensions do not (as CPython's compiler names them)
        inner = span.qualname + (".<locals>." if isinstance(node, functions) else ".")
        outer_parts, inner_parts = _scopes(node)
        stack.extend((part, prefix, depth, parent) for part in outer_parts)
        stack.extend((part, inner, depth + 1, here) for part in inner_parts)


def _scopes(node: ast.AST) -> tuple[list[ast.AST], list[ast.AST]]:
    """The children of a code-object node evaluated outside it, and inside it."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        outer: list[ast.AST] = list(getattr(node, "decorator_list", []))
        args = node.args
        outer += [d for d in args.defaults] + [d for d in args.kw_defaults if d is not None]
        every_arg = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
        outer += [a.annotation for a in every_arg if a.annotation is not None]
        returns = getattr(node, "returns", None)
        if returns is not None:
            outer.append(returns)
        body = node.body if isinstance(node.body, list) else [node.body]
        return outer, list(body)
    if isinstance(node, ast.ClassDef):
        outer_nodes: list[ast.AST] = [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]
        return outer_nodes, list(node.body)
    # a comprehension: the first iterable is evaluated outside
    generators = node.generators  # type: ignore[attr-defined]
    outer = [generators[0].iter]
    inner: list[ast.AST] = [g for g in generators[1:]]
    inner += [generators[0].target] + list(generators[0].ifs)
    inner += [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]  # type: ignore[attr-defined]
    return outer, inner


def _span_of(node: ast.AST, prefix: str, depth: int, parent: int) -> Span | None:
    """A span for a node that makes a code object; None for any other node."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        name = node.name
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    elif isinstance(node, ast.Lambda):
        name, start = "<lambda>", node.lineno
    elif type(node) in _COMPREHENSIONS:
        name, start = _COMPREHENSIONS[type(node)], node.lineno  # type: ignore[attr-defined]
    else:
        return None
    end = getattr(node, "end_lineno", None) or start
    return Span(start, end, depth, name, prefix + name, parent)
