"""Frame names per the AKS flame-graph reading guide's table, and search that accepts both spellings.

| label                     | meaning                                   |
| ------------------------- | ----------------------------------------- |
| ``Foo > bar``             | method ``bar`` of class ``Foo``           |
| ``Foo > __init__``        | constructor of ``Foo``                    |
| ``bar``                   | module-level function ``bar``             |
| ``<module>``              | a script's or module's top level          |
| ``<interpreter trampoline>`` | CPython's own dispatch, ignorable      |
| ``0x7f151…``              | native code with no symbol                |

Frames gpuflame adds to PyTorch snapshots (formats/torch_frames.py):
``aten::zeros_like`` (the op an allocation came from, above the Python
caller), ``<backward pass>`` (autograd's threads, no Python frame),
``<allocator rounding>`` (block size minus the bytes asked for).
"""

from __future__ import annotations

import re

SEPARATOR = " > "
MODULE = "<module>"
TRAMPOLINE_NAME = "<interpreter trampoline>"
CACHED_FREE = "<cached free blocks>"
ALLOCATOR_ROUNDING = "<allocator rounding>"
OUTSIDE_FRAMEWORK = "<outside framework>"
UNKNOWN = "<unknown>"

_LOCALS = ".<locals>."


def display_name(qualname: str) -> str:
    """``LlamaMLP.forward`` -> ``LlamaMLP > forward``.

    Functions defined inside functions keep their enclosing function as the
    owner (``outer.<locals>.inner`` -> ``outer > inner``), since that is how a
    reader finds them in the source. Names in angle brackets (``<module>``,
    ``<lambda>``, ``<listcomp>``) keep their dots.
    """
    if not qualname or "." not in qualname:
        return qualname
    parts = [p for p in qualname.replace(_LOCALS, ".").split(".") if p]
    return SEPARATOR.join(parts) if parts else qualname


def native_address_name(address: int) -> str:
    """A native frame with no symbol is shown as its raw address, as the AKS guide shows it."""
    return f"0x{address:x}"


_SPACES_AROUND_GT = re.compile(r"\s*>\s*")


def normalize(name: str) -> str:
    """One spelling for search: ``Foo > bar``, ``Foo>bar`` and ``Foo.bar`` all become ``foo.bar``."""
    return _SPACES_AROUND_GT.sub(".", name.strip()).casefold()


def matches(name: str, query: str) -> bool:
    """Substring search on normalized names, so ``Foo.bar`` finds ``Foo > bar``."""
    return normalize(query) in normalize(name)


def matches_exactly(name: str, query: str) -> bool:
    """Whole-name match, either spelling; or the last part (``bar`` finds ``Foo > bar``)."""
    n, q = normalize(name), normalize(query)
    return n == q or n.endswith("." + q)


def compile_query(query: str) -> re.Pattern[str]:
    """A regular expression over normalized names; plain text is matched literally.

    Users type ``LlamaMLP.forward`` far more often than regexes, so a query is
    taken as a regex only when it compiles and contains regex syntax other than
    the dot.
    """
    q = normalize(query)
    if re.search(r"[\\^$*+?{}\[\]|()]", q):
        try:
            return re.compile(q)
        except re.error:
            pass
    return re.compile(re.escape(q))


# -- C++ names ----------------------------------------------------------------

BACKWARD_PASS = "<backward pass>"
NO_PYTHON_FRAME = "<no Python frame>"

# Demangler decorations that say nothing to a reader: clones, LLVM's and GCC's
# local-symbol suffixes.
_CPP_NOISE = re.compile(r" \[clone [^\]]*\]|\.(llvm|constprop|isra|part|cold)\.\d+")
_ANONYMOUS = "(anonymous namespace)::"
_LAMBDA = re.compile(r"\{lambda\([^{}]*\)#(\d+)\}")
_TRAILING_QUALIFIERS = (" const", " volatile", " &&", " &", " noexcept")
# at::_ops::<op>[_<overload>]::call: the struct name joins the op and its
# overload with "_"; these overload names are split off as ``aten::op.overload``.
_OVERLOADS = frozenset(
    (
        "Tensor",
        "Scalar",
        "Tensor_Tensor",
        "Tensor_Scalar",
        "Scalar_Tensor",
        "memory_format",
        "int",
        "dim",
        "dim_IntList",
        "out",
        "self",
        "other",
        "names",
        "using_ints",
        "SymInt",
        "Tensor_mode",
        "input",
    )
)
_OP_CALL = re.compile(r"^at::_ops::(\w+)::(call|redispatch)\(")


def short_cpp_name(name: str) -> str:
    """A demangled C++ name without its argument list, template arguments and return type.

    ``at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, ...)``
    becomes ``at::detail::_empty_generic<…>``; ``torch::autograd::Node::operator()(...)``
    keeps its ``operator()``. Anonymous namespaces and clone suffixes go.
    Anything that does not parse as C++ comes back unchanged.
    """
    if "(" not in name and "<" not in name and "." not in name:
        return name
    text = _CPP_NOISE.sub("", name).replace(_ANONYMOUS, "")
    text = _LAMBDA.sub(r"{lambda#\1}", text)
    operators: list[str] = []

    def keep(m: re.Match[str]) -> str:
        operators.append(m.group(0))
        return f"\x00{len(operators) - 1}\x00"

    text = _OPERATOR.sub(keep, text)
    changed = True
    while changed:
        changed = False
        for q in _TRAILING_QUALIFIERS:
            if text.endswith(q):
                text, changed = text[: -len(q)], True
    count = 1
    while count:  # innermost brackets first: <...> becomes a mark, (...) goes
        text, count = _INNERMOST.subn(lambda m: "\x01" if m.group(0)[0] == "<" else "", text)
    text = text.replace("\x01", "<…>").strip().rsplit(" ", 1)[-1]  # the return type goes
    text = _PLACEHOLDER.sub(lambda m: operators[int(m.group(1))], text)
    return text or name


_OPERATOR = re.compile(r"\boperator\s*(\(\)|\[\]|<=>|<<=?|>>=?|<=|>=|->\*?|[-+*/%^&|~!=,<>]=?)")
_INNERMOST = re.compile(r"<[^<>()]*>|\([^<>()]*\)")
_PLACEHOLDER = re.compile("\x00(\\d+)\x00")


def aten_op_name(name: str) -> str | None:
    """``at::_ops::zeros_like::call(...)`` -> ``aten::zeros_like``; None for other frames.

    The struct name joins the op and its overload with ``_``
    (``index_Tensor`` is ``aten::index.Tensor``); common overload names are
    split off, others stay joined, as no name list is at hand offline.
    """
    m = _OP_CALL.match(name)
    if m is None:
        return None
    op = m.group(1)
    for overload in sorted(_OVERLOADS, key=len, reverse=True):
        if op.endswith("_" + overload) and len(op) > len(overload) + 1:
            return f"aten::{op[: -len(overload) - 1]}.{overload}"
    return f"aten::{op}"
