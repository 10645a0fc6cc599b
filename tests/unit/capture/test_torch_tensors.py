"""The ``torch`` capture backend: tensor storages made by torch ops, with exact Python stacks.

Every test checks the recorder against something computed independently of
it: byte counts from ``numel() * element_size()`` or from the storages that
the garbage collector can see, stacks from walking the frames directly.
Runs on the CPU with real torch and real (randomly initialised, never
downloaded) transformers models.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gpuflame.capture import code_frames  # noqa: E402
from gpuflame.capture.recorders import dispatch  # noqa: E402
from gpuflame.capture.recorders.dispatch import TorchTensorRecorder  # noqa: E402
from gpuflame.model import Profile  # noqa: E402
from tests.helpers.torch_helpers import (  # noqa: E402
    ALLOC,
    ALLOC_N,
    INUSE,
    INUSE_N,
    PEAK,
    Net,
    by_frame,
    by_line,
    column,
    here,
    leaf_most_init,
    live_storages,
    tiny_llama_config,
)


def record(fn: Callable[[], Any], **kwargs: Any) -> tuple[Profile, Any, TorchTensorRecorder]:
    """Run *fn* under a recorder; return the profile, fn's result (kept alive) and the recorder."""
    rec = TorchTensorRecorder(**kwargs)
    rec.start()
    try:
        result = fn()
    finally:
        rec.stop()
    return rec.snapshot(), result, rec


@pytest.fixture
def quiet_gc() -> Iterator[None]:
    """Collect once before a test that counts live storages, so earlier tests' garbage is gone."""
    gc.collect()
    yield


# -----------------------------------------------------------------------------
# basics: what is a new storage
# -----------------------------------------------------------------------------


def test_views_and_reshapes_are_not_allocations() -> None:
    def work() -> Any:
        x, lx = torch.randn(64, 64), here()
        views = [
            x.view(4096),
            x.t(),
            x.transpose(0, 1),
            x.reshape(4096),  # contiguous: a view
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
        c, lc = x.t().reshape(4096), here()  # not contiguous: a clone (+ _unsafe_view of it)
        return (x, views, c), (lx, lc)

    profile, ((x, views, c), (lx, lc)), rec = record(work)
    assert rec.errors == []
    assert column(profile, ALLOC_N) == 2
    assert by_line(profile, lx, ALLOC) == 64 * 64 * 4
    assert by_line(profile, lc, ALLOC) == 64 * 64 * 4
    assert column(profile, INUSE) == 2 * 64 * 64 * 4


def test_tensors_from_before_start_are_never_attributed() -> None:
    pre = torch.ones(100)
    model = torch.nn.Linear(8, 8)

    def work() -> Any:
        pre.add_(1)
        pre.mul_(2)
        v = pre.view(10, 10).t()
        pre.zero_()
        pre[3] = 7.0  # a scalar is lifted into a tensor: 4 bytes, freed at once
        pre.copy_(torch.arange(100, dtype=torch.float32))
        w = model.weight.detach()
        model.weight.data.uniform_()
        return v, w

    profile, _, rec = record(work)
    assert rec.errors == []
    # only the temporary arange and the lifted scalar were made, and both are gone
    assert column(profile, INUSE) == 0
    assert column(profile, ALLOC_N) == 2
    assert column(profile, ALLOC) == 400 + 4


def test_in_place_ops_allocate_nothing() -> None:
    x = torch.ones(1000)
    y = torch.ones(1000)

    def work() -> None:
        x.add_(y)
        x.copy_(y)
        x.zero_()
        x.clamp_(0, 1)
        x.mul_(2).add_(1)
        torch.add(x, y, out=x)

    profile, _, rec = record(work)
    assert rec.errors == []
    assert column(profile, ALLOC_N) == 0


def test_resize_growth_frees_the_old_bytes_and_records_the_new() -> None:
    before = torch.empty(4)

    def work() -> Any:
        x, lx = torch.empty(10), here()
        _, lr = x.resize_(1000), here()
        _, lp = before.resize_(50), here()  # a pre-existing storage grows: the new bytes are ours
        o = torch.empty(0)
        _, la = torch.add(torch.ones(8), 1, out=o), here()  # out= grows o
        x.resize_(5)  # shrinking keeps the storage: nothing happens
        return (x, o), (lx, lr, lp, la)

    profile, ((x, o), (lx, lr, lp, la)), rec = record(work)
    assert rec.errors == []
    assert by_line(profile, lx, ALLOC) == 40
    assert by_line(profile, lx, INUSE) == 0  # its bytes were replaced by the resize
    assert by_line(profile, lr, INUSE) == 4000 == x.untyped_storage().nbytes()
    assert by_line(profile, lr, ALLOC_N) == 1
    assert by_line(profile, lp, INUSE) == 200
    assert by_line(profile, la, INUSE) == 32 == o.untyped_storage().nbytes()
    assert by_line(profile, lx, PEAK) == 0  # freed before the peak


@pytest.mark.slow
def test_meta_tensors_hold_no_memory() -> None:
    profile, _, _ = record(lambda: torch.empty(1000, device="meta") * 2)
    assert column(profile, ALLOC) == 0


def test_many_events_are_replayed_in_order() -> None:
    n = 3 * dispatch.Ledger.BATCH

    def work() -> Any:
        x = None
        for _ in range(n):
            x = torch.empty(100)  # the old x dies after the new one is made
        return x

    profile, _, _ = record(work)
    assert column(profile, ALLOC_N) == n
    assert column(profile, ALLOC) == n * 400
    assert column(profile, INUSE) == 400
    assert column(profile, PEAK) == 800


# -----------------------------------------------------------------------------
# modules and parameters
# -----------------------------------------------------------------------------


# -----------------------------------------------------------------------------
# stacks: the tagged walk must equal a full walk
# -----------------------------------------------------------------------------


def expected_stack(leaf: Any) -> list[tuple[str, str, int]]:
    """(name, file, line) from a plain frame walk, without gpuflame's frames."""
    from gpuflame.symbols.names import display_name

    out = []
    f = leaf
    while f is not None:
        code = f.f_code
        if not code.co_filename.startswith(code_frames.GPUFLAME_DIR):
            out.append((display_name(code.co_qualname), code.co_filename, f.f_lineno))
        f = f.f_back
    return out


class StackCheck:
    """Counts allocations whose recorded stack differs from a full frame walk."""

    def __init__(self) -> None:
        self.checked = 0
        self.mismatches: list[tuple[Any, Any]] = []
        self.recorder: Any = None


@pytest.fixture
def checked_stacks(monkeypatch: pytest.MonkeyPatch) -> StackCheck:
    """Make every recorded allocation compare its stack with a full frame walk.

    The ledger's event queue is swapped for one that checks each allocation
    event as it is queued (from inside the recorder, so the frames above are
    exactly the op's caller's); free events (dead storage) pass through.
    """
    check = StackCheck()
    original_init = dispatch.Ledger.__init__
    original_start = TorchTensorRecorder._start

    class CheckingQueue(deque):  # type: ignore[type-arg]
        def append(self, ref: Any) -> None:
            if ref() is not None and check.recorder is not None:
                rec = check.recorder
                got = [(f.name, f.file, f.line) for f in rec.stacks.frames(rec.site_keys[ref.site][0])]
                want = expected_stack(sys._getframe(1))
                check.checked += 1
                if got != want:
                    check.mismatches.append((got, want))
            super().append(ref)

    def init(self: Any, hook: Any = None) -> None:
        original_init(self, hook)
        self.events = CheckingQueue()
        self.append = self.events.append
        self.on_free = self._free_callback()

    def start(self: Any) -> None:
        check.recorder = self
        original_start(self)

    monkeypatch.setattr(dispatch.Ledger, "__init__", init)
    monkeypatch.setattr(TorchTensorRecorder, "_start", start)
    return check


def nested_a(n: int) -> Any:
    x = torch.empty(n)
    return [nested_b(n), x, nested_b(n + 1)]


def nested_b(n: int) -> Any:
    return [torch.empty(n) for _ in range(2)] + [nested_c(n)]


def nested_c(n: int) -> Any:
    return torch.ones(n) + 1


def test_stacks_equal_a_full_walk(checked_stacks: StackCheck) -> None:
    def gen() -> Iterator[Any]:
        while True:
            yield torch.empty(3)

    g = gen()

    def from_a() -> Any:
        return next(g)

    def from_b() -> Any:
        return next(g)

    def work() -> Any:
        out = [nested_a(i) for i in range(1, 4)]
        out += [from_a(), from_b(), from_a()]  # a generator resumed by different callers
        out.append(Net())
        return out

    profile, _, rec = record(work)
    assert rec.errors == []
    assert checked_stacks.checked > 30
    assert checked_stacks.mismatches == []
    stacks = [profile.stack_frames(s) for s in profile.samples]
    callers = {frames[1].name for frames in stacks if frames[0].name.endswith("gen")}
    assert {"test_stacks_equal_a_full_walk > from_a", "test_stacks_equal_a_full_walk > from_b"} <= callers


def test_stacks_stay_right_under_a_tracer(checked_stacks: StackCheck) -> None:
    lines: list[int] = []

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code is nested_c.__code__ and event == "line":
            lines.append(frame.f_lineno)
        return tracer

    def work() -> Any:
        sys.settrace(tracer)
        try:
            return [nested_a(5) for _ in range(3)]
        finally:
            sys.settrace(None)

    _, _, rec = record(work)
    assert rec.errors == []
    assert checked_stacks.checked > 10
    assert checked_stacks.mismatches == []
    assert lines  # the tracer still saw its lines


# -----------------------------------------------------------------------------
# threads
# -----------------------------------------------------------------------------


def make_in_thread(n: int) -> Any:
    return torch.empty(n)


def test_threads_started_after_start_are_recorded() -> None:
    results: list[Any] = []

    def worker() -> None:
        results.append(make_in_thread(1000))

    def work() -> None:
        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with ThreadPoolExecutor(2) as pool:
            results.extend(pool.map(make_in_thread, [10, 20, 30]))

    profile, _, rec = record(work)
    assert rec.errors == []
    assert by_frame(profile, "make_in_thread", INUSE) == 4 * 4000 + 60 * 4
    assert by_frame(profile, "make_in_thread", INUSE_N) == 7
    stacks = [[f.name for f in profile.stack_frames(s)] for s in profile.samples]
    assert any("test_threads_started_after_start_are_recorded > worker" in names for names in stacks)
    assert all(names[-1] == "Thread > _bootstrap" for names in stacks)


def test_threads_already_running_at_start_are_named_as_not_recorded(capsys: pytest.CaptureFixture[str]) -> None:
    """A pool started before recording (or torch imported first in a worker, where recording starts) made
    tensors the mode never saw, and nothing said so: 1 MiB shown of 13 MiB held. Daemon threads go unnamed."""
    go, made = threading.Event(), []
    early = threading.Thread(target=lambda: (go.wait(), made.append(make_in_thread(1000))), name="early-pool")
    daemon = threading.Thread(target=go.wait, name="kernel-heartbeat", daemon=True)
    early.start()
    daemon.start()
    rec = TorchTensorRecorder()
    rec.start()
    try:
        later = threading.Thread(target=lambda: made.append(make_in_thread(10)), name="later")
        later.start()
        go.set()
        for t in (early, later, daemon):
            t.join()
    finally:
        rec.stop()
    (said,) = rec.losses
    assert "already running when recording started (" in said and "early-pool" in said
    assert "kernel-heartbeat" not in said and "later" not in said
    assert "--torch-hook allocator records every thread" in said and said in capsys.readouterr().err
    assert by_frame(rec.snapshot(), "make_in_thread", ALLOC) == 40  # the later thread's; the early one's unseen
    assert sorted(t.nbytes for t in made) == [40, 4000]


def test_thread_profile_hooks_are_chained_and_restored() -> None:
    seen: list[str] = []

    def user_hook(frame: Any, event: str, arg: Any) -> None:
        seen.append(event)

    threading.setprofile(user_hook)
    try:
        rec = TorchTensorRecorder()
        rec.start()
        t = threading.Thread(target=lambda: make_in_thread(5))
        t.start()
        t.join()
        rec.stop()
        assert threading.getprofile() is user_hook
    finally:
        threading.setprofile(None)
    assert seen  # the user's hook still ran in the new thread
    assert by_frame(rec.snapshot(), "make_in_thread", ALLOC) == 20


# -----------------------------------------------------------------------------
# never break the workload
# -----------------------------------------------------------------------------


def workload() -> torch.Tensor:
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8, requires_grad=True)
    loss = net(x).square().sum()
    loss.backward()
    assert x.grad is not None
    return torch.cat([net(x).detach().flatten(), x.grad.flatten()])


def test_internal_error_keeps_results_and_is_reported_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = workload()

    def broken(self: Any, f: Any) -> int:
        raise RuntimeError("injected fault")

    monkeypatch.setattr(dispatch.Stacks, "above", broken)
    profile, got, rec = record(workload)
    assert torch.equal(got, expected)
    err = capsys.readouterr().err
    assert err.count("gpuflame:") == 1
    assert "injected fault" in err and "recording stopped" in err
    assert rec.degraded and len(rec.errors) == 1
    assert any("degraded" in c for c in profile.comments)


def test_a_failing_profile_build_returns_an_empty_profile(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rec = TorchTensorRecorder()
    rec.start()
    x = torch.empty(10)
    monkeypatch.setattr(dispatch.Ledger, "rows", lambda self: 1 / 0)
    profile = rec.snapshot()
    rec.stop()
    assert len(profile) == 0 and "ZeroDivisionError" in capsys.readouterr().err
    assert x.numel() == 10


def test_a_failing_start_leaves_torch_untouched(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(recorder: Any) -> Any:
        raise ImportError("no torch here")

    monkeypatch.setattr(dispatch.recorder, "_make_mode", boom)
    rec = TorchTensorRecorder()
    rec.start()
    assert torch.ones(3).sum().item() == 3
    rec.stop()
    err = capsys.readouterr().err
    assert "gpuflame: torch (dispatch) backend: could not start recording" in err  # which torch recorder
    assert torch._C._len_torch_dispatch_stack() == 0


def test_stop_leaves_no_mode_behind() -> None:
    rec = TorchTensorRecorder()
    rec.start()
    assert torch._C._len_torch_dispatch_stack() == 1
    rec.stop()
    assert torch._C._len_torch_dispatch_stack() == 0


def test_autograd_results_unchanged_and_grads_recorded() -> None:
    expected = workload()
    profile, got, rec = record(workload)
    assert torch.equal(got, expected)
    assert rec.errors == []
    stacks = [[f.name for f in profile.stack_frames(s)] for s in profile.samples]
    assert any(any(n.endswith("backward") for n in names) for names in stacks)


# -----------------------------------------------------------------------------
# real transformers models (random weights from a config: no download)
# -----------------------------------------------------------------------------


@pytest.mark.slow
def test_static_kv_cache_lands_on_the_cache_method_and_inuse_matches_live_storages(quiet_gc: None) -> None:
    transformers = pytest.importorskip("transformers")
    config = tiny_llama_config()
    torch.manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (1, 6))
    before = live_storages()  # held: their addresses cannot be reused

    def work() -> Any:
        model = transformers.LlamaForCausalLM(config).eval()
        cache = transformers.StaticCache(config=config, max_cache_len=24)
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=5, do_sample=False, cache=cache, pad_token_id=0)
        return model, cache, out

    profile, (model, cache, out), rec = record(work)
    assert rec.errors == []
    assert out.shape == (1, 11)
    kv = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    kv_bytes = sum(t.untyped_storage().nbytes() for t in kv)
    assert kv_bytes == 2 * config.num_hidden_layers * 24 * config.num_key_value_heads * 16 * 4
    assert by_frame(profile, "StaticLayer > lazy_initialization", INUSE) == kv_bytes
    assert by_frame(profile, "StaticLayer > lazy_initialization", INUSE_N) == len(kv)
    # views are not counted twice: in-use is exactly the storages made in the window still alive
    gc.collect()
    after = live_storages()
    new = {cd: st for cd, st in after.items() if cd not in before}
    assert column(profile, INUSE) == sum(st.nbytes() for st in new.values())
    assert column(profile, INUSE_N) == len(new)
    del before


@pytest.mark.slow
def test_a_model_built_before_start_is_not_attributed() -> None:
    transformers = pytest.importorskip("transformers")
    config = tiny_llama_config()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    ids = torch.randint(0, config.vocab_size, (1, 6))

    def work() -> Any:
        with torch.no_grad():
            model.half().float()  # converts every weight: new storages, made here
            return model.generate(ids, max_new_tokens=4, do_sample=False, cache_implementation="static", pad_token_id=0)

    profile, out, rec = record(work)
    assert rec.errors == []
    classes = {type(m).__name__ for m in model.modules()}
    assert all(leaf_most_init(profile, s, classes) is None for s in profile.samples)
    # the weights (and float buffers) in use now were made by .float() inside the window
    conversions = sum(
        s.values[INUSE] for s in profile.samples if any(f.name == "Module > float" for f in profile.stack_frames(s))
    )
    assert conversions == weights
    assert out.shape == (1, 10)


def test_generate_results_are_unchanged_by_recording() -> None:
    transformers = pytest.importorskip("transformers")
    config = tiny_llama_config()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 5))

    def gen() -> Any:
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static", pad_token_id=0)

    expected = gen()
    _, got, rec = record(gen)
    assert torch.equal(got, expected) and rec.errors == []


def test_llama_stacks_equal_a_full_walk(checked_stacks: StackCheck) -> None:
    transformers = pytest.importorskip("transformers")
    config = tiny_llama_config()
    torch.manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (1, 5))

    def work() -> Any:
        model = transformers.LlamaForCausalLM(config).eval()
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=4, do_sample=False, cache_implementation="static", pad_token_id=0)

    _, _, rec = record(work)
    assert rec.errors == []
    assert checked_stacks.checked > 200
    assert checked_stacks.mismatches == []


@pytest.mark.slow
def test_torch_compile_still_compiles_while_recording() -> None:
    graphs: list[Any] = []

    def backend(gm: Any, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    @torch.compile(backend=backend)
    def scaled(a: Any) -> Any:
        return (a * 4).sin() + 1

    x = torch.randn(16)
    profile, got, rec = record(lambda: scaled(x))
    assert rec.errors == []
    assert len(graphs) == 1  # compiled under the recorder, not run eagerly
    assert torch.allclose(got, (x * 4).sin() + 1)
    scaled(x)
    assert len(graphs) == 1  # and the compiled code is reused afterwards
    # the compiled graph's ops ran with the recorder on (this backend runs them through the dispatcher)
    assert column(profile, INUSE) == got.untyped_storage().nbytes()


COMPILE_NOTE = r"""
import sys, torch
from gpuflame.capture.recorders.dispatch import TorchTensorRecorder

def noted(fn):
    rec = TorchTensorRecorder()
    rec.start()
    keep = fn()
    rec.stop()
    return any("torch.compile compiled code" in c for c in rec.snapshot().comments)

eager = noted(lambda: torch.ones(8) * 2)
compiled = noted(lambda: torch.compile(lambda a: (a * 4).sin(), backend="eager")(torch.ones(8)))
print(eager, compiled)
"""


@pytest.mark.subprocess
def test_a_recording_in_a_process_that_compiled_says_what_the_recorder_misses() -> None:
    """Inductor's generated code allocates outside the dispatcher: a compiled training step showed no gradients."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", COMPILE_NOTE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


@pytest.mark.subprocess
@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # JAX, imported by other tests, warns
def test_a_forked_child_keeps_recording_without_deadlock() -> None:
    import os

    rec = TorchTensorRecorder()
    rec.start()
    rec.ledger.lock.acquire()  # as if another thread held it at the fork
    pid = os.fork()
    if pid == 0:  # the child: must not hang on the inherited, held lock
        code = 1
        try:
            x, line = torch.empty(25), here()
            profile = rec.snapshot()
            rec.stop()
            code = 0 if by_line(profile, line, INUSE) == 100 and x.numel() == 25 else 2
        finally:
            os._exit(code)
    rec.ledger.lock.release()
    _, status = os.waitpid(pid, 0)
    rec.stop()
    assert os.waitstatus_to_exitcode(status) == 0


def test_storages_held_by_autograd_views_and_grad_stay_live() -> None:
    w = torch.randn(100, requires_grad=True)
    rec = TorchTensorRecorder()
    rec.start()
    h, lh = w.exp(), here()  # exp saves its output for backward
    y = h.sum()
    v, lv = torch.randn(50), here()
    view = v[10:20]
    del h, v  # the graph still holds h's storage; the view holds v's
    mid = rec.snapshot()
    assert by_line(mid, lh, INUSE) == 400
    assert by_line(mid, lv, INUSE) == 200
    y.backward()  # frees what the graph saved, makes w.grad
    del y, view
    end = rec.snapshot()
    rec.stop()
    assert by_line(end, lh, INUSE) == 0 and by_line(end, lv, INUSE) == 0
    assert w.grad is not None
    grads = [s for s in end.samples if s.values[INUSE] == 400]
    assert len(grads) == 1  # w.grad, made inside backward(), called from this test
    names = [f.name for f in end.stack_frames(grads[0])]
    assert "test_storages_held_by_autograd_views_and_grad_stay_live" in names


def test_gpuflames_own_threads_are_not_followed() -> None:
    """A dispatch mode left in a gpuflame thread that outlives the interpreter aborted the process at exit."""
    import threading

    from torch.utils._python_dispatch import _get_current_dispatch_mode

    from gpuflame.capture.recorders.dispatch import TorchTensorRecorder

    seen: dict[str, object] = {}

    def look(name: str) -> None:
        seen[name] = _get_current_dispatch_mode()

    rec = TorchTensorRecorder()
    rec.start()
    try:
        for name in ("gpuflame-pyroscope", "worker"):
            t = threading.Thread(target=look, args=(name,), name=name)
            t.start()
            t.join()
    finally:
        rec.stop()
    assert seen["gpuflame-pyroscope"] is None
    assert seen["worker"] is not None
