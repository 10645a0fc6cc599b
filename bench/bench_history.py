"""Memory and time the event history (model/history.py) costs over a long run.

A recorder keeps at most ``MAX_EVENTS`` events and folds the oldest half
into a per-site base when full, so its memory stops growing after the first
fold whatever the run's length. This bench shows it:

1. the dispatch recorder's log (``EventLog``, Python arrays): events at a
   long run's rate fed straight in, bytes held measured after each million
   (``sys.getsizeof`` of its arrays and base);
2. the CPU allocator hook (C++ ``HistoryBooks``): real ``torch.empty`` /
   free pairs through the hook, the process's resident memory measured
   after each million events;
3. what a full history costs once: building the model's ``History`` from
   the log, writing it into a pprof file and reading it back, the file's
   size, and ``at``/``between`` on it.

The rate: the demo's generate loop (examples/demo.py, bench_capture_torch.py)
makes 4,154 allocations, and as many frees, in about 80 ms: ~100,000 events
a second, 360 million in an hour. ``--events`` sets how many are simulated
(default 5 million: five folds; the memory is flat from the first one, so
an hour's worth only takes longer to show the same number).

    python bench/bench_history.py [--events 5000000] [--sites 200]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpuflame.model import history as event_history  # noqa: E402
from gpuflame.model.history import EventLog, History  # noqa: E402
from gpuflame.model.profile import Frame  # noqa: E402

MiB = 1 << 20
DEMO_EVENTS_PER_S = 2 * 4154 / 0.080


def log_bytes(log: EventLog) -> int:
    held = sum(sys.getsizeof(a) for a in (log.times, log.sites, log.sizes))
    held += sys.getsizeof(log.base) + sum(sys.getsizeof(v) + 2 * 28 for v in log.base.values())
    held += sum(sys.getsizeof(p) + len(p) * (56 + 2 * 32) for p in log.past.values())  # the strip's folded points
    return held


def python_log(events: int, sites: int) -> EventLog:
    """Feed *events* alloc/free pairs over *sites* sites; print the log's bytes each million."""
    start = time.time_ns()
    log = EventLog(start, key_of=lambda s: "cpu")
    rng = random.Random(0)
    sizes = [rng.choice((4, 512, 4096, 65536, 1 << 20)) + 16 * rng.randint(0, 64) for _ in range(sites)]
    t0 = time.perf_counter()
    step = max(1, events // 10)
    most = 0
    for k in range(0, events, 2):
        if k % 20_000 == 19_998:  # just before a fold too (measuring costs: not every event)
            most = max(most, log_bytes(log))
        site = rng.randrange(sites)
        t = start + k * 10_000 + rng.randrange(9_000)  # 100,000 events a second
        log.add(t, site, sizes[site])
        log.add(t + rng.randrange(9_000), site, -sizes[site])
        if (k + 2) % step == 0:
            print(
                f"  {k + 2:>11,} events ({(k + 2) / DEMO_EVENTS_PER_S / 60:6.1f} min of the demo loop): "
                f"{log_bytes(log) / MiB:6.1f} MiB held (most so far {most / MiB:.1f}), "
                f"{len(log.times):,} events kept, {log.folded:,} folded"
            )
    took = time.perf_counter() - t0
    print(f"  {took / events * 1e9:.0f} ns per event (fold and the measuring included)")
    return log


def hook_rss(events: int) -> None:
    """Real allocations through the CPU allocator hook; resident memory each million events."""
    try:
        import torch

        from gpuflame.capture.recorders.allocator import TorchAllocatorRecorder
        from gpuflame.capture.recorders.allocator.native import load_cpu_hook
    except Exception as exc:  # noqa: BLE001 - a bench without torch skips this part
        print(f"  skipped: {exc}")
        return
    rec = TorchAllocatorRecorder(load_cpu_hook())
    torch.set_num_threads(1)
    rec.start()
    base = rss()
    step = max(2, events // 10)
    t0 = time.perf_counter()
    for k in range(0, events, 2):
        torch.empty(10)
        if (k + 2) % step == 0:
            print(f"  {k + 2:>11,} events: resident +{(rss() - base) / MiB:6.1f} MiB")
    took = time.perf_counter() - t0
    rec.stop()
    raw = rec._hook.history()
    print(f"  at the end: {len(raw[4]) // 8:,} events kept, {raw[1]:,} folded")
    print(f"  {took / events * 1e9:.0f} ns per event (torch.empty(10) and its free, hook and history)")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def full_history(log: EventLog, sites: int) -> None:
    from gpuflame.formats import pprof
    from gpuflame.model import Profile, memory_sample_types, moment

    frames = [Frame(f"f{i}", "/app/model.py", i) for i in range(sites + 8)]
    t0 = time.perf_counter()
    track = log.track(log.times[-1], (("pid", "1"),))
    history = event_history.of_track(track, lambda s: frames[s : s + 8], lambda s: (("device", "cpu"),))
    built = time.perf_counter() - t0
    p = Profile(memory_sample_types())
    p.history = history
    t0 = time.perf_counter()
    data = pprof.encode(p)
    wrote = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = pprof.decode(data)
    read = time.perf_counter() - t0
    span = (back.history.tracks[0].times[-1] - moment.origin(back)) / 1e9
    t0 = time.perf_counter()
    moment.at(back, span * 0.99)
    moment.between(back, span * 0.95, span)
    verbs = time.perf_counter() - t0
    print(
        f"  {history.events():,} events: build {built:.2f} s, write {wrote:.2f} s, read {read:.2f} s, "
        f"file {len(data) / MiB:.1f} MiB, at + between {verbs:.2f} s"
    )
    assert isinstance(back.history, History)


def demo_cost(rounds: int) -> None:
    """The demo loop under each recorder with its history and without, interleaved, best of *rounds*."""
    try:
        import torch

        sys.path.insert(0, str(ROOT / "bench"))
        from bench_capture_torch import demo_workload
        from gpuflame.capture.recorders.allocator import TorchAllocatorRecorder
        from gpuflame.capture.recorders.allocator.native import load_cpu_hook
        from gpuflame.capture.recorders.dispatch import TorchTensorRecorder
    except Exception as exc:  # noqa: BLE001
        print(f"  skipped: {exc}")
        return
    torch.set_num_threads(1)
    work = demo_workload(4, 32, 16)
    work()
    hook = load_cpu_hook()
    bound = event_history.MAX_EVENTS

    def timed(make, history: bool) -> tuple[float, float]:
        event_history.MAX_EVENTS = bound if history else 0  # 0: the hook keeps none
        rec = make()
        rec.start()
        if not history and isinstance(rec, TorchTensorRecorder):
            rec.ledger.log.add = lambda *_: None
        t0 = time.perf_counter()
        work()
        loop = time.perf_counter() - t0
        rec.stop()
        t0 = time.perf_counter()
        rec.snapshot()
        event_history.MAX_EVENTS = bound
        return loop, time.perf_counter() - t0

    ways = {
        "bare": None,
        "hook, history": (lambda: TorchAllocatorRecorder(hook), True),
        "hook, no history": (lambda: TorchAllocatorRecorder(hook), False),
        "dispatch, history": (TorchTensorRecorder, True),
        "dispatch, no history": (TorchTensorRecorder, False),
    }
    best: dict[str, tuple[float, float]] = {}
    for _ in range(rounds):
        for name, way in ways.items():
            if way is None:
                t0 = time.perf_counter()
                work()
                got = (time.perf_counter() - t0, 0.0)
            else:
                got = timed(*way)
            old = best.get(name)
            best[name] = got if old is None else (min(old[0], got[0]), min(old[1], got[1]))
    base = best["bare"][0]
    for name, (loop, snap) in best.items():
        print(f"  {name:<22} loop {loop * 1e3:6.1f} ms  {loop / base:5.2f}x   profile {snap * 1e3:6.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--sites", type=int, default=200, help="distinct stacks (the demo loop has 159)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of the demo loop comparison")
    args = parser.parse_args()
    print(f"bound: MAX_EVENTS = {event_history.MAX_EVENTS:,} (oldest half folded when full)")
    print("dispatch recorder's log (Python arrays):")
    log = python_log(args.events, args.sites)
    print("CPU allocator hook (C++):")
    hook_rss(args.events)
    print("a full history, once:")
    full_history(log, args.sites)
    print("the demo loop (examples/demo.py, batch 4, 32+16 tokens, 1 thread), with and without the history:")
    demo_cost(args.rounds)


if __name__ == "__main__":
    main()
