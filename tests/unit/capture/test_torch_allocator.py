"""The ``torch`` backend's CPU allocator hook: every CPU allocation, with its exact Python stack.

The same questions as tests/unit/capture/test_torch_tensors.py (the dispatch mode), asked
of the C++ hook that ``auto`` picks on a CPU-only machine: exact bytes,
views and in-place ops not counted, nothing made before start() attributed,
resize_, threads, real transformers models. Expectations come from torch
itself (``nbytes()``, the storages the garbage collector sees), never from
the recorder. The hook is compiled here with the machine's C++ compiler
(make tools installs g++); where none exists these tests skip and say so.
"""

from __future__ import annotations

import copy
import gc
import os
import subprocess
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import REPO

torch = pytest.importorskip("torch")

from gpuflame.boundary import backends  # noqa: E402
from gpuflame.capture.books.categories import history_site  # noqa: E402
from gpuflame.capture.recorders import torch_hook  # noqa: E402
from gpuflame.capture.recorders.allocator import TorchAllocatorRecorder, native  # noqa: E402
from gpuflame.capture.recorders.allocator.native import NativeUnavailable, load_cpu_hook  # noqa: E402
from gpuflame.capture.recorders.dispatch import TorchTensorRecorder  # noqa: E402
from gpuflame.formats import load, pprof  # noqa: E402
from gpuflame.model import Profile  # noqa: E402
from gpuflame.model import history as history_module  # noqa: E402
from gpuflame.symbols.names import short_cpp_name  # noqa: E402
from tests.helpers.run_cli import gpuflame_run  # noqa: E402
from tests.helpers.torch_helpers import (  # noqa: E402
    ALLOC,
    ALLOC_N,
    INUSE,
    INUSE_N,
    PEAK,
    by_frame,
    by_line,
    column,
    here,
    leaf_most_init,
    live_storages,
    tiny_llama_config,
)

ROOT = REPO

try:
    HOOK = load_cpu_hook()
except NativeUnavailable as exc:  # no compiler on this machine
    pytest.skip(f"the CPU allocator hook cannot be built here: {exc}", allow_module_level=True)


def record(fn: Callable[[], Any], native: bool = False) -> tuple[Profile, Any, TorchAllocatorRecorder]:
    """Run *fn* under the hook; return the profile, fn's result (kept alive) and the recorder."""
    rec = TorchAllocatorRecorder(HOOK, native=native)
    rec.start()
    try:
        result = fn()
    finally:
        rec.stop()
    return rec.snapshot(), result, rec


# -----------------------------------------------------------------------------
# what is an allocation
# -----------------------------------------------------------------------------


def test_views_and_reshapes_are_not_allocations() -> None:
    def work() -> Any:
        x, lx = torch.randn(64, 64), here()
        views = [
            x.view(4096),
            x.t(),
            x.transpose(0, 1),
            x.reshape(4096),
            x[1:3],
            x[:, 5],
            x.detach(),
            x[:1].expand(10, 64),
            x.unsqueeze(0),
            x.narrow(0, 2, 5),
            x.as_strided((2, 2), (1, 1)),
            x.view(torch.int32),
            x.chunk(4)[1],
            x.split(16)[2],
            x.unbind(0)[3],
        ]
        c, lc = x.t().reshape(4096), here()  # not contiguous: a copy (the kernel also uses a tile buffer)
        return (x, views, c), (lx, lc)

    profile, (_, (lx, lc)), rec = record(work)
    assert rec.errors == []
    assert column(profile, ALLOC_N) == by_line(profile, lx, ALLOC_N) + by_line(profile, lc, ALLOC_N)
    assert by_line(profile, lx, ALLOC_N) == 1
    assert by_line(profile, lx, INUSE) == by_line(profile, lc, INUSE) == 64 * 64 * 4
    assert column(profile, INUSE) == 2 * 64 * 64 * 4


def test_tensors_from_before_start_are_never_attributed() -> None:
    pre = torch.ones(100)
    doomed = torch.ones(5000)
    model = torch.nn.Linear(8, 8)
    src = torch.arange(100, dtype=torch.float32)

    def work() -> Any:
        nonlocal doomed
        pre.add_(src)
        v = pre.view(10, 10).t()
        pre.zero_()
        pre.copy_(src)
        w = model.weight.detach()
        model.weight.data.uniform_()
        doomed = None  # an old block freed inside the window: not ours, not subtracted
        return v, w

    profile, _, rec = record(work)
    assert rec.errors == []
    assert column(profile, ALLOC_N) == 0
    assert column(profile, INUSE) == 0 and column(profile, PEAK) == 0
    assert HOOK.totals()["inuse"] == 0


def test_in_place_ops_with_tensor_operands_allocate_nothing() -> None:
    x, y = torch.ones(1000), torch.ones(1000)

    def work() -> None:
        x.add_(y)
        x.copy_(y)
        x.zero_()
        x.clamp_(0, 1)
        x.mul_(y).add_(y)
        torch.add(x, y, out=x)

    profile, _, rec = record(work)
    assert rec.errors == []
    assert column(profile, ALLOC_N) == 0


def test_temporaries_inside_one_op_count_towards_alloc_and_peak_not_inuse() -> None:
    """What a dispatch mode cannot see: a kernel's workspaces, allocated and freed within the op."""
    a = torch.randn(200, 200, dtype=torch.float64)

    def work() -> Any:
        inv, line = torch.linalg.inv(a), here()
        return inv, line

    profile, (inv, line), rec = record(work)
    assert rec.errors == []
    out = inv.untyped_storage().nbytes()
    assert by_line(profile, line, INUSE) == out and by_line(profile, line, INUSE_N) == 1
    assert by_line(profile, line, ALLOC) > out and by_line(profile, line, ALLOC_N) > 1
    assert column(profile, PEAK) > out


def test_resize_growth_frees_the_old_bytes_and_records_the_new() -> None:
    before = torch.empty(4)

    def work() -> Any:
        x, lx = torch.empty(10), here()
        _, lr = x.resize_(1000), here()
        # a storage made before start() keeps the allocator it was made with, PyTorch's
        # default: while recording, the default's calls go through the hook, so its growth counts
        _, lp = before.resize_(50), here()
        o = torch.empty(0)
        _, la = torch.add(torch.ones(8), torch.ones(8), out=o), here()  # out= grows o
        x.resize_(5)  # shrinking keeps the storage: nothing happens
        return (x, o), (lx, lr, lp, la)

    profile, ((x, o), (lx, lr, lp, la)), rec = record(work)
    assert rec.errors == []
    assert by_line(profile, lx, ALLOC) == 40
    assert by_line(profile, lx, INUSE) == 0  # its bytes were replaced by the resize
    assert by_line(profile, lr, INUSE) == 4000 == x.untyped_storage().nbytes()
    assert by_line(profile, lr, ALLOC_N) == 1
    assert by_line(profile, lp, ALLOC) == by_line(profile, lp, INUSE) == 200 == before.untyped_storage().nbytes()
    assert by_line(profile, la, INUSE) == 32 == o.untyped_storage().nbytes()
    assert by_line(profile, lx, PEAK) == 0  # freed before the highest total


def test_storages_made_with_the_default_allocator_count_deepcopy_included() -> None:
    """``torch.UntypedStorage(n)`` takes PyTorch's default CPU allocator itself, past the installed one.

    So do ``storage.clone()`` and ``copy.deepcopy`` of a plain tensor or a state
    dict (a "best weights" copy): none of these 4 MB was seen before. While
    recording they count; after stop() they no longer do.
    """
    source = torch.zeros(250_000)  # 1 MB, made before start()

    def work() -> Any:
        raw, lraw = torch.UntypedStorage(2_000_000), here()
        copied = copy.deepcopy({"w": source})
        freed = source.untyped_storage().clone()
        del freed
        return (raw, copied), lraw

    profile, ((raw, copied), lraw), rec = record(work)
    assert rec.errors == [] and not HOOK.installed()
    assert by_line(profile, lraw, INUSE) == raw.nbytes() == 2_000_000
    assert column(profile, INUSE) == 2_000_000 + copied["w"].untyped_storage().nbytes() == 3_000_000
    assert column(profile, PEAK) == 4_000_000  # with the clone, freed since
    small = column(profile, ALLOC) - 4_000_000  # deepcopy's own new_empty([]) scalar, 4 B
    assert 0 <= small <= 8
    assert by_frame(profile, "_StorageBase > clone", INUSE) == 1_000_000  # the deepcopy's, under torch/storage.py
    after = torch.UntypedStorage(8_000)  # stopped: not booked
    del after
    assert column(rec.snapshot(), ALLOC) == 4_000_000 + small


def test_many_allocations_keep_exact_totals() -> None:
    n = 20_000

    def work() -> Any:
        x = None
        for _ in range(n):
            x = torch.empty(100)  # the old x dies after the new one is made
        return x

    profile, _, _ = record(work)
    assert column(profile, ALLOC_N) == n and column(profile, ALLOC) == n * 400
    assert column(profile, INUSE) == 400 and column(profile, PEAK) == 800


def test_stop_puts_the_allocator_back_and_old_blocks_still_free() -> None:
    rec = TorchAllocatorRecorder(HOOK)
    rec.start()
    assert HOOK.installed()
    kept = [torch.empty(1000) for _ in range(10)]
    rec.stop()
    assert not HOOK.installed()
    after = torch.empty(10)  # not ours: not booked
    kept[3].resize_(5000)  # an old hooked storage grows after stop: the hook hands it to the base allocator
    del kept
    gc.collect()
    assert column(rec.snapshot(), ALLOC_N) == 10 and after.numel() == 10


def test_a_stopped_recorder_is_freed_without_the_garbage_collector() -> None:
    """No reference cycle through its categories adapter: a host that records a window per test frees each."""
    rec = TorchAllocatorRecorder(HOOK)
    rec.start()
    kept = torch.nn.Linear(8, 8)  # a registered parameter goes through the adapter's torch hooks
    rec.stop()
    assert column(rec.snapshot(), ALLOC_N) >= 2
    gone = weakref.ref(rec)
    gc.disable()
    try:
        del rec
        assert gone() is None
    finally:
        gc.enable()
    assert kept.weight.numel() == 64


# -----------------------------------------------------------------------------
# threads
# -----------------------------------------------------------------------------


def make_in_thread(n: int) -> Any:
    return torch.empty(n)


def test_every_python_thread_is_recorded_even_one_started_before() -> None:
    go, done = threading.Event(), threading.Event()
    results: list[Any] = []

    def early() -> None:  # started before the window opens
        go.wait()
        results.append(make_in_thread(500))
        done.set()

    t0 = threading.Thread(target=early)
    t0.start()

    def work() -> None:
        go.set()
        done.wait(10)
        threads = [threading.Thread(target=lambda: results.append(make_in_thread(1000))) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    profile, _, rec = record(work)
    t0.join()
    assert rec.errors == []
    assert by_frame(profile, "make_in_thread", INUSE) == 500 * 4 + 4 * 4000
    stacks = [[f.name for f in profile.stack_frames(s)] for s in profile.samples]
    assert any("test_every_python_thread_is_recorded_even_one_started_before > early" in n for n in stacks)


def _scripted_empty(n: int) -> torch.Tensor:
    return torch.empty(n)


def _scripted_fork(n: int) -> torch.Tensor:
    future = torch.jit.fork(_scripted_empty, n)  # runs on torch's inter-op pool: a thread without Python
    return torch.jit.wait(future)


with warnings.catch_warnings():  # TorchScript is deprecated, and still the simple way to get such a thread
    warnings.simplefilter("ignore", DeprecationWarning)
    _scripted_empty = torch.jit.script(_scripted_empty)
    _scripted_fork = torch.jit.script(_scripted_fork)


def test_threads_without_a_python_stack_are_counted_as_such() -> None:
    _scripted_fork(4)  # warm up TorchScript outside the window
    profile, out, rec = record(lambda: _scripted_fork(1000))
    assert rec.errors == []
    assert by_frame(profile, "<no Python stack>", INUSE) == 4000 == out.untyped_storage().nbytes()
    sample = next(s for s in profile.samples if s.values[INUSE])
    assert [f.kind for f in profile.stack_frames(sample)] == ["synthetic"]


# -----------------------------------------------------------------------------
# real transformers models (random weights from a config: no download)
# -----------------------------------------------------------------------------


@pytest.mark.slow
def test_static_kv_cache_lands_on_the_cache_method_and_inuse_matches_live_storages() -> None:
    transformers = pytest.importorskip("transformers")
    config = tiny_llama_config()
    torch.manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (1, 6))
    gc.collect()
    before = live_storages()  # held: their addresses cannot be reused

    def work() -> Any:
        model = transformers.LlamaForCausalLM(config).eval()
        cache = transformers.StaticCache(config=config, max_cache_len=24)
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=5, do_sample=False, cache=cache, pad_token_id=0)
        return model, cache, out

    profile, (model, cache, out), rec = record(work)
    assert rec.errors == [] and out.shape == (1, 11)
    kv = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    kv_bytes = sum(t.untyped_storage().nbytes() for t in kv)
    assert kv_bytes == 2 * config.num_hidden_layers * 24 * config.num_key_value_heads * 16 * 4
    assert by_frame(profile, "StaticLayer > lazy_initialization", INUSE) == kv_bytes
    assert by_frame(profile, "StaticLayer > lazy_initialization", INUSE_N) == len(kv)
    gc.collect()
    new = {cd: st for cd, st in live_storages().items() if cd not in before}
    # views are not counted twice: in use is exactly the storages made in the window still alive
    assert column(profile, INUSE) == sum(st.nbytes() for st in new.values() if st.nbytes())
    assert column(profile, INUSE_N) == sum(1 for st in new.values() if st.nbytes())
    del before


def test_a_model_built_before_start_is_not_attributed_and_results_are_unchanged() -> None:
    transformers = pytest.importorskip("transformers")
    config = tiny_llama_config()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 6))

    def gen() -> Any:
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=4, do_sample=False, cache_implementation="static", pad_token_id=0)

    expected = gen()
    profile, got, rec = record(gen)
    assert rec.errors == [] and torch.equal(got, expected)
    classes = {type(m).__name__ for m in model.modules()}
    assert all(leaf_most_init(profile, s, classes) is None for s in profile.samples)
    assert column(profile, ALLOC) > 0


class Zoo:
    """Stacks of every shape: methods, nesting, a generator resumed by two callers, comprehensions, lambdas."""

    def __init__(self) -> None:
        self.gen = self.produce()
        self.weights = torch.nn.Linear(8, 8)

    def produce(self) -> Any:
        while True:
            yield torch.empty(3)

    def via_a(self) -> Any:
        return next(self.gen)

    def via_b(self) -> Any:
        return next(self.gen)

    def nested(self, depth: int) -> Any:
        return torch.ones(depth) if depth == 0 else [self.nested(depth - 1), torch.zeros(depth)]

    def run(self) -> Any:
        made = [self.via_a(), self.via_b(), self.via_a(), self.nested(6)]
        made += [torch.full((i,), 1.0) for i in range(1, 4)]
        made.append((lambda: self.weights(torch.ones(2, 8)))())
        return made


@pytest.mark.slow
def test_frames_read_without_the_gil_equal_the_public_api_walk() -> None:
    """CPython 3.11: the hook reads its own thread's frames directly; they must be the frames the API gives."""
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the hook reads frames without the GIL on CPython 3.11 only; elsewhere it uses the API")
    previous = HOOK.own_frames(False)
    zoo = Zoo()
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(tiny_llama_config()).eval()
    ids = torch.randint(0, 128, (1, 5))

    def work() -> Any:
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=3, do_sample=False, cache_implementation="static", pad_token_id=0)
        return zoo.run(), out

    try:
        record(work)  # warm up: first calls take other paths
        profiles, sites = [], []
        for own in (False, True):  # one call site for both
            HOOK.own_frames(own)
            profile, _, rec = record(work)
            assert rec.errors == []
            profiles.append(profile)
            sites.append(HOOK.totals()["sites"])
    finally:
        HOOK.own_frames(previous)

    def by_stack(profile: Profile) -> dict[tuple[Any, ...], list[int]]:
        out: dict[tuple[Any, ...], list[int]] = {}
        for s in profile.samples:
            key = tuple((f.name, f.file, f.line) for f in profile.stack_frames(s))
            out[key] = [a + b for a, b in zip(out.get(key, [0] * len(s.values)), s.values, strict=True)]
        return out

    public, own = map(by_stack, profiles)
    assert own == public and len(own) > 30
    assert sites[1] == sites[0]  # the same keys, not just the same names: every stack was found again
    names = {name for key in own for name, _, _ in key}
    assert {"Zoo > produce", "Zoo > via_a", "Zoo > via_b", "Zoo > run > <listcomp>"} <= names


# -----------------------------------------------------------------------------
# processes, nesting, failures
# -----------------------------------------------------------------------------


@pytest.mark.subprocess
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # JAX, imported by other tests, warns
def test_forks_under_allocation_churn_never_deadlock_and_children_record() -> None:
    stop = threading.Event()

    def churn() -> None:  # keeps the hook's lock busy while the main thread forks
        while not stop.is_set():
            torch.empty(64)

    rec = TorchAllocatorRecorder(HOOK)
    rec.start()
    t = threading.Thread(target=churn)
    t.start()
    codes = []
    try:
        for _ in range(10):
            pid = os.fork()
            if pid == 0:
                code = 3
                try:
                    import signal

                    signal.alarm(20)  # a deadlock kills the child instead of hanging the test
                    x, line = torch.empty(25), here()
                    profile = rec.snapshot()
                    ok = by_line(profile, line, INUSE) == 100 == column(profile, INUSE) and x.numel() == 25
                    code = 0 if ok else 2
                finally:
                    os._exit(code)
            codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    finally:
        stop.set()
        t.join()
        rec.stop()
    assert codes == [0] * 10


def test_a_recording_inside_a_recording_falls_back_to_the_dispatch_mode() -> None:
    outer = torch_hook.torch_recorder("auto", print)
    assert isinstance(outer, TorchAllocatorRecorder)
    outer.start()
    try:
        inner = torch_hook.torch_recorder("auto", print)
        assert isinstance(inner, TorchTensorRecorder)
        with inner:
            x, line = torch.empty(30), here()
        assert by_line(inner.snapshot(), line, INUSE) == 120
    finally:
        outer.stop()
    assert by_line(outer.snapshot(), line, INUSE) == 120 and x.numel() == 30


def test_the_hook_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    assert isinstance(torch_hook.torch_recorder("dispatch", said.append), TorchTensorRecorder)
    assert isinstance(torch_hook.torch_recorder("allocator", said.append), TorchAllocatorRecorder)
    monkeypatch.setattr(backends, "accelerator", lambda torch: "mps")  # an accelerator: auto takes dispatch
    assert isinstance(torch_hook.torch_recorder("auto", said.append), TorchTensorRecorder)
    monkeypatch.undo()

    def unavailable() -> Any:
        raise NativeUnavailable("no C++ compiler found (install g++, or set CXX)")

    monkeypatch.setattr(native, "load_cpu_hook", unavailable)
    assert isinstance(torch_hook.torch_recorder("auto", said.append), TorchTensorRecorder)
    assert len(said) == 1 and "no C++ compiler found" in said[0] and "dispatch mode" in said[0]
    with pytest.raises(NativeUnavailable):
        torch_hook.torch_recorder("allocator", said.append)


def test_an_internal_error_keeps_the_workload_going(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rec = TorchAllocatorRecorder(HOOK)
    rec.start()
    x = torch.empty(10)
    monkeypatch.setattr(rec, "_fetch_stacks", lambda hook: 1 / 0)
    profile = rec.snapshot()
    rec.stop()
    err = capsys.readouterr().err
    assert len(profile) == 0 and "ZeroDivisionError" in err
    assert "gpuflame: torch (allocator hook) backend:" in err  # says which of the two torch recorders failed
    assert x.numel() == 10 and not HOOK.installed()


def test_bookings_that_fail_inside_the_hook_lose_only_themselves() -> None:
    """gpuflame out of memory inside the allocator: the workload gets its tensors, the profile says what it lost."""
    expected = torch.arange(30.0).reshape(5, 6).sum(0)

    def work() -> Any:
        HOOK.inject_faults(3)
        try:
            lost, lost_line = [torch.empty(100) for _ in range(3)], here()  # handed out unbooked
            kept, line = torch.empty(25), here()
            got = torch.arange(30.0).reshape(5, 6).sum(0)
        finally:
            HOOK.inject_faults(0)
        del lost  # their frees find no booking: nothing to subtract
        return kept, (line, lost_line), got

    profile, (kept, (line, lost_line), got), rec = record(work)
    assert rec.errors == [] and torch.equal(got, expected) and kept.numel() == 25
    assert by_line(profile, line, INUSE) == 100  # the next allocation is booked again
    assert by_line(profile, lost_line, ALLOC) == 0  # without the faults: 3 x 400 bytes here
    assert any("3 allocations could not be booked" in c for c in profile.comments)


# -----------------------------------------------------------------------------
# building the hook
# -----------------------------------------------------------------------------


@pytest.mark.subprocess
def test_build_is_cached_and_failures_are_one_plain_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUFLAME_CACHE_DIR", str(tmp_path / "cache"))
    source, flags = native.HERE / "cpu_hook.cpp", native._torch_flags(torch)
    built = native._built("gpuflame_cpu_hook", source, flags, torch.__version__)
    assert built.is_file() and built.parent == tmp_path / "cache" / "native"
    assert "compiling cpu_hook.cpp" in capsys.readouterr().err
    again = native._built("gpuflame_cpu_hook", source, flags, torch.__version__)
    assert again == built and capsys.readouterr().err == ""  # from the cache, silently
    assert [p.name for p in built.parent.iterdir()] == [built.name]  # no temporary left behind

    monkeypatch.setenv("CXX", "false")  # a compiler that fails
    with pytest.raises(NativeUnavailable, match="compiling cpu_hook.cpp with false failed: exit code 1"):
        native._built("gpuflame_cpu_hook", source, [*flags, "-DOTHER"], torch.__version__)
    assert [p.name for p in built.parent.iterdir()] == [built.name]
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(NativeUnavailable, match="no C\\+\\+ compiler found"):
        native._built("gpuflame_cpu_hook", source, flags, torch.__version__)


SCRIPT = """\
import sys, torch
def make():
    return torch.empty(2500)
kept = make()
sys.exit(3)
"""


def run_gpuflame(
    tmp_path: Path, env: dict[str, str], *args: str, cache: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``gpuflame run -o out.pb.gz ARGS work.py`` with a build cache of its own (the hook is compiled there),
    or *cache*, a cache the hook was compiled into already."""
    (tmp_path / "work.py").write_text(SCRIPT)
    return gpuflame_run(
        "-o",
        "out.pb.gz",
        *args,
        "work.py",
        cwd=tmp_path,
        env={"GPUFLAME_CACHE_DIR": str(cache or tmp_path / "cache"), **env},
        timeout=300,
    )


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """(the run, its folder): ``gpuflame run`` with an empty build cache, so the run itself compiles the hook.

    Once per module: the runs with other flags below use the cache it filled (compiling the hook takes
    more CPU than the run); none of them writes to its folder or its profile.
    """
    folder = tmp_path_factory.mktemp("first_run")
    return run_gpuflame(folder, {}), folder


@pytest.mark.subprocess
def test_gpuflame_run_uses_the_hook_and_keeps_the_exit_code(
    first_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, tmp_path = first_run
    assert done.returncode == 3, done.stderr
    assert "compiling cpu_hook.cpp" in done.stderr  # the cache was empty: built by the run
    assert "Traceback" not in done.stderr
    profile = load(tmp_path / "out.pb.gz")
    assert by_frame(profile, "make", INUSE) == 10_000
    assert any("CPU allocator hook" in c for c in profile.comments)


@pytest.mark.subprocess
def test_without_a_compiler_gpuflame_run_falls_back_and_says_so_once(tmp_path: Path) -> None:
    done = run_gpuflame(tmp_path, {"CXX": "false"})
    assert done.returncode == 3, done.stderr
    lines = [line for line in done.stderr.splitlines() if "allocator hook is not available" in line]
    assert len(lines) == 1 and "dispatch mode" in lines[0] and "Traceback" not in done.stderr
    profile = load(tmp_path / "out.pb.gz")
    assert by_frame(profile, "make", INUSE) == 10_000
    assert not any("CPU allocator hook" in c for c in profile.comments)


@pytest.mark.subprocess
def test_torch_hook_dispatch_is_honoured(
    tmp_path: Path, first_run: tuple[subprocess.CompletedProcess[str], Path]
) -> None:
    done = run_gpuflame(tmp_path, {}, "--torch-hook", "dispatch", cache=first_run[1] / "cache")
    assert done.returncode == 3, done.stderr
    profile = load(tmp_path / "out.pb.gz")
    assert by_frame(profile, "make", INUSE) == 10_000
    assert not any("CPU allocator hook" in c for c in profile.comments)


def test_the_timeline_keeps_the_peak_and_ends_at_what_is_in_use() -> None:
    def work() -> Any:
        kept = [torch.empty(1000) for _ in range(50)]
        big = torch.empty(1_000_000)  # the peak: 4 MB on top of 200 KB
        del big
        for _ in range(30_000):  # churn: many events, the series must stay bounded
            torch.empty(10)
        return kept

    started = time.time_ns()
    profile, _, rec = record(work)
    ended = time.time_ns()
    assert rec.errors == [] and profile.timeline is not None
    points = profile.timeline.series[(("device", "cpu"), ("pid", str(os.getpid())))]
    assert 2 <= len(points) <= 3000
    assert [t for t, _ in points] == sorted(t for t, _ in points)
    assert started <= points[0][0] and points[-1][0] <= ended
    assert max(b for _, b in points) == column(profile, PEAK) == 50 * 4000 + 4_000_000
    assert points[-1][1] == column(profile, INUSE) == 50 * 4000
    back = pprof.decode(pprof.encode(profile))  # it rides in the file
    assert back.timeline is not None and back.timeline.series == profile.timeline.series


def value_at(points: list[tuple[int, int]], t: int) -> int:
    """The step line's value at time *t*: the last point at or before it."""
    return [b for tp, b in points if tp <= t][-1]


@pytest.mark.slow
def test_the_timeline_shows_short_spikes_rising_and_falling() -> None:
    """Issue 10: five 4 MB spikes of microseconds, 100 ms apart, over 1 MB held: not a flat 5 MB line."""
    spikes: list[tuple[int, int]] = []

    def work() -> Any:
        held = torch.empty(250_000)  # 1 MB
        for _ in range(5):
            time.sleep(0.1)
            before = time.time_ns()
            spike = torch.empty(1_000_000)  # 4 MB, freed at once
            del spike
            spikes.append((before, time.time_ns()))
        time.sleep(0.02)
        return held

    profile, _, rec = record(work)
    assert rec.errors == []
    (points,) = profile.timeline.series.values()
    assert [t for t, _ in points] == sorted({t for t, _ in points})
    for (before, after), (next_before, _) in zip(spikes, spikes[1:] + [(points[-1][0], 0)], strict=True):
        inside = [b for t, b in points if before <= t <= after]
        assert max(inside) == 5_000_000  # it rose to 5 MB, inside the spike's microseconds
        assert value_at(points, after) == 1_000_000  # and fell back before it was over
        # between spikes (the moments read here, never assumed): the 1 MB held, nothing more
        assert {b for t, b in points if after <= t < next_before} <= {1_000_000}
    assert points[-1][1] == 1_000_000 and column(profile, PEAK) == 5_000_000


@pytest.mark.slow
def test_the_timeline_stays_bounded_and_keeps_the_falls_when_its_buckets_merge() -> None:
    """2,600 spikes over 2.9 s, each in a 1 ms bucket of its own: more than the hook's 2,048, so pairs merge."""
    spikes = 2600

    def work() -> Any:
        held = torch.empty(250_000)
        for _ in range(spikes):
            spike = torch.empty(1_000_000)
            del spike
            time.sleep(0.0011)  # each spike opens a bucket of its own
        return held

    record(work)
    points = HOOK.timeline()  # the hook's own series, before the Python side downsamples it
    # unmerged, each spike's bucket would give two points (up and down): fewer means buckets merged
    assert len(points) < 2 * spikes and len(points) <= 3 * 2048 + 2
    assert [t for t, _ in points] == sorted({t for t, _ in points})
    assert {b for _, b in points} == {1_000_000, 5_000_000}
    assert sum(b == 5_000_000 for _, b in points) > 1000  # spikes kept all along...
    for (_, b), (_, nxt) in zip(points, points[1:], strict=False):
        assert b == 1_000_000 or nxt == 1_000_000  # ...and each one falls back
    assert points[-1][1] == 1_000_000


CHILD_IN_THE_MIDDLE = """\
import multiprocessing, time, torch
def child():
    x = torch.empty(500_000)  # 2 MB, for 0.2 s
    time.sleep(0.2)
if __name__ == "__main__":
    held = torch.empty(1_000_000)  # 4 MB, for the whole run
    time.sleep(0.2)
    p = multiprocessing.get_context("fork").Process(target=child)
    p.start()
    p.join()
    time.sleep(0.3)
"""


@pytest.mark.subprocess
def test_a_run_places_each_process_on_its_own_times(tmp_path: Path) -> None:
    """`gpuflame run`: a child that ran in the middle of the run counts only then, not from 0 nor for ever."""
    (tmp_path / "work.py").write_text(CHILD_IN_THE_MIDDLE)
    done = gpuflame_run("-o", "out.pb.gz", "work.py", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    timeline = load(tmp_path / "out.pb.gz").timeline
    ((parent_key, parent), (child_key, child)) = sorted(timeline.series.items(), key=lambda kv: kv[1][0][0])
    assert dict(parent_key)["pid"] != dict(child_key)["pid"]
    assert max(b for _, b in parent) == 4_000_000 and max(b for _, b in child) == 2_000_000
    assert parent[0][0] < child[0][0] and child[-1][0] < parent[-1][0]  # the child ran inside the parent's run
    total = timeline.total()
    assert value_at(total, child[0][0] - 1) == 4_000_000  # before the child started: the parent alone
    assert max(b for _, b in total) == 6_000_000  # both, while the child held its 2 MB
    assert value_at(total, child[-1][0] + 1) == value_at(parent, child[-1][0] + 1)  # after it ended: 0 from it
    assert total[-1] == parent[-1]


# -----------------------------------------------------------------------------
# --native: the C++ frames between the allocator and the Python caller
# -----------------------------------------------------------------------------


def make_native_probe() -> Any:
    return torch.empty(1000), torch.nn.functional.linear(torch.ones(2, 8), torch.ones(4, 8))


@pytest.mark.slow
def test_native_frames_sit_between_the_allocator_and_the_python_caller() -> None:
    plain, _, _ = record(make_native_probe)
    profile, _, rec = record(make_native_probe, native=True)
    assert rec.errors == []
    assert profile.totals() == plain.totals()  # the same allocations, only deeper stacks
    python_stacks = set()
    for s in profile.samples:
        frames = profile.stack_frames(s)
        kinds = [f.kind for f in frames]
        first_python = kinds.index("python")
        assert first_python > 0 and set(kinds[:first_python]) == {"native"}  # native leaf part
        assert set(kinds[first_python:]) == {"python"}  # then only Python
        assert frames[first_python].name == "make_native_probe"
        assert not any("gpuflame_cpu_hook" in f.file for f in frames)  # gpuflame's own frames dropped
        assert all(f.file.endswith(".so") or ".so." in f.file for f in frames[:first_python] if f.file)
        python_stacks.add(tuple((f.name, f.line) for f in frames[first_python : first_python + 2]))
    # the Python part is the one recorded without --native (up to record(), called from two lines)
    assert python_stacks == {tuple((f.name, f.line) for f in plain.stack_frames(s)[:2]) for s in plain.samples}
    names = {f.name for s in profile.samples for f in profile.stack_frames(s)}
    assert any(name.startswith("at::") and "empty" in name for name in names)
    assert any("linear" in name or "addmm" in name for name in names)  # the op that allocated
    # argument lists cut ("(anonymous namespace)" is part of a name, from the full symbol table)
    assert not any("(" in name.replace("(anonymous namespace)", "") for name in names if not name.startswith("0x"))


@pytest.mark.parametrize(
    "mangled, short",
    [
        ("at::native::empty_cpu(c10::ArrayRef<long>, std::optional<c10::ScalarType>)", "at::native::empty_cpu"),
        ("void f<void (*)(int)>(void (*)(int))", "f<…>"),
        ("std::function<void ()>::operator()() const", "std::function<…>::operator()"),
        ("plain_c_symbol", "plain_c_symbol"),
        ("(anonymous namespace)::g(int)", "g"),
    ],
)
def test_native_names_lose_their_argument_lists(mangled: str, short: str) -> None:
    """One shortening for every C++ name gpuflame shows (symbols.names.short_cpp_name)."""
    assert short_cpp_name(mangled) == short


@pytest.mark.subprocess
def test_gpuflame_run_native_gives_native_frames(
    tmp_path: Path, first_run: tuple[subprocess.CompletedProcess[str], Path]
) -> None:
    done = run_gpuflame(tmp_path, {}, "--native", cache=first_run[1] / "cache")
    assert done.returncode == 3, done.stderr
    profile = load(tmp_path / "out.pb.gz")
    sample = next(s for s in profile.samples if s.values[INUSE] == 10_000)
    frames = profile.stack_frames(sample)
    assert frames[0].kind == "native" and any(f.name == "make" for f in frames)


def test_threads_without_a_python_stack_say_the_running_phase() -> None:
    import gpuflame
    from gpuflame.capture.books import phases

    _scripted_fork(4)

    def run() -> torch.Tensor:
        with gpuflame.phase("serve"):
            return _scripted_fork(1000)

    try:
        profile, out, rec = record(run)
    finally:
        phases.switch(0)
    assert rec.errors == []
    held = [s for s in profile.samples if s.values[INUSE]]
    assert [(profile.stack_frames(s)[0].name, s.label("phase"), s.values[INUSE]) for s in held] == [
        ("<no Python stack>", "serve", 4000)
    ]


# -----------------------------------------------------------------------------
# stop(): the history handed over and written in C (issue 23 item 3)
# -----------------------------------------------------------------------------


def _python_comment(history: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """The history's comment as the pure-Python writer makes it (no C formatter)."""
    with monkeypatch.context() as m:
        m.setattr(history_module, "_ints_text", None)
        return history.to_comment()


def test_the_hooks_column_text_is_the_python_writers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every value and difference as Python writes it: extremes, both widths, across its chunks."""
    from array import array

    monkeypatch.setattr(history_module, "_FAST_CHUNK", 7)
    lo, hi = -(1 << 63), (1 << 63) - 1
    wide = array("q", [0, 1, -1, 9, 10, -10, 12345678901234, hi, lo, hi, 0, lo, 5, 5, 5, -7, 99])
    narrow = array("I", [0, 1, 9, 10, (1 << 32) - 1, 4, 4, 70000, 3, 2])
    for values in (
        wide,
        narrow,
        memoryview(wide.tobytes()).cast("q"),
        memoryview(narrow.tobytes()).cast("I"),
        array("q"),
        wide[:7],
        wide[:8],
    ):
        for previous in (None, 0, lo, hi) if values.itemsize == 8 else (None, 0):
            with monkeypatch.context() as m:
                m.setattr(history_module, "_ints_text", None)
                slow = b"".join(
                    p if isinstance(p, bytes) else p.encode() for p in history_module._column_text(values, previous)
                )
            monkeypatch.setattr(history_module, "_ints_text", HOOK.ints_text)
            fast = b"".join(
                p if isinstance(p, bytes) else p.encode() for p in history_module._column_text(values, previous)
            )
            assert fast == slow, (values, previous)
    with pytest.raises(TypeError):
        HOOK.ints_text(array("d", [1.0]))


def test_a_recorded_history_is_the_one_the_old_way_wrote(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook numbers the sites as of_track does and the comment is the pure-Python writer's, byte for byte;
    the file gives the same history back."""
    from array import array

    monkeypatch.setattr(history_module, "MAX_EVENTS", 256)  # folded too: a base to renumber

    def work() -> list[Any]:
        keep = [torch.empty(n % 5 + 1) for n in range(40)]
        for n in range(300):
            keep[n % 40] = torch.empty(n % 7 + 1) if n % 3 else torch.zeros(n % 11 + 2)
        return keep

    warm = TorchAllocatorRecorder(HOOK)  # sites of an earlier window: the hook's ids used are not 0, 1, 2...
    warm.start()
    _ = [torch.empty(3) for _ in range(5)]
    warm.stop()
    rec = TorchAllocatorRecorder(HOOK)
    rec.start()
    keep = work()
    copied = HOOK.history()  # while recording: a copy, with the hook's ids of the sites it names
    rec.stop()
    assert HOOK.history()[4] == b""  # at stop it was handed over, not copied
    profile = rec.snapshot()
    history = profile.history
    track = history.tracks[0]
    assert track.folded > 0 and track.base and isinstance(track.times, memoryview)
    used = copied[7]
    assert used != list(range(len(used)))
    # the old way: a track in the hook's own site ids, renumbered by of_track
    old = history_module.Track(
        track.labels,
        track.start,
        track.end,
        track.fold,
        track.folded,
        {used[s]: v for s, v in track.base.items()},
        array("q", track.times),
        array("q", (used[s] for s in track.sites)),
        array("q", track.sizes),
    )
    # the hook's keys are its sites and their blocks' category tags (categories.history_key)
    old_history = history_module.of_track(old, lambda key: rec._stacks[history_site(key)], rec._kinds.history_labels)
    assert old_history == history
    assert history.to_comment() == _python_comment(old_history, monkeypatch)
    assert pprof.decode(pprof.encode(profile)).history == history
    assert len(keep) == 40
