"""``stacks="all"`` frame lists read into the right tree (formats/torch_frames.py).

Two kinds of input: REAL snapshots other people recorded on their GPUs
(tests/data, sources in tests/data/README.md), and HAND-WRITTEN STAND-INS
for each frame layout (tests/fixtures/make_snapshots.py: CPython 3.10's one
eval frame per Python frame, a stripped CPython 3.11+ whose leftover Python
frames come after ``_start``, autograd's device thread without Python
frames), merged the way PyTorch's combined unwinder merges them.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuflame.formats import torch_snapshot
from gpuflame.formats.snapshot_blocks import NO_STACK_FRAME
from gpuflame.formats.torch_frames import CPY, CUT, EVAL, frame_class
from gpuflame.model import Profile
from gpuflame.model import filter as pfilter
from gpuflame.model.profile import NATIVE, PYTHON, SYNTHETIC, TRAMPOLINE_KIND
from gpuflame.symbols.names import BACKWARD_PASS, MODULE, TRAMPOLINE_NAME, aten_op_name, short_cpp_name
from tests.helpers.paths import DATA

make_snapshots = pytest.importorskip("tests.fixtures.make_snapshots")  # needs torch (a test dependency)

REAL = sorted(DATA.glob("torch-snapshot-*.pickle.gz"))
LAYOUTS = {"py310": "handwritten_native_frames", "py311": "handwritten_native_frames_py311"}

# what must never be shown: the recorder, the allocator, interpreter and thread start-up
NEVER_PART = ("unwind::unwind", "CapturedTraceback", "gather_with_cpp", "CUDACachingAllocator", "PyEval_EvalFrame")
NEVER = {
    "_start",
    "__libc_start_main",
    "__libc_init_first",
    "Py_RunMain",
    "Py_BytesMain",
    "PyMethod_New",
    "PyType_GetModule",
    "PyCode_NewWithPosOnlyArgs",
    "clone",
    "__clone",
    "__clone3",
    "__xmknodat",
    "pthread_condattr_setpshared",
    "execute_native_thread_routine",
    "start_thread",
    "_PyObject_MakeTpCall",
    "std::error_code::default_error_condition",
    "cfunction_call",
    "slot_tp_call",
}


def shown_wrongly(frames: list[Any]) -> list[str]:
    natives = [f for f in frames if f.kind != PYTHON]  # a Python function may well be called clone
    return [f.name for f in natives if f.name in NEVER or any(p in f.name for p in NEVER_PART)]


@pytest.fixture(scope="module")
def snapshots() -> dict[str, dict[str, Any]]:
    st = make_snapshots.Stacks()
    return {name: make_snapshots.FIXTURES[name](st) for name in LAYOUTS.values()}


def convert(snap: dict[str, Any], native: bool = False) -> Profile:
    return torch_snapshot.from_snapshot(snap, native=native)


def stacks(profile: Profile, type_name: str = "alloc_space") -> list[list[Any]]:
    """Every stack with bytes of *type_name*, root first."""
    i = profile.type_index(type_name)
    return [list(reversed(profile.stack_frames(s))) for s in profile.samples if s.values[i]]


def python_frames_in_order(frames: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """The list's Python frames (file, line), root first: the truth the fixture was built from."""
    return [(f["filename"], f["line"]) for f in reversed(frames) if f["filename"].endswith(".py")]


def alloc_entries(snap: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in snap["device_traces"][0] if e["action"] == "alloc"]


def one_event(snap: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    return {"segments": [], "device_traces": [[entry]]}


# -- the hand-written layouts ------------------------------------------------------


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_default_view_is_the_python_chain_with_the_op_above_the_leaf(snapshots, layout: str) -> None:
    snap = snapshots[LAYOUTS[layout]]
    seen = 0
    for entry in alloc_entries(snap):
        truth = python_frames_in_order(entry["frames"])
        if not truth:
            continue
        (stack,) = stacks(convert(one_event(snap, entry)))
        assert [(f.file, f.line) for f in stack[:-1]] == truth  # every Python frame, in order
        assert stack[0].name == MODULE and all(f.kind == PYTHON for f in stack[:-1])
        assert stack[-1] == stack[-1]._replace(name="aten::empty.memory_format", kind=NATIVE)
        seen += 1
    assert seen > 10


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_native_view_keeps_the_cpp_chain_above_the_python_caller(snapshots, layout: str) -> None:
    snap = snapshots[LAYOUTS[layout]]
    entry = next(e for e in alloc_entries(snap) if len(python_frames_in_order(e["frames"])) > 4)
    profile = convert(one_event(snap, entry), native=True)
    (stack,) = stacks(profile)
    names = [f.name for f in stack]
    python = [(f.file, f.line) for f in stack if f.kind == PYTHON]
    assert python == python_frames_in_order(entry["frames"])
    leaf_python = max(i for i, f in enumerate(stack) if f.kind == PYTHON)
    assert names[leaf_python + 1 :] == [
        TRAMPOLINE_NAME,  # cfunction_call (or its stripped stand-in)
        "torch::autograd::THPVariable_zeros",
        "??",
        "at::_ops::empty_memory_format::call",
        "at::_ops::empty_memory_format::redispatch",
        "at::detail::empty_generic",
        "at::detail::_empty_generic<…>",
    ]
    assert names[0] == MODULE
    assert not shown_wrongly(stack)
    between = names[:leaf_python]  # CPython's frames between Python frames: placed on 3.10 only
    assert (TRAMPOLINE_NAME in between) == (layout == "py310")
    for a, b in zip(stack, stack[1:], strict=False):
        assert not (a.kind == TRAMPOLINE_KIND and b.kind == TRAMPOLINE_KIND)


def test_cpp_between_python_frames_stays_in_place_on_310_and_is_counted_on_311(snapshots) -> None:
    st = make_snapshots.Stacks()
    python = st.mlp_gate
    exact = make_snapshots.with_native_frames(python, "py310")
    exact[exact.index(python[3]) + 2 : exact.index(python[3]) + 2] = [
        make_snapshots.native(*make_snapshots._FUNCTION_APPLY)
    ]
    entry = {"action": "alloc", "addr": 1, "size": 512, "time_us": 1, "frames": exact}
    (stack,) = stacks(convert({"segments": [], "device_traces": [[entry]]}, native=True))
    names = [f.name for f in stack]
    at = names.index("THPFunction_apply")
    assert (stack[at + 2].file, stack[at + 2].line) == (python[3]["filename"], python[3]["line"])
    assert (stack[at - 2].file, stack[at - 2].line) == (python[4]["filename"], python[4]["line"])

    leftover = make_snapshots.with_native_frames(python, "py311")
    entry = {"action": "alloc", "addr": 1, "size": 512, "time_us": 1, "frames": leftover}
    profile = convert({"segments": [], "device_traces": [[entry]]}, native=True)
    assert "THPFunction_apply" not in [f.name for f in profile.frames]
    assert any("1 stacks had C++ frames between two Python frames" in c for c in profile.comments)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_autograd_thread_is_the_backward_pass(snapshots, layout: str) -> None:
    snap = snapshots[LAYOUTS[layout]]
    default = [s for s in stacks(convert(snap)) if s[0].name == BACKWARD_PASS]
    chains = {tuple(f.name for f in s) for s in default}
    assert chains == {
        (BACKWARD_PASS, "MulBackward0", "aten::mul.Tensor"),
        (BACKWARD_PASS, "MmBackward0", "aten::mm"),
    }
    native = [s for s in stacks(convert(snap, native=True)) if s[0].name == BACKWARD_PASS]
    assert native
    for s in native:
        names = [f.name for f in s]
        assert names[1] == "torch::autograd::python::PythonEngine::thread_init"
        assert names[-1] == "at::detail::_empty_generic<…>"
        assert not shown_wrongly(s)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_no_recorder_allocator_or_startup_frame_in_either_view(snapshots, layout: str) -> None:
    for native in (False, True):
        profile = convert(snapshots[LAYOUTS[layout]], native=native)
        for stack in stacks(profile, "inuse_space") + stacks(profile, "peak_space"):
            assert stack[0].name in (MODULE, BACKWARD_PASS) or stack[0].kind == SYNTHETIC
            assert not shown_wrongly(stack)


def test_cpython_frames_are_told_apart_from_torchs() -> None:
    assert frame_class("??", "_PyEval_EvalFrameDefault") == EVAL
    assert frame_class("/usr/src/python-3.10.14/Include/internal/pycore_ceval.h", "_PyEval_EvalFrame") == EVAL
    for name in (
        "PyMethod_New",
        "cfunction_call",
        "method_vectorcall.llvm.1227",
        "slot_tp_call",
        "pymain_run_file",
        "Py_RunMain",
        "do_call_core",
        "run_mod.llvm.9196",
    ):
        assert frame_class("??", name) == CPY, name
    assert frame_class("/x/python-3.10.14/Modules/_functoolsmodule.c", "partial_vectorcall") == CPY
    for name in (
        "torch::unwind::unwind()",
        "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**)",
    ):
        assert frame_class("??", name) == CUT
    glue = "c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::WrapFunctionIntoFunctor_<x> >::call(y)"
    assert frame_class("RegisterCUDA_0.cpp", glue) == CUT
    assert (
        frame_class("RegisterCUDA_0.cpp", "at::(anonymous namespace)::wrapper_CUDA_mul_Tensor(at::Tensor const&)")
        == CUT
    )
    for name in ("THPFunction_apply(_object*, _object*)", "torch::autograd::THPVariable_mul(_object*)", "_start"):
        assert frame_class("??", name) not in (CPY, CUT, EVAL), name


# -- real snapshots -----------------------------------------------------------------


@pytest.fixture(scope="module", params=[p.name for p in REAL])
def real(request) -> tuple[bytes, Profile, Profile]:
    data = (DATA / request.param).read_bytes()
    return data, torch_snapshot.decode(data), torch_snapshot.decode(data, native=True)


def test_real_snapshots_are_here() -> None:
    assert len(REAL) >= 4


def test_real_snapshots_read_right(real, request) -> None:
    _, profile, native = real
    for p in (profile, native):
        for type_name in ("peak_space", "inuse_space", "alloc_space"):
            for stack in stacks(p, type_name):
                assert stack[0].name in (MODULE, BACKWARD_PASS) or stack[0].kind == SYNTHETIC, stack[0]
                assert not shown_wrongly(stack), [f.name for f in stack]
                # entry -> ... -> allocating function: no native frame between Python frames by default
                if p is profile:
                    kinds = [f.kind for f in stack[1:-1]]
                    assert NATIVE not in kinds or stack[0].name == BACKWARD_PASS
    leaves = {f.kind for f in (profile.stack_frames(s)[0] for s in profile.samples)}
    assert leaves <= {PYTHON, NATIVE, SYNTHETIC}
    natives = {f.name for f in profile.frames if f.kind == NATIVE}  # none where stacks="python"
    assert all(
        n.startswith("aten::") or n.endswith("Backward0") or "Backward" in n or n[0].isupper() for n in natives
    ), natives


# recorded with stacks="python": the backward pass's allocations (autograd's thread) have no Python frames
STACKLESS_BACKWARD = {"torch-snapshot-MAGMA27-memory_snapshot.pickle.gz"}


def test_real_snapshot_widest_leaves_are_ops_or_python(real, request) -> None:
    _, profile, _ = real
    live = pfilter.ignore(pfilter.ignore(profile, "<cached free blocks>"), "<allocator rounding>")
    i = live.type_index("alloc_space")
    by_leaf: dict[str, int] = {}
    for s in live.samples:
        leaf = live.frames[s.stack[0]]
        by_leaf[leaf.name] = by_leaf.get(leaf.name, 0) + s.values[i]
    widest = sorted(by_leaf, key=by_leaf.get, reverse=True)[:5]
    if request.node.callspec.params["real"] in STACKLESS_BACKWARD:  # said as such, not misplaced
        assert widest[0] == NO_STACK_FRAME.name and by_leaf[widest[0]] > sum(by_leaf.values()) / 2, widest
        widest = widest[1:]
    assert all(n.startswith("aten::") or not n.startswith("<") for n in widest), widest


def test_real_snapshot_names_are_short(real) -> None:
    _, _, native = real
    for f in native.frames:
        if f.kind == NATIVE:
            assert "(" not in f.name.replace("operator()", "") and "std::allocator" not in f.name, f.name


# -- C++ names ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("demangled", "shown"),
    [
        (
            "at::TensorBase at::detail::_empty_strided_generic<c10::ArrayRef<long> >(c10::ArrayRef<long>)",
            "at::detail::_empty_strided_generic<…>",
        ),
        (
            "torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)",
            "torch::autograd::Node::operator()",
        ),
        ("c10::TensorImpl::~TensorImpl() [clone .localalias]", "c10::TensorImpl::~TensorImpl"),
        ("at::(anonymous namespace)::create_out(c10::ArrayRef<long>, c10::TensorOptions const&)", "at::create_out"),
        (
            "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long) const",
            "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate",
        ),
        (
            "_object* torch::autograd::TypeError_to_NotImplemented_<&torch::autograd::THPVariable_mul>(_object*)",
            "torch::autograd::TypeError_to_NotImplemented_<…>",
        ),
        (
            "at::native::foo(int)::{lambda(at::Tensor const&)#1}::operator()(at::Tensor const&) const",
            "at::native::foo::{lambda#1}::operator()",
        ),
        ("std::ostream& c10::operator<<(std::ostream&, c10::Device)", "c10::operator<<"),
        ("bool operator<(a const&, b const&)", "operator<"),
        ("method_vectorcall.llvm.12275804309777372242", "method_vectorcall"),
        ("_start", "_start"),
        ("??", "??"),
    ],
)
def test_cpp_names_are_shown_without_arguments_templates_or_return_types(demangled: str, shown: str) -> None:
    assert short_cpp_name(demangled) == shown


@pytest.mark.parametrize(
    ("demangled", "op"),
    [
        ("at::_ops::zeros_like::call(at::Tensor const&, std::optional<c10::ScalarType>)", "aten::zeros_like"),
        (
            "at::_ops::index_Tensor::call(at::Tensor const&, c10::List<std::optional<at::Tensor> > const&)",
            "aten::index.Tensor",
        ),
        ("at::_ops::add__Tensor::call(at::Tensor&, at::Tensor const&, c10::Scalar const&)", "aten::add_.Tensor"),
        ("at::_ops::empty_memory_format::redispatch(c10::DispatchKeySet)", "aten::empty.memory_format"),
        ("at::_ops::sum_dim_IntList::call(at::Tensor const&)", "aten::sum.dim_IntList"),
        ("at::detail::empty_cuda(c10::ArrayRef<long>)", None),
    ],
)
def test_the_op_is_named_as_aten_names_it(demangled: str, op: str | None) -> None:
    assert aten_op_name(demangled) == op


def test_overloads_calling_each_other_are_one_frame(real) -> None:
    """at::detail::empty_cuda(...) -> empty_cuda(...) -> empty_cuda(...) reads as one frame with --native."""
    _, _, native = real
    for s in native.samples:
        frames = native.stack_frames(s)
        for a, b in zip(frames, frames[1:], strict=False):
            assert not (a.kind == NATIVE and a.name == b.name), a.name


def test_without_eval_frames_every_python_frame_comes_after_the_cpp_stack() -> None:
    """A stack whose C++ part has no eval-loop frame: the unwinder appends all Python frames at the end."""
    st = make_snapshots.Stacks()
    cpp = [f for f in make_snapshots.with_native_frames([], "py310") if "PyEval_EvalFrame" not in f["name"]]
    frames = cpp + st.mlp_gate
    entry = {"action": "alloc", "addr": 1, "size": 512, "time_us": 1, "frames": frames}
    for native in (False, True):
        (stack,) = stacks(convert({"segments": [], "device_traces": [[entry]]}, native=native))
        assert [(f.file, f.line) for f in stack if f.kind == PYTHON] == python_frames_in_order(frames)
        assert stack[0].name == MODULE and not shown_wrongly(stack)
        assert stack[-1].name == ("at::detail::_empty_generic<…>" if native else "aten::empty.memory_format")


def test_a_custom_functions_backward_on_autograds_thread_is_the_backward_pass() -> None:
    from gpuflame.formats.torch_frames import StackReader, make_entry

    def name(file: str, line: int, function: str) -> tuple[str, int]:
        return ("BackwardCFunction > apply" if function == "apply" else function), 0

    node = "/venv/lib/python3.11/site-packages/torch/autograd/function.py"
    python_only = [make_entry("/w/model.py", 9, "backward", name), make_entry(node, 307, "apply", name)]
    stack = StackReader().read(python_only)
    assert [f.name for f in stack] == ["backward", "BackwardCFunction > apply", BACKWARD_PASS]
    # the caller's own thread (CPU backward): its frames lie below the node, so it is not rooted there
    on_caller = [*python_only, make_entry("/w/train.py", 3, "<module>", name)]
    assert [f.name for f in StackReader().read(on_caller)][-1] == "<module>"
    # with C++ frames: the engine below the outermost Python frame says it
    engine = make_entry("??", 0, "torch::autograd::Engine::thread_main(std::shared_ptr<GraphTask> const&)", name)
    mine = [make_entry("/w/model.py", 9, "backward", name), make_entry("/w/model.py", 1, "helper", name), engine]
    assert [f.name for f in StackReader().read(mine)][-1] == BACKWARD_PASS
