"""``gpuflame agent``: profile every CUDA process on this machine through eBPF, with no restart."""

from __future__ import annotations

import argparse
import errno
import json
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from gpuflame.agent.events import LIVE_BLOCKS
from gpuflame.cli.options import add_pyroscope_options, positive_duration, push_interval
from gpuflame.defaults import PUSH_INTERVAL_S
from gpuflame.errors import GpuflameError
from gpuflame.files import atomic_write, check_folder
from gpuflame.launch.store import PROFILE_NAME, RunMeta, new_run_folder, store_root
from gpuflame.printable import printable
from gpuflame.units import format_bytes

PRIVATE_FOLDER_MODE = 0o700  # the run folder of a profile written to the store (its meta.json lists the pids)

HELP = "profile every CUDA process on this machine (eBPF; no restart, any framework)"

DESCRIPTION = """\
Watch the CUDA driver's allocation and free functions in libcuda.so with
uprobes and record, for every allocation, the Python stack that made it (read
from outside the process) or the native stack of a non-Python caller. No
restart, no injection, any framework: PyTorch (every allocator backend,
expandable segments included), JAX, vLLM's cuMem allocator, C++ programs.

Without --pid it watches every process that maps libcuda.so, including those
that start later; with --pid only those (and their fork children). The
profile holds peak, in-use and allocated bytes per stack, with the labels
pid, comm and device (cuda, cuda:N for cuMemCreate's device, or host for
pinned host memory), plus namespace/pod/container/node on Kubernetes.

It prints one line "gpuflame agent: watching ..." once its probes are live
(on a node with no CUDA process yet, it says it is waiting, and probes each
driver file as processes load it), then writes the profile at --duration's end or on Ctrl-C/SIGTERM (to -o,
else the local store), and/or pushes to Pyroscope every --interval (with
--pyroscope, a process that has ended is dropped after its last push, so a
long-running agent holds only live processes). To stop, it takes its probes
off first, then reads what the events ring still holds for a few seconds at most, so a
process flooding the driver cannot hold it up; events left unread are
counted and said.

The agent sees the driver's allocations: the segments PyTorch's caching
allocator reserves, not the tensors inside them (gpuflame run and the webhook
see those). Memory a process held before it started is one frame, <allocated
before the agent started>, where NVML (libnvidia-ml.so.1) can say how much;
without it, only the frees of such blocks are counted. Needs root, or
CAP_BPF + CAP_PERFMON + CAP_SYS_PTRACE."""

EPILOG = """\
examples:
  sudo gpuflame agent --duration 60s -o node.pb.gz         # every CUDA process for a minute
  sudo gpuflame agent --pid 4242 -o server.pb.gz           # one process, until Ctrl-C
  sudo gpuflame agent --pyroscope http://pyroscope:4040    # continuous, every 15s

then: gpuflame report node.pb.gz --label pid=4242"""


def count_arg(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"not a positive number: {text!r}")
    return int(text)


def pid_arg(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pid",
        type=pid_arg,
        action="append",
        default=[],
        metavar="PID",
        help="watch only this process and its fork children (repeatable); default: every process",
    )
    parser.add_argument(
        "--libcuda",
        action="append",
        default=[],
        metavar="PATH",
        help="probe this libcuda.so too (repeatable); default: the ones processes map, "
        "else libcuda.so.1 in the usual library folders",
    )
    parser.add_argument(
        "--duration",
        type=positive_duration,
        metavar="DURATION",
        help="stop after DURATION (30s, 5m); default: at Ctrl-C or SIGTERM",
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="write the profile here (.pb.gz); default: the store")
    parser.add_argument(
        "--native", action="store_true", help="native frames between the driver and the Python caller, too"
    )
    parser.add_argument(
        "--max-blocks",
        type=count_arg,
        default=None,
        metavar="N",
        help=f"live blocks tracked in the kernel (default {LIVE_BLOCKS}); beyond, frees are counted as lost",
    )
    parser.add_argument(
        "--probes",
        choices=("auto", "return", "entry"),
        default="auto",
        help="return: entry and return probes (uretprobes); entry: entry probes only, each result "
        "read back at the call's return site (a plain uprobe) or the thread's next driver call, "
        "for processes a uretprobe could break (longjmp, unwinders; a seccomp filter on Linux "
        "6.11-6.13); auto (default): entry on 6.11-6.13 where a seccomp-filtered process could "
        "be reached, else return",
    )
    parser.add_argument(
        "--hold-late-drivers",
        action="store_true",
        help="stop a process that opens a libcuda file not probed yet (SIGSTOP) until its probes are in, "
        "so its first allocations are seen; at most 1 s, never a process with a terminal or a tracer, "
        "nor while the agent lags (docs/agent.md: the risks)",
    )
    parser.add_argument(
        "--alive-file",
        metavar="FILE",
        help="touch FILE every few seconds while the agent works, for a liveness probe "
        "(python -m gpuflame.agent.alive FILE fails once it is a minute old)",
    )
    parser.add_argument("--store", metavar="DIR", help=f"store folder without -o (default {store_root()})")
    parser.add_argument("--json", action="store_true", help="print a JSON summary at the end (on stdout)")
    ship = add_pyroscope_options(
        parser,
        "one series per container (service_name, namespace, pod, container, node); ",
        "each pod's workload",
        repeatable=True,
    )
    ship.add_argument(
        "--interval",
        type=push_interval,
        default=PUSH_INTERVAL_S,
        metavar="DURATION",
        help=f"push every DURATION (default {PUSH_INTERVAL_S:g}s)",
    )


def run(args: argparse.Namespace) -> int:
    from gpuflame.agent.agent import Agent, AgentError
    from gpuflame.agent.kube import Placement

    output = _output(args)
    alive_file = _alive_file(args)
    push = _push(args)
    placement = Placement.from_env()
    agent = Agent(
        pids=args.pid,
        libcuda=args.libcuda,
        native=args.native,
        max_blocks=args.max_blocks or LIVE_BLOCKS,
        labels_for=placement.labels,
        probes=args.probes,
        alive_file=alive_file,
        hold=args.hold_late_drivers,
    )
    started = time.time()
    try:
        agent.start()
    except AgentError as exc:
        agent.stop()
        raise GpuflameError(str(exc)) from None
    done = threading.Event()
    previous = {sig: signal.signal(sig, lambda _s, _f: done.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    sys.stderr.write(printable(agent.watching()) + "\n")  # it names files in containers
    sys.stderr.flush()
    try:
        _wait(args, agent, push, done)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        agent.stop()
        profile = agent.snapshot()
        if push is not None:
            push.submit(profile)
            push.close()
    if output is None:
        folder = new_run_folder(Path(args.store) if args.store else store_root(), ["agent"], started)
        folder.chmod(PRIVATE_FOLDER_MODE)
        output = folder / PROFILE_NAME
    _write(profile, output)
    totals = profile.totals()
    pids = sorted({int(p) for p in profile.label_values("pid")})
    if args.output is None:
        RunMeta(
            command=["gpuflame", "agent", *sys.argv[2:]],
            started=started,
            ended=time.time(),
            exit_code=0,
            backend="agent",
            processes=pids,
            totals=totals,
            lost=profile.comments[1:],
        ).write(output.parent)
    _say(args, output, profile.comments, totals, pids, _stop_said(agent), agent.losses(), agent.holds())
    return 0


def _stop_said(agent: object) -> dict[str, object]:
    """How the stop went, for --json: each step's start and end (seconds since the stop began), the bound on
    the drain, and the events left unread."""
    from gpuflame.agent.agent import COUNT_AT_STOP_S, DRAIN_AT_STOP_S

    steps = {name: [round(t, 4) for t in span] for name, span in agent.stop_steps.items()}  # type: ignore[attr-defined]
    left = agent.counts["left_in_ring"]  # type: ignore[attr-defined]
    return {"drain_bound_s": DRAIN_AT_STOP_S, "count_bound_s": COUNT_AT_STOP_S, "left_in_ring": left, **steps}


def _write(profile: object, output: Path) -> None:
    """The node-wide profile, readable by its owner only (every process's stacks, names and pods)."""
    from gpuflame.agent.agent import OUTPUT_MODE
    from gpuflame.formats import dumps, save

    if str(output) == "-":
        save(profile, output)  # type: ignore[arg-type]
    else:
        atomic_write(output, dumps(profile), mode=OUTPUT_MODE)  # type: ignore[arg-type]


def _output(args: argparse.Namespace) -> Path | None:
    """-o checked now, by making a file beside it: not after --duration has been spent."""
    if not args.output:
        if args.store:
            check_folder(args.store)
        return None
    path = Path(args.output)
    if str(path) == "-":
        return path
    if path.is_dir():
        raise GpuflameError(f"-o {args.output}: is a folder; give a file name such as node.pb.gz")
    folder = path.parent
    if not folder.is_dir():
        raise GpuflameError(f"-o {args.output}: no such folder {folder}")
    try:
        fd, probe = tempfile.mkstemp(prefix=".gpuflame-probe.", dir=folder)
    except OSError as exc:  # /proc and /sys answer "no such file" for a folder that is there
        why = "no file can be made there (a kernel file system)" if exc.errno == errno.ENOENT else exc.strerror
        raise GpuflameError(f"-o {args.output}: cannot write in {folder}: {why}") from None
    os.close(fd)
    os.unlink(probe)
    return path


def _alive_file(args: argparse.Namespace) -> str | None:
    """The liveness file, touched once now: a folder that is not there fails at start, not in the probe."""
    if not args.alive_file:
        return None
    from gpuflame.agent import alive

    try:
        alive.touch(args.alive_file)
    except OSError as exc:
        raise GpuflameError(f"--alive-file {args.alive_file}: {exc.strerror}") from None
    return args.alive_file


def _push(args: argparse.Namespace):  # noqa: ANN202 - AgentPush, imported late
    if not args.pyroscope:
        return None
    from gpuflame.agent.push import AgentPush
    from gpuflame.ship.pyroscope import Credentials

    credentials = Credentials.from_env(
        user=args.pyroscope_user or "",
        token_file=args.pyroscope_token_file or "",
        password_file=args.pyroscope_password_file or "",
    )
    tenant = args.tenant or os.environ.get("GPUFLAME_TENANT", "")  # the webhook's Secret key, as its pods get it
    return AgentPush(
        args.pyroscope,
        service=args.service_name or "",
        tenant=tenant,
        ca=args.pyroscope_ca or "",
        credentials=credentials,
    )


def _wait(args: argparse.Namespace, agent: object, push: object, done: threading.Event) -> None:
    """Until --duration, Ctrl-C or SIGTERM (*done*); a snapshot to Pyroscope every interval meanwhile."""
    end = time.monotonic() + args.duration if args.duration else float("inf")
    next_push = time.monotonic() + args.interval
    while not done.is_set():
        now = time.monotonic()
        if now >= end:
            break
        if push is not None and now >= next_push:
            next_push = now + args.interval
            push.submit(agent.snapshot())  # type: ignore[attr-defined]
            agent.forget_exited()  # type: ignore[attr-defined]  # ended processes went in this push
        until = min(end, next_push if push is not None else end)
        done.wait(None if until == float("inf") else until - now)


def _say(
    args: argparse.Namespace,
    output: Path,
    comments: list[str],
    totals: dict[str, int],
    pids: list[int],
    stop: dict[str, object],
    losses: dict[str, object],
    holds: dict[str, int],
) -> None:
    from gpuflame.agent.agent import NO_CUDA_PROCESS

    lost = [c for c in comments[1:] if c != NO_CUDA_PROCESS]  # an idle node lost nothing
    for note in lost:
        sys.stderr.write(printable(note) + "\n")  # it may name a process's own files
    if args.json:
        sys.stdout.write(
            json.dumps(
                {
                    "profile": str(output.resolve()),
                    "processes": pids,
                    "totals": totals,
                    "lost": lost,
                    "losses": losses,
                    **({"holds": holds} if holds else {}),
                    "stop": stop,
                }
            )
            + "\n"
        )
        return
    if not pids:
        seen = "no CUDA process was seen" if NO_CUDA_PROCESS in comments else "no allocation was seen"
        sys.stderr.write(f"gpuflame agent: {seen}; the profile is empty: {output}\n")
        return
    n = len(pids)
    sys.stderr.write(
        f"gpuflame agent: profile of {n} process{'es' if n > 1 else ''}, "
        f"peak {format_bytes(totals['peak_space'])}{' (each process at its own peak)' if n > 1 else ''}, "
        f"in use {format_bytes(totals['inuse_space'])}: {output}\n"
        f"gpuflame agent: next: gpuflame report {shlex.quote(str(output))}\n"
    )
