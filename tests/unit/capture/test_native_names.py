"""--native names every C++ frame PyTorch's libraries have a symbol for, exported or not.

``dladdr`` knows only exported symbols; the kernels PyTorch registers from
anonymous namespaces were drawn as bare addresses. Their names come from the
library's full symbol table (``.symtab``), which release builds keep.
"""

from __future__ import annotations

import os
import re

import pytest

torch = pytest.importorskip("torch")

from gpuflame.capture.recorders.allocator import TorchAllocatorRecorder  # noqa: E402
from gpuflame.capture.recorders.allocator.native import NativeUnavailable, elf_symbols, load_cpu_hook  # noqa: E402

try:
    HOOK = load_cpu_hook()
except NativeUnavailable as exc:  # no compiler on this machine
    pytest.skip(f"the CPU allocator hook cannot be built here: {exc}", allow_module_level=True)

ADDRESS = re.compile(r"0x[0-9a-f]+")


def libraries_with_a_symbol_table() -> set[str]:
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    paths = [os.path.realpath(os.path.join(lib, n)) for n in ("libtorch_cpu.so", "libtorch_python.so", "libc10.so")]
    return {p for p in paths if elf_symbols._symbols(p) is not None}


def probe():
    return torch.zeros(1_000_000), torch.nn.functional.linear(torch.ones(2, 8), torch.ones(4, 8))


@pytest.mark.subprocess
def test_no_bare_address_where_the_library_has_a_symbol_table():
    tables = libraries_with_a_symbol_table()
    if not tables:
        pytest.skip("this PyTorch build's libraries are stripped: addresses are all there is")
    rec = TorchAllocatorRecorder(HOOK, native=True)
    rec.start()
    try:
        kept = probe()
    finally:
        rec.stop()
    profile = rec.snapshot()
    assert kept[0].numel() == 1_000_000
    native = [f for f in profile.frames if f.kind == "native"]
    bare = [f for f in native if ADDRESS.fullmatch(f.name) and os.path.realpath(f.file) in tables]
    assert native and not bare, bare
    names = {f.name for f in native}
    assert "at::detail::empty_generic" in names
    assert all(len(name) < 120 for name in names), "template arguments are folded"


@pytest.mark.parametrize(
    "name, short",
    [
        (
            "c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::X<at::Tensor (long), &f>, at::Tensor>::call",
            "c10::impl::wrap_kernel_functor_unboxed_<…>::call",
        ),
        ("at::native::empty_cpu", "at::native::empty_cpu"),
        ("std::vector<int>::operator<(std::vector<int> const&)",) * 2,  # operator< is no template
    ],
)
def test_template_arguments_fold(name, short):
    assert elf_symbols.without_template_arguments(name) == short


@pytest.mark.subprocess
def test_demangle_and_a_library_not_mapped_here():
    assert elf_symbols.demangle("_ZN2at6native9empty_cpuEN3c108ArrayRefIlEE").startswith("at::native::empty_cpu(")
    assert elf_symbols.demangle("malloc") == "malloc"
    assert elf_symbols.name_of(0x1234, "/nonexistent/libnothing.so") is None
    assert elf_symbols.name_of(0x1234, "") is None


def test_compiler_suffixes_are_dropped():
    assert elf_symbols._CLONE.sub("", "at::empty(long) [clone .constprop.0] [clone .isra.0]") == "at::empty(long)"
    assert elf_symbols._CLONE.sub("", "c10::str[abi:cxx11](int)") == "c10::str(int)"
