"""PyTorch's ``stacks="all"`` frame lists read into one stack, in the right order.

``_record_memory_history(stacks="all")`` (the default) records each
allocation's C++ stack and Python stack and merges them, leaf first, with
PyTorch's combined unwinder: it walks the C++ frames and, before each
C frame whose name holds ``PyEval_EvalFrame`` (CPython's eval loop), puts
the next Python frame. On CPython 3.10 each Python frame has its own eval
frame, so the list interleaves exactly. On 3.11 and later one eval frame
runs many Python frames (calls between Python functions stay inside it), so
the unwinder runs out of eval frames first and appends the leftover Python
frames *after* the native root (``_start``)::

    allocator..., at::_ops::zeros_like::call, THPVariable_zeros_like,
    cfunction_call, step optimizers.py:82, _PyEval_EvalFrameDefault,
    PyEval_EvalCode, Py_RunMain, __libc_start_main, _start,
    wrapper optimizer.py:493, <module> benchmark.py:441

What the stack becomes (leaf first, as profiles store it):

* the Python frames, in list order, are the Python stack; its root is the
  outermost one (``<module>``);
* by default the leaf is the Python frame that made the call, with the op it
  called as one frame above it (``aten::zeros_like``, from the outermost
  ``at::_ops::<op>::call``), and no other native frame;
* with *native* (``--native``), the C++ frames between the allocation and the
  Python caller are kept (names shortened by
  :func:`gpuflame.symbols.names.short_cpp_name`), each run of CPython's own C
  frames becomes one ``<interpreter trampoline>``, and C++ frames between two
  Python frames stay between them when their place is known (the list
  interleaves exactly); when leftover Python frames show their place is not
  known, they are left out and counted (:attr:`StackReader.unplaced`);
* always cut: the recorder's own frames (``torch::unwind``,
  ``CapturedTraceback``, ``gather_with_cpp``), the caching allocator's
  (``c10::cuda::CUDACachingAllocator::…``), the dispatcher's glue (boxing
  wrappers and the generated ``Register*.cpp`` kernel wrappers, as torch's
  ``_memory_viz`` leaves them out), and everything below the
  outermost Python frame (interpreter and process start-up: ``Py_RunMain``,
  ``__libc_start_main``, ``_start``, and the libc symbols a stripped build
  shows in their place);
* a stack without Python frames from autograd's engine (its device threads
  run the backward pass) becomes ``<backward pass>`` > the graph node
  (``MulBackward0``) > the op; other stacks without Python frames become
  ``<no Python frame>`` > the op. The thread's start frames (``start_thread``,
  ``clone``) are cut.
* a stack whose Python frames autograd's engine called (a custom
  ``torch.autograd.Function``'s backward: the engine below its outermost
  Python frame, or with ``stacks="python"`` that frame being
  ``BackwardCFunction > apply``) is rooted at ``<backward pass>`` too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import NamedTuple

from gpuflame.model.profile import NATIVE, PYTHON, SYNTHETIC, TRAMPOLINE_KIND, Frame
from gpuflame.printable import encodable
from gpuflame.symbols import names

# Frame classes.
PY = 0  # a Python frame
EVAL = 1  # CPython's eval loop: where the unwinder put a Python frame
CPY = 2  # CPython's other C frames (call machinery, start-up)
CUT = 3  # the recorder's and the caching allocator's own frames
CPP = 4  # any other native frame

# The recorder (torch's unwinder, called from the allocator) and the caching
# allocator itself: the same at the leaf of every stack.
_CUT = re.compile(
    r"torch::unwind::|CapturedTraceback::|gather_with_cpp|c10::cuda::CUDACachingAllocator::"
    r"|c10::cuda::MemPool|CUDAAllocatorConfig"
)
# The dispatcher's glue between an op and its kernel (what torch's _memory_viz
# also leaves out: boxing wrappers, the generated Register*.cpp kernels' wrappers).
_GLUE_NAME = re.compile(
    r"^c10::impl::(wrap_kernel_functor_unboxed_|make_boxed_from_unboxed_functor|BoxedKernelWrapper|call_functor)"
    r"|^c10::(Dispatcher|KernelFunction|BoxedKernel|OperatorHandle|TypedOperatorHandle)\b"
)
_GLUE_FILE = re.compile(r"core/boxing/|(^|/)Register\w*\.cpp$|(^|/)Redispatch")
# CPython's C frames, by exported name (a stripped libpython shows the nearest
# exported symbol, still Py-prefixed) or by the static functions' names.
_CPYTHON_NAME = re.compile(
    r"^_?_?Py[A-Z_]"
    r"|^(cfunction_|method_vectorcall|slot_(tp|nb|sq|mp|am)_|vectorcall_|builtin_|pymain_|pyrun_"
    r"|do_call_core$|call_function$|function_code_fastcall$|binary_op1?$|partial_(vectorcall|call)$"
    r"|gen_send_ex2?$|task_step(_impl)?$|context_run$|run_mod$|run_eval_code_obj$|object_vacall$"
    r"|thread_run$|pythread_wrapper$|\w+_dealloc$|main$)"
)
_CPYTHON_FILE = re.compile(
    r"(^|/)([cC]?[pP]ython-?3[^/]*|cpython)/(Python|Objects|Modules|Include|Parser)/|(^|/)libpython3[^/]*$"
)
_PYTHON_FILE = re.compile(r"\.(py|pyw|pyx|pyi)$|^<")
_NATIVE_FILE = re.compile(r"\.(c|cc|cpp|cxx|h|hh|hpp|hxx|cu|cuh|inl|s|S|o)$|\.so(\.[0-9.]+)?$|^\?\?$")
_SUFFIX = re.compile(r"\.(llvm|constprop|isra|part|cold)\.\d+$")
# autograd's engine: its device threads run the backward pass
_ENGINE = re.compile(r"torch::autograd::(python::Python)?Engine::")
# where a native thread starts (a stripped libc names what lies below by its
# nearest exported symbol, so everything from here to the root goes)
_THREAD_START = re.compile(
    r"^(start_thread|__?clone3?|clone3?|execute_native_thread_routine|__libc_start_main|_start|thread_run)$"
)
_NODE = re.compile(r"^torch::autograd::(?:generated::)?(\w+)::apply(?:_impl)?(?:<…>)?$")

BACKWARD_FRAME = Frame(names.BACKWARD_PASS, kind=SYNTHETIC)
NO_PYTHON_FRAME = Frame(names.NO_PYTHON_FRAME, kind=SYNTHETIC)
TRAMPOLINE_FRAME = Frame(names.TRAMPOLINE_NAME, kind=TRAMPOLINE_KIND)


def is_python_frame(file: str, name: str) -> bool:
    """Python frames carry a source file; C++ frames a C/C++ file, a library, or ``??``."""
    if _PYTHON_FILE.search(file):
        return True
    if not file or _NATIVE_FILE.search(file):
        return False
    return "::" not in name and "(" not in name


def frame_class(file: str, name: str) -> int:
    """PY, EVAL, CPY, CUT or CPP for one frame of a snapshot."""
    if is_python_frame(file, name):
        return PY
    if "PyEval_EvalFrame" in name:  # the unwinder's own test
        return EVAL
    if _CUT.search(name) or _GLUE_NAME.search(name) or _GLUE_FILE.search(file):
        return CUT
    plain = _SUFFIX.sub("", name)
    if _CPYTHON_NAME.search(plain) or _CPYTHON_FILE.search(file):
        return CPY
    return CPP


class Entry(NamedTuple):
    """One distinct snapshot frame, classified once."""

    cls: int
    frame: Frame  # as shown (Python: qualified; native: shortened)
    op: str | None  # "aten::zeros_like" for at::_ops::zeros_like::call
    node: str | None  # "MulBackward0" for an autograd node's apply
    engine: bool  # a frame of autograd's engine
    thread_start: bool  # where a native thread (or the process) starts


def make_entry(file: str, line: int, name: str, python_name: Callable[[str, int, str], tuple[str, int]]) -> Entry:
    """Classify and name one frame; *python_name* gives a Python frame's label and def line (0: unknown)."""
    file, name = encodable(file), encodable(name)  # a pickle's string may hold a lone surrogate
    cls = frame_class(file, name)
    if cls == PY:
        label, start = python_name(file, line, name) if name else (names.UNKNOWN, 0)
        return Entry(cls, Frame(label, file, line, PYTHON, start), None, None, False, False)
    short = names.short_cpp_name(name) if name else "??"
    frame = Frame(short, "" if file == "??" else file, line, NATIVE)
    node = _NODE.match(short)
    return Entry(
        cls,
        frame,
        names.aten_op_name(name),
        node.group(1) if node else None,
        bool(_ENGINE.search(short)),
        bool(_THREAD_START.match(_SUFFIX.sub("", name))),
    )


def _run_by_autograd(root: Frame, below: Sequence[Entry]) -> bool:
    """Whether the stack's outermost Python frame was called by autograd's engine: the backward pass.

    With C++ frames the engine is among those below it; in a Python-only
    stack (``stacks="python"``) the root is then a custom Function's
    backward node, ``BackwardCFunction.apply``, which only the engine calls
    (on autograd's own thread: on the caller's, the caller's frames lie below).
    """
    if any(e.engine for e in below):
        return True
    return root.name == _BACKWARD_NODE and root.file.replace("\\", "/").endswith(_BACKWARD_NODE_FILE)


_BACKWARD_NODE = "BackwardCFunction > apply"
_BACKWARD_NODE_FILE = "torch/autograd/function.py"


class StackReader:
    """Entries of one frame list (leaf first) -> the profile's stack (frames, leaf first)."""

    def __init__(self, native: bool = False) -> None:
        self.native = native
        self.unplaced = 0  # stacks whose C++ frames between Python frames had no known place

    def read(self, entries: Sequence[Entry]) -> list[Frame]:
        python = [i for i, e in enumerate(entries) if e.cls == PY]
        if not python:
            return self._without_python(entries)
        leaf = self._leaf_part(entries[: python[0]])
        evals = sum(1 for e in entries if e.cls == EVAL)
        interleaved = min(len(python), evals)
        exact = len(python) <= evals
        out = leaf
        unplaced = False
        for n, i in enumerate(python):
            out.append(entries[i].frame)
            if self.native and n + 1 < interleaved:
                middle = entries[i + 1 : python[n + 1]]
                if exact:
                    out += self._native_run(middle)
                else:  # which Python frames these C frames sit between is not known: left out
                    unplaced = unplaced or any(e.cls == CPP for e in middle)
        self.unplaced += unplaced
        if _run_by_autograd(out[-1], entries[python[-1] + 1 :]):
            out.append(BACKWARD_FRAME)
        return out

    def _leaf_part(self, natives: Sequence[Entry]) -> list[Frame]:
        """The frames above the leaf Python frame: the op, or with *native* the C++ chain.

        Without eval-loop frames to interleave at, the unwinder puts every
        Python frame after the whole C++ stack: its start-up frames go.
        """
        if self.native:
            start = next((i for i, e in enumerate(natives) if e.thread_start), len(natives))
            frames = self._native_run(natives[:start])
            while frames and frames[-1] is TRAMPOLINE_FRAME and start < len(natives):
                frames.pop()
            return frames
        op = next((e.op for e in reversed(natives) if e.op), None)
        return [Frame(op, kind=NATIVE)] if op else []

    def _native_run(self, natives: Sequence[Entry]) -> list[Frame]:
        """C++ frames kept; CPython's C frames as one trampoline per run; cut frames gone."""
        out: list[Frame] = []
        for e in natives:
            if e.cls == CPP:
                if not out or out[-1].name != e.frame.name:  # overloads calling each other: one frame
                    out.append(e.frame)
            elif e.cls in (EVAL, CPY) and (not out or out[-1] is not TRAMPOLINE_FRAME):
                out.append(TRAMPOLINE_FRAME)
        return out

    def _without_python(self, entries: Sequence[Entry]) -> list[Frame]:
        """A thread with no Python frame: autograd's backward pass, or another native thread."""
        engine = [i for i, e in enumerate(entries) if e.engine]
        root = BACKWARD_FRAME if engine else NO_PYTHON_FRAME
        if engine:
            body = entries[: engine[-1] + 1]
        else:
            start = next((i for i, e in enumerate(entries) if e.thread_start), len(entries))
            body = entries[:start]
        if self.native:
            frames = self._native_run(body)
            while frames and frames[-1] is TRAMPOLINE_FRAME:
                frames.pop()
            return frames + [root]
        op = next((e.op for e in reversed(body) if e.op), None)
        node = next((e.node for e in reversed(body) if e.node), None)
        out = [Frame(op, kind=NATIVE)] if op else []
        if node:
            out.append(Frame(node, kind=NATIVE))
        return out + [root]
