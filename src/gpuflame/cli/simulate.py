"""``gpuflame simulate``: replay a recorded run through a model of PyTorch's CUDA caching allocator."""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import replace
from typing import Any

from gpuflame.cli.common import add_force_option, print_json
from gpuflame.errors import GpuflameError, ProfileFormatError
from gpuflame.files import check_output
from gpuflame.formats.load_save import save
from gpuflame.printable import printable
from gpuflame.simulate.allocator import PYTORCH_RULES
from gpuflame.simulate.fragmentation import fragmentation_profile
from gpuflame.simulate.gpus import CUDA_CONTEXT, fits_on
from gpuflame.simulate.gpus import capacity as parse_capacity
from gpuflame.simulate.outcome import Outcome
from gpuflame.simulate.replay import Candidate, Run, explain, read_input, settings_for, suggest
from gpuflame.units import format_bytes

HELP = "replay a run through PyTorch's caching allocator: fragmentation, OOM on another GPU, other settings"

DESCRIPTION = f"""\
Replay the allocation history of INPUT through a model of PyTorch's CUDA
caching allocator (the rules of PyTorch {PYTORCH_RULES}'s CUDACachingAllocator.cpp)
and say what the allocator would do: reserved and allocated peaks, the
memory reserved but unused at the reserved peak (fragmentation), the
segments made, and, on a smaller GPU, the first allocation that would fail.

INPUT is a PyTorch memory snapshot with a trace (torch.cuda.memory.
_record_memory_history, then _dump_snapshot) or a gpuflame profile with its
event history (any torch backend; a CPU run is predicted for cuda:0).

Under the recorded settings the replay is checked against the recording:
the share of allocations placed at the recorded segment and offset, and
whether the segments made and freed are the recorded ones.
"""

EPILOG = """\
examples:
  gpuflame simulate snapshot.pickle
  gpuflame simulate snapshot.pickle --alloc-conf expandable_segments:True
  gpuflame simulate snapshot.pickle --gpu-memory L4
  gpuflame simulate run.pb.gz --gpu-memory 24GiB --suggest
  gpuflame simulate snapshot.pickle --json

--alloc-conf takes PYTORCH_CUDA_ALLOC_CONF's syntax; the keys it does not
name keep the recorded value (PyTorch's defaults when the file records
none). --gpu-memory is a size or a GPU name (T4, L4, A10G, A100-40GB,
A100-80GB, H100-80GB, H200, ...); 512 MiB of it is left for the CUDA context.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", metavar="INPUT", help="PyTorch snapshot with a trace, or a gpuflame profile")
    parser.add_argument("--alloc-conf", metavar="STR", help="settings to try, in PYTORCH_CUDA_ALLOC_CONF syntax")
    parser.add_argument("--gpu-memory", metavar="SIZE|GPU", help="the device's memory: cudaMalloc fails past it")
    parser.add_argument(
        "--memory-fraction",
        metavar="F",
        type=float,
        help="the program calls torch.cuda.set_per_process_memory_fraction(F): a limit of F x --gpu-memory, "
        "and the only case where garbage_collection_threshold acts",
    )
    parser.add_argument("--device", metavar="cuda:N", help="replay this device only")
    parser.add_argument(
        "--suggest", action="store_true", help="try the settings that usually help; say which helps most"
    )
    parser.add_argument("--json", action="store_true", help="the answer as JSON")
    parser.add_argument(
        "-o", "--output", metavar="OUT", help="write the fragmentation profile here (pprof; any gpuflame view opens it)"
    )
    add_force_option(parser)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ProfileFormatError as exc:  # the snapshot's reader and the replay say what is wrong; this says where
        if str(exc).startswith(args.input):
            raise
        raise ProfileFormatError(f"{args.input}: {exc}") from None


def _run(args: argparse.Namespace) -> int:
    inp = read_input(args.input)
    settings = settings_for(inp, args.alloc_conf)
    capacity, how = parse_capacity(args.gpu_memory) if args.gpu_memory else (None, "")
    fraction_limit = _fraction_limit(args.memory_fraction, capacity)
    if fraction_limit is not None and capacity is not None:
        how += f"; set_per_process_memory_fraction({args.memory_fraction:g}) allows {format_bytes(fraction_limit)}"
    if args.device is not None and not re.fullmatch(r"cuda:\d+", args.device):
        raise GpuflameError(f"--device: expected cuda:N, got {args.device!r}")
    if args.output:
        check_output(args.output, [args.input], force=args.force)
    main = Run(inp, settings, capacity, args.device, fraction_limit)
    outcomes, tried = _replay(main, args)
    if args.output:
        save(fragmentation_profile(main), args.output)
    if args.json:
        print_json(_as_json(outcomes, tried, capacity, how))
        return _exit_code(capacity, outcomes)
    lines = [
        f"PyTorch {PYTORCH_RULES} caching-allocator rules; settings: {settings.describe()}"
        + (" (as recorded)" if main.recorded and inp.snapshot is not None and not inp.notes else "")
    ]
    if how:
        lines.append(f"device memory: {format_bytes(min(capacity or 0, fraction_limit or capacity or 0))} ({how})")
    if settings.garbage_collection_threshold and fraction_limit is None:
        lines.append(GC_IDLE)
    for o in outcomes:
        lines += describe(o, capacity)
    if _processes(outcomes) > 1 and capacity is not None:
        lines.append(first_oom(outcomes))
    if tried:  # the verdict names what ran out of memory: the recorded settings, or those --alloc-conf gave
        replayed = "the recorded settings" if main.recorded else f"the settings given ({settings.describe()})"
        several = _processes(outcomes) > 1
        lines += per_process(outcomes, tried, replayed) if several else verdict(outcomes, tried, replayed)
    if args.output:
        lines.append(f"wrote the fragmentation profile to {args.output} (gpuflame flame {args.output})")
    sys.stdout.write("".join(printable(line) + "\n" for line in lines))
    return _exit_code(capacity, outcomes)


def _replay(main: Run, args: argparse.Namespace) -> tuple[list[Outcome], list[Candidate]]:
    """The replay of the settings asked for, its smallest device and its why; the settings --suggest tries."""
    outcomes = main.outcomes()
    for o, least in zip(outcomes, main.smallest_devices(args.memory_fraction), strict=True):
        o.min_gpu_memory, o.searched = least, True
    known = main.capacity is not None
    if not main.recorded:  # what the change did, beside the recorded settings on the same device
        base = Run(main.inp, main.inp.recorded, main.capacity, main.device, main.fraction_limit).outcomes()
        explain(outcomes, base, known)
    tried = suggest(main.inp, main.capacity, main.device, args.memory_fraction) if args.suggest else []
    for c in tried:
        explain(c.outcomes, outcomes, known)
    return outcomes, tried


def _as_json(outcomes: list[Outcome], tried: list[Candidate], capacity: int | None, how: str) -> dict[str, Any]:
    data: dict[str, Any] = {
        "pytorch_rules": PYTORCH_RULES,
        "capacity": capacity,
        "capacity_from": how or None,
        "devices": [o.to_json() for o in outcomes],
    }
    if _processes(outcomes) > 1 and capacity is not None:
        first = _by_oom_time(outcomes)
        data["first_oom"] = first[0].device if first else None
    if tried:
        data["suggest"] = [
            {
                "settings": c.change,
                "alloc_conf": c.settings.describe(),
                "code": c.code,
                "devices": [o.to_json() for o in c.outcomes],
            }
            for c in tried
        ]
    return data


def _exit_code(capacity: int | None, outcomes: list[Outcome]) -> int:
    """1 where --gpu-memory is given and the settings replayed run out of memory on it (a CI gate), else 0."""
    return 1 if capacity is not None and any(o.oom for o in outcomes) else 0


def describe(o: Outcome, capacity: int | None) -> list[str]:
    """One device's answer in plain words."""
    s = o.simulated
    peak = s["reserved_peak"]
    rec = o.recorded
    if o.oom and o.oom["size"] is None:  # out of memory before the trace: its peaks would mislead
        out = [f"{o.device}:", *describe_oom(o.oom)]
        if rec:
            out.append(f"  recorded reserved peak {format_bytes(rec['reserved_peak'])}")
        return out + [f"  note: {n}" for n in o.notes]
    was = f" (recorded {format_bytes(rec['reserved_peak'])})" if rec else ""
    out = [
        f"{o.device}:",
        # block sizes as the allocator hands them out (rounded): report's 'allocated' is requested bytes
        f"  reserved peak {format_bytes(peak)}{was}; allocated peak {format_bytes(s['allocated_peak'])} in blocks",
        "  reserved but unused: "
        + _unused(s["fragmentation_at_peak"], peak, "at the reserved peak")
        + "; "
        + _unused(s["fragmentation_at_allocated_peak"], s["reserved_at_allocated_peak"], "at the allocated peak"),
        f"  segments made {s['segments_allocated']}"
        + (f" (recorded {rec['segments_allocated']})" if rec else "")
        + f", freed {s['segments_freed']}",
    ]
    if o.why:
        out.append(f"  why (beside the recorded settings): {o.why}")
    if o.wrapped:
        n = o.entries
        held = "" if n is None else f" (it holds {n:,} {'entry' if n == 1 else 'entries'})"
        out.append(f"  the trace starts part way through the run{held}: replayed from the state at its first event")
    if o.placed_same is not None:
        same = "the same as recorded" if o.segment_events_equal else "NOT the recorded ones"
        out.append(
            f"  agreement: {100 * o.placed_same:.1f}% of {o.allocations:,} "
            f"{'allocation' if o.allocations == 1 else 'allocations'} at the recorded "
            f"segment and offset; segment events {same}"
        )
    if o.first_difference:
        d = o.first_difference
        out.append(f"  first difference at trace event {d['event']}: {d['why']}")
    if o.oom:
        out += describe_oom(o.oom)
    elif capacity is not None and o.capacity is not None:
        out.append(f"  fits: headroom {format_bytes(o.capacity - peak)} at the reserved peak")
    if o.min_gpu_memory is not None or o.searched:
        out.append(f"  smallest device it fits: {fits_on(o.min_gpu_memory)}")
    out += [f"  note: {n}" for n in o.notes]
    return out


def _unused(unused: int, reserved: int, where: str) -> str:
    return f"{format_bytes(unused)} ({100 * unused / reserved if reserved else 0:.1f}%) {where}"


def describe_oom(m: dict[str, Any]) -> list[str]:
    """The out-of-memory line: the request, the segment it needed, what the allocator held then."""
    held = f"allocated {format_bytes(m['allocated'])}, cached {format_bytes(m['cached'])}"
    if m["size"] is None:
        return [
            f"  OUT OF MEMORY before the trace: it starts with {format_bytes(m['allocated'] + m['cached'])} "
            f"reserved ({held}), more than the {format_bytes(m['capacity'])} the device allows; "
            "no event of the trace is to blame"
        ]
    stack = m["stack"]
    leaf = next((n for n in reversed(stack) if not n.startswith("<")), stack[-1] if stack else "?")
    phase = f" in phase {m['phase']}" if m.get("phase") else ""
    where = "before the history's window" if m["at_start"] else f"at event {m['event']}"
    where += " (as recorded)" if m.get("recorded") else ""
    return [
        f"  OUT OF MEMORY {where}{phase}: a request of {format_bytes(m['size'])} from {leaf} needed "
        f"{format_bytes(m['segment_size'])} more from the device; {held} then, "
        f"{format_bytes(m['capacity'])} allowed",
        "    stack: " + " -> ".join(stack),
    ]


NO_GC = (
    "  garbage_collection_threshold: not tried (the collector runs only where a memory fraction is set: --gpu-memory)"
)


def _fraction_limit(fraction: float | None, capacity: int | None) -> int | None:
    """set_per_process_memory_fraction's allowed_memory_maximum: the fraction of the device's total memory."""
    if fraction is None:
        return None
    if capacity is None:
        raise GpuflameError("--memory-fraction: give the device's memory too (--gpu-memory): F is a share of it")
    if not 0.0 < fraction <= 1.0:
        raise GpuflameError(f"--memory-fraction: F is between 0 and 1 (PyTorch's rule), got {fraction:g}")
    return int(fraction * (capacity + CUDA_CONTEXT))


GC_IDLE = (
    "note: garbage_collection_threshold does nothing here: PyTorch runs the collector only where the program set "
    "a memory fraction (torch.cuda.set_per_process_memory_fraction); if it did, give --memory-fraction F"
)


def _total(outs: list[Outcome]) -> int:
    return sum(o.simulated["reserved_peak"] for o in outs)


def _tried(c: Candidate, was: int, base_oom: bool) -> list[str]:
    """One setting tried: its reserved peak (or whether it fits), its smallest device, and why, measured."""
    outs, peak = c.outcomes, format_bytes(_total(c.outcomes))
    oom = any(o.oom for o in outs)
    if base_oom:
        head = f"  {c.change}: " + ("out of memory too" if oom else f"fits, reserved peak {peak}")
    else:
        head = f"  {c.change}: reserved peak {peak}, was {format_bytes(was)}" + (" (out of memory)" if oom else "")
    return [f"{head}; fits from {_least(outs)}", *(f"    why{_on(o, outs)}: {o.why}" for o in outs if o.why)]


def verdict(base: list[Outcome], tried: list[Candidate], replayed: str) -> list[str]:
    """Which tried setting lowers the reserved peak most (summed over devices), or fits where the others do not;
    the one change to make, and the smallest device it (or, where none helps, the settings replayed) fits.
    *replayed* names the settings the base ran ("the recorded settings", or those --alloc-conf gave)."""
    was, base_oom = _total(base), any(o.oom for o in base)
    lines = ["settings tried:", *(line for c in tried for line in _tried(c, was, base_oom))]
    if not any(c.fraction_limit for c in tried):
        lines.append(NO_GC)
    fitting = sorted((_total(c.outcomes), n) for n, c in enumerate(tried) if not any(o.oom for o in c.outcomes))
    as_is = f"  smallest device the settings replayed fit: {fits_on(_largest_need(base))}" if _searched(base) else ""
    if base_oom and not fitting:
        return [*lines, "verdict: none of the settings tried avoids running out of memory", as_is]
    if not base_oom and (not fitting or fitting[0][0] >= was):
        return [*lines, "verdict: none of the settings tried lowers the reserved peak", as_is]
    peak, best = fitting[0][0], tried[fitting[0][1]]
    if base_oom:
        head = f"verdict: {best.change} fits (reserved peak {format_bytes(peak)}); {replayed} run out of memory"
    else:
        head = (
            f"verdict: {best.change} helps most: reserved peak {format_bytes(peak)}, was {format_bytes(was)} "
            f"({100 * (was - peak) / was:.1f}% less)"
        )
    smallest = f"  smallest device it fits: {fits_on(_largest_need(best.outcomes))}"
    return [*lines, head, f"  to use it: {best.advice}", smallest + (f" (was {_least(base)})" if as_is else "")]


def _processes(outcomes: list[Outcome]) -> int:
    """How many processes of a merged run the outcomes are (1 for a snapshot or a single process)."""
    return len({o.pid for o in outcomes if o.pid})


def _who(o: Outcome) -> str:
    return f"rank {o.rank} (pid {o.pid})" if o.rank else f"pid {o.pid}"


def _by_oom_time(outcomes: list[Outcome]) -> list[Outcome]:
    """The processes that run out of memory, the first first (before the trace counts as first)."""

    def when(o: Outcome) -> int:
        m = o.oom or {}
        return -1 if m.get("at_start") else (m.get("time_ns") or 0)

    return sorted((o for o in outcomes if o.oom), key=when)


def first_oom(outcomes: list[Outcome]) -> str:
    """Which rank runs out of memory first, each process on a device of its own."""
    ooms = _by_oom_time(outcomes)
    if not ooms:
        return "every process fits, each on a device of its own"
    first, rest = ooms[0], ooms[1:]
    t = first.oom["time_ns"] if first.oom else None
    line = f"first to run out of memory: {_who(first)} on {first.device.split(' ')[0]}"
    if rest and t is not None and rest[0].oom and rest[0].oom.get("time_ns") is not None:
        line += f", {(rest[0].oom['time_ns'] - t) / 1e9:.3f} s before {_who(rest[0])}"
    fit = len(outcomes) - len(ooms)
    return line + (f"; {fit} of {len(outcomes)} fit" if fit else f"; all {len(outcomes)} run out of memory")


def per_process(outcomes: list[Outcome], tried: list[Candidate], replayed: str) -> list[str]:
    """The settings tried and the verdict of each process, on its own device."""
    lines = []
    for k, o in enumerate(outcomes):
        own = verdict([o], [replace(c, outcomes=[c.outcomes[k]]) for c in tried], replayed)
        own[0] = f"settings tried for {o.device}:"
        lines += [
            own[0],
            *("  " + line if line.startswith(("verdict", "  to use", "  smallest")) else line for line in own[1:]),
        ]
    return lines


def _on(o: Outcome, outs: list[Outcome]) -> str:
    return f" on {o.device}" if len(outs) > 1 else ""


def _searched(outs: list[Outcome]) -> bool:
    return all(o.searched for o in outs)


def _largest_need(outs: list[Outcome]) -> int | None:
    """The device every one of *outs* fits on (each device needs its own GPU of that size)."""
    needs = [o.min_gpu_memory for o in outs]
    return None if any(n is None for n in needs) else max(n for n in needs if n is not None)


def _least(outs: list[Outcome]) -> str:
    need = _largest_need(outs)
    return "no device up to 1 TiB" if need is None else f"{need >> 20} MiB"
