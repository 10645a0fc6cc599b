"""What both ways of the ``torch`` backend must record alike: the CPU allocator hook and the dispatch mode.

Each test runs once per recorder (the ``make_recorder`` fixture); what only
one of them does (kernel temporaries, tagged stacks, the hook's build and
fallback) is tested in tests/unit/capture/test_torch_tensors.py (dispatch) and
tests/unit/capture/test_torch_allocator.py (allocator hook). Expectations come
from torch itself (``nbytes()``, ``numel() * element_size()``), never from
the recorder.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gpuflame.capture.base import Recorder  # noqa: E402
from gpuflame.capture.recorders.allocator import TorchAllocatorRecorder  # noqa: E402
from gpuflame.capture.recorders.allocator.native import NativeUnavailable, load_cpu_hook  # noqa: E402
from gpuflame.capture.recorders.dispatch import TorchTensorRecorder  # noqa: E402
from gpuflame.errors import GpuflameError  # noqa: E402
from gpuflame.formats import pprof  # noqa: E402
from gpuflame.model import Profile, moment  # noqa: E402
from gpuflame.model import history as history_module  # noqa: E402
from tests.helpers.torch_helpers import (  # noqa: E402
    ALLOC,
    ALLOC_N,
    INUSE,
    INUSE_N,
    PEAK,
    PEAK_N,
    TYPES,
    Net,
    by_frame,
    by_line,
    column,
    here,
    leaf_most_init,
    live_storages,
    record,
    tiny_llama_config,
)


@pytest.fixture(params=["allocator", "dispatch"])
def make_recorder(request: pytest.FixtureRequest) -> Callable[[], Recorder]:
    """A new recorder of one kind; the allocator hook is built here (skips, saying why, without a compiler)."""
    if request.param == "dispatch":
        return TorchTensorRecorder
    try:
        hook = load_cpu_hook()
    except NativeUnavailable as exc:
        pytest.skip(f"the CPU allocator hook cannot be built here: {exc}")
    return lambda: TorchAllocatorRecorder(hook)


def test_factory_allocations_have_exact_bytes_stack_and_labels(make_recorder: Callable[[], Recorder]) -> None:
    def make() -> Any:
        a, la = torch.empty(10, dtype=torch.float16), here()
        b, lb = torch.zeros(3, 5), here()
        return (a, b), (la, lb)

    profile, ((a, b), (la, lb)), rec = record(make_recorder, make)
    assert rec.errors == []
    assert by_line(profile, la, INUSE) == a.untyped_storage().nbytes() == 20
    assert by_line(profile, lb, INUSE) == 60
    assert by_line(profile, la, INUSE_N) == 1
    sample = next(s for s in profile.samples if profile.frames[s.stack[0]].line == la)
    frames = profile.stack_frames(sample)
    assert frames[0].name == "test_factory_allocations_have_exact_bytes_stack_and_labels > make"
    assert frames[0].file == __file__
    assert frames[1].name == "record" and frames[1].line > 0
    assert all(f.file and f.line > 0 and f.kind == "python" for f in frames)
    assert dict(sample.labels) == {"device": "cpu", "pid": str(os.getpid()), "category": "other"}
    assert profile.default_type == "peak_space"
    assert [t.type for t in profile.sample_types] == TYPES


def test_tensor_literals_count_and_numpy_memory_does_not(make_recorder: Callable[[], Recorder]) -> None:
    np = pytest.importorskip("numpy")
    arr = np.ones(1000)

    def work() -> Any:
        t, lt = torch.tensor([1.0, 2.0, 3.0]), here()
        n, ln = torch.from_numpy(arr), here()
        a, la = torch.as_tensor(arr), here()
        return (t, n, a), (lt, ln, la)

    profile, (_, (lt, ln, la)), rec = record(make_recorder, work)
    assert rec.errors == []
    assert by_line(profile, lt, INUSE) == 12
    assert by_line(profile, ln, ALLOC) == 0
    assert by_line(profile, la, ALLOC) == 0


def test_shared_memory_is_a_blind_spot_measured(make_recorder: Callable[[], Recorder]) -> None:
    """CPU shared memory (a DataLoader worker collates its batches there) comes from no allocator either sees.

    The allocator hook sees the tensor's first storage freed when it moves there;
    the dispatch mode keeps the tensor it made at its size. Made there directly,
    neither sees it (docs/backends.md, blind spots).
    """

    def work() -> Any:
        moved, lm = torch.empty(1000).share_memory_(), here()
        made, lmade = torch.UntypedStorage._new_shared(8000), here()
        return (moved, made), (lm, lmade)

    profile, ((moved, made), (lm, lmade)), rec = record(make_recorder, work)
    assert moved.is_shared() and made.is_shared() and rec.errors == []
    assert by_line(profile, lm, ALLOC) == 4000
    assert by_line(profile, lm, INUSE) == (0 if isinstance(rec, TorchAllocatorRecorder) else 4000)
    assert by_line(profile, lmade, ALLOC) == by_line(profile, lmade, INUSE) == 0


def test_storage_resize_is_a_blind_spot_of_dispatch_measured(make_recorder: Callable[[], Recorder]) -> None:
    """``untyped_storage().resize_(n)`` (FSDP frees and re-gathers flat parameters so) calls no aten op.

    The allocator hook sees the new block; the dispatch mode keeps the storage
    at the size it was made with (docs/backends.md, blind spots).
    """

    def work() -> Any:
        t, lt = torch.zeros(10), here()
        t.untyped_storage().resize_(4000)
        lr = here() - 1
        return t, (lt, lr)

    profile, (t, (lt, lr)), rec = record(make_recorder, work)
    assert t.untyped_storage().nbytes() == 4000 and rec.errors == []
    if isinstance(rec, TorchAllocatorRecorder):
        assert (by_line(profile, lt, INUSE), by_line(profile, lr, INUSE)) == (0, 4000)
    else:
        assert (by_line(profile, lt, INUSE), by_line(profile, lr, INUSE)) == (40, 0)


def test_peak_is_what_was_live_at_the_highest_total(make_recorder: Callable[[], Recorder]) -> None:
    def work() -> Any:
        a, la = torch.empty(250_000), here()  # 1 MB
        del a
        b, lb = torch.empty(125_000), here()  # 0.5 MB
        c, lc = torch.empty(125_000), here()  # 0.5 MB: total 1 MB again, not higher
        d, ld = torch.empty(10), here()  # now higher: b + c + d
        return (b, c, d), (la, lb, lc, ld)

    profile, (_, (la, lb, lc, ld)), _ = record(make_recorder, work)
    assert by_line(profile, la, PEAK) == 0
    assert by_line(profile, lb, PEAK) == 500_000
    assert by_line(profile, lc, PEAK) == 500_000
    assert by_line(profile, ld, PEAK) == 40
    assert column(profile, PEAK) == 1_000_040
    assert column(profile, PEAK_N) == 3
    assert by_line(profile, la, ALLOC) == 1_000_000
    assert by_line(profile, la, INUSE) == 0


def test_peak_keeps_storages_freed_after_it(make_recorder: Callable[[], Recorder]) -> None:
    def work() -> Any:
        keep, lk = torch.empty(100), here()
        big, lb = torch.empty(10_000), here()
        del big  # freed after the peak: still part of it
        small, ls = torch.empty(10), here()
        return (keep, small), (lk, lb, ls)

    profile, (_, (lk, lb, ls)), _ = record(make_recorder, work)
    assert by_line(profile, lb, PEAK) == 40_000
    assert by_line(profile, lk, PEAK) == 400
    assert by_line(profile, ls, PEAK) == 0
    assert by_line(profile, lb, INUSE) == 0


@pytest.mark.slow
def test_snapshot_while_running_and_after_stop(make_recorder: Callable[[], Recorder]) -> None:
    rec = make_recorder()
    assert column(rec.snapshot(), INUSE) == 0  # before start: empty, no error
    rec.start()
    a = torch.empty(100)
    assert column(rec.snapshot(), INUSE) == 400
    b = torch.empty(50)
    del a
    mid = rec.snapshot()
    assert column(mid, INUSE) == 200 and column(mid, PEAK) == 600
    rec.stop()
    del b  # after the window: not seen
    after = rec.snapshot()
    assert column(after, INUSE) == 200
    assert column(after, ALLOC) == 600
    assert rec.errors == []
    rec.stop()  # idempotent


def test_profile_survives_pprof_round_trip(make_recorder: Callable[[], Recorder]) -> None:
    profile, _, _ = record(make_recorder, lambda: torch.nn.Linear(4, 4))
    back = pprof.decode(pprof.encode(profile))
    assert back.totals() == profile.totals()
    assert back.default_type == "peak_space"


def test_parameters_land_on_the_init_that_made_them(make_recorder: Callable[[], Recorder]) -> None:
    profile, net, rec = record(make_recorder, Net)
    assert rec.errors == []
    linear_in_block = sum(p.numel() * p.element_size() for b in net.blocks for p in b.proj.parameters())
    norms = sum(p.numel() * p.element_size() for b in net.blocks for p in b.norm.parameters())
    tables = sum(b.table.numel() * b.table.element_size() for b in net.blocks)
    head = net.head.weight.numel() * net.head.weight.element_size()

    def under(leaf: str, parent: str) -> int:
        total = 0
        for s in profile.samples:
            names = [f.name for f in profile.stack_frames(s)]
            if names[0] == leaf and names[1] == parent:
                total += s.values[INUSE]
        return total

    assert under("Linear > __init__", "Block > __init__") == linear_in_block == 3 * (16 * 32 + 32) * 4
    assert under("LayerNorm > __init__", "Block > __init__") == norms
    assert by_frame(profile, "Block > __init__", INUSE) == tables == 3 * 14
    assert under("Linear > __init__", "Net > __init__") == head
    assert column(profile, INUSE) == linear_in_block + norms + tables + head
    assert column(profile, INUSE_N) == 3 * 5 + 1


def test_concurrent_threads_keep_exact_totals(make_recorder: Callable[[], Recorder]) -> None:
    n = 2000
    barrier = threading.Barrier(3)
    kept: list[Any] = []

    def churn(size: int) -> None:
        barrier.wait()
        x = None
        for _ in range(n):
            x = torch.empty(size)
        kept.append(x)

    def work() -> None:
        threads = [threading.Thread(target=churn, args=(s,)) for s in (10, 20, 30)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    profile, _, rec = record(make_recorder, work)
    assert rec.errors == []
    assert column(profile, ALLOC_N) == 3 * n
    assert column(profile, ALLOC) == n * (10 + 20 + 30) * 4
    assert column(profile, INUSE) == (10 + 20 + 30) * 4
    assert column(profile, PEAK) <= 2 * (10 + 20 + 30) * 4


def test_llama_weights_land_on_their_inits_with_exact_bytes(make_recorder: Callable[[], Recorder]) -> None:
    transformers = pytest.importorskip("transformers")
    config = tiny_llama_config()
    torch.manual_seed(0)
    profile, model, rec = record(make_recorder, lambda: transformers.LlamaForCausalLM(config))
    assert rec.errors == []

    expected: Counter[str] = Counter()
    seen: set[int] = set()
    for module in model.modules():
        tensors = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
        for t in tensors:
            st = t.untyped_storage()
            if st._cdata not in seen:
                seen.add(st._cdata)
                expected[f"{type(module).__name__} > __init__"] += st.nbytes()
    classes = {type(m).__name__ for m in model.modules()}
    got: Counter[str] = Counter()
    for s in profile.samples:
        if s.values[INUSE]:
            got[leaf_most_init(profile, s, classes) or "?"] += s.values[INUSE]
    assert got == expected
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert got["Linear > __init__"] + got["Embedding > __init__"] + got["LlamaRMSNorm > __init__"] == params
    # the MLP's three projections, by stack: Linear > __init__ under LlamaMLP > __init__
    mlp = sum(
        s.values[INUSE]
        for s in profile.samples
        if [f.name for f in profile.stack_frames(s)][:2] == ["Linear > __init__", "LlamaMLP > __init__"]
    )
    assert mlp == sum(p.numel() * p.element_size() for layer in model.model.layers for p in layer.mlp.parameters())


def test_a_second_window_starts_from_nothing(make_recorder: Callable[[], Recorder]) -> None:
    rec = make_recorder()
    rec.start()
    first = torch.empty(100)
    rec.stop()
    rec.start()
    second, line = torch.empty(10), here()
    rec.stop()
    profile = rec.snapshot()
    assert column(profile, ALLOC) == 40 == by_line(profile, line, INUSE)
    assert first.numel() + second.numel() == 110


# -----------------------------------------------------------------------------
# any moment: the event history (model/history.py, model/moment.py)
# -----------------------------------------------------------------------------


def _seconds(profile: Profile, epoch_ns: int) -> float:
    return (epoch_ns - moment.origin(profile)) / 1e9


def test_the_strips_zero_is_the_first_allocation(make_recorder: Callable[[], Recorder]) -> None:
    """Each moment says '0 s is the first allocation at ...'. The dispatch recorder's strip began with a point
    at its log's start, so its 0 was the recording's start: 6 s before the first allocation of a script that
    imported transformers first, and --at 1.5 meant another instant than on the allocator hook."""
    rec = make_recorder()
    rec.start()
    keep = torch.empty(100)
    rec.stop()
    profile = rec.snapshot()
    assert profile.history is not None and keep.numel() == 100
    first = min(t.times[0] for t in profile.history.tracks if len(t.times))
    assert moment.origin(profile) == first


def test_the_strips_last_point_is_the_end_of_the_history(make_recorder: Callable[[], Recorder]) -> None:
    """At the strip's last point ``at`` shows what the profile holds at its end. The allocator hook's last
    point was read after stop()'s walk of the object graph, past the history's end: in a GPT-2 training
    script the strip ran on flat for 90 ms after the window where ``--at`` said 0 B."""

    def train() -> Any:
        model = Net()
        optimizer = torch.optim.AdamW(model.parameters())
        model.head(torch.ones(4, 32)).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return model, optimizer

    raw, kept, rec = record(make_recorder, train)
    profile = pprof.decode(pprof.encode(raw))  # as written to the file
    assert profile.timeline is not None and profile.history is not None and rec.errors == []
    last = profile.timeline.total()[-1][0]
    assert last == moment.end_ns(profile, profile.history)
    end = moment.at(profile, _seconds(profile, last)).totals()
    assert end == {"inuse_space": column(profile, INUSE), "inuse_objects": column(profile, INUSE_N)}
    state = [t for s in kept[1].state.values() for t in s.values()]
    weights = [*kept[0].parameters(), *kept[0].buffers()]
    assert end["inuse_space"] == sum(t.untyped_storage().nbytes() for t in weights + state)


@pytest.mark.slow
def test_any_moment_of_a_generate_loop_with_a_static_kv_cache_is_exact(
    make_recorder: Callable[[], Recorder],
) -> None:
    """At marks the test stamps, ``at`` is exactly the new storages alive then (found by torch, not gpuflame)."""
    transformers = pytest.importorskip("transformers")
    config = tiny_llama_config()
    torch.manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (1, 6))
    gc.collect()
    before = live_storages()  # held: their addresses cannot be reused
    marks: dict[str, tuple[int, int, int]] = {}  # name -> (time, live new bytes, live new storages)

    def mark(name: str) -> None:
        gc.collect()
        marks[name] = (time.time_ns(), 0, 0)
        new = [st for cd, st in live_storages().items() if cd not in before]
        marks[name] = (marks[name][0], sum(st.nbytes() for st in new), len(new))

    def work() -> Any:
        mark("start")
        model = transformers.LlamaForCausalLM(config).eval()
        mark("loaded")
        cache = transformers.StaticCache(config=config, max_cache_len=24)
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=5, do_sample=False, cache=cache, pad_token_id=0)
        mark("generated")
        window = [torch.empty(1000), torch.zeros(300, dtype=torch.float16)]
        del window[0]
        mark("window")
        return model, cache, out, window

    raw, (model, cache, out, window), rec = record(make_recorder, work)
    assert rec.errors == []
    profile = pprof.decode(pprof.encode(raw))  # as written to the file
    for name in ("loaded", "generated", "window"):
        t, nbytes, count = marks[name]
        shown = moment.at(profile, _seconds(profile, t))
        assert shown.totals() == {"inuse_space": nbytes, "inuse_objects": count}, name
    kv = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    kv_bytes = sum(t.untyped_storage().nbytes() for t in kv)
    loaded = moment.at(profile, _seconds(profile, marks["loaded"][0]))
    generated = moment.at(profile, _seconds(profile, marks["generated"][0]))
    assert by_frame(loaded, "StaticLayer > lazy_initialization", 0) == 0
    assert by_frame(generated, "StaticLayer > lazy_initialization", 0) == kv_bytes
    assert by_frame(generated, "StaticLayer > lazy_initialization", 1) == len(kv)
    # allocated within a window: exactly the two tensors made there, the freed one included
    made = moment.between(profile, _seconds(profile, marks["generated"][0]), _seconds(profile, marks["window"][0]))
    assert made.totals() == {"alloc_space": 4000 + 600, "alloc_objects": 2}
    leaves = {made.frames[s.stack[0]].name for s in made.samples}
    assert len(leaves) == 1 and leaves.pop().endswith("work")  # both made by the line in work()
    # the whole window allocated what the profile's alloc_space says
    whole = moment.between(profile, 0, _seconds(profile, marks["window"][0]))
    assert whole.totals()["alloc_space"] == column(profile, ALLOC)
    # the moment of the strip's peak is the profile's peak
    assert moment.at(profile, "peak").totals()["inuse_space"] == column(profile, PEAK)


def test_a_recording_keeps_its_history_bounded(
    make_recorder: Callable[[], Recorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the bound the oldest events are folded: later moments stay exact, earlier ones say why not."""
    monkeypatch.setattr(history_module, "MAX_EVENTS", 64)
    keep = [torch.empty(10)]
    rec = make_recorder()
    rec.start()
    early = time.time_ns()
    for _ in range(200):
        keep.append(torch.empty(7))
        keep.pop(0)
    late = time.time_ns()
    kept = torch.empty(3)
    rec.stop()
    profile = pprof.decode(pprof.encode(rec.snapshot()))
    track = profile.history.tracks[0]
    assert track.folded > 0 and len(track.times) < 64
    assert moment.at(profile, _seconds(profile, late)).totals() == {"inuse_space": 28, "inuse_objects": 1}
    for when in (_seconds(profile, early), "peak"):  # the peak (two of the 7-float tensors) came first
        with pytest.raises(GpuflameError, match="not available: the history of pid .* was folded"):
            moment.at(profile, when)
    assert column(profile, PEAK) == 56
    assert kept.numel() == 3
