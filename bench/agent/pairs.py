"""Alloc+free pairs through the stand-in libcuda from a Python caller at a given stack depth.

Commands on stdin: ``time DEPTH N`` prints the best of 5 runs of N pairs in ns of this process's CPU per pair;
``guarded DEPTH N`` the same in a new thread whose interpreter frames sit right above a page that cannot be read
(then the word ``unguarded`` where that layout could not be made); ``rate PAIRS_PER_S SECONDS DEPTH`` runs pairs
at that rate and prints how many it made.
"""

import ctypes
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "agent"))
from guarded import run_guarded  # noqa: E402  (the test suite's: standard library only)

LIB = ctypes.CDLL(sys.argv[1])
LIB.cuInit(0)
alloc, free = LIB.cuMemAlloc_v2, LIB.cuMemFree_v2
u64 = ctypes.c_uint64


def pairs(n):
    p = u64()
    ref = ctypes.byref(p)
    start = time.process_time_ns()  # this process's CPU (its uprobes run in it): immune to a busy machine
    for _ in range(n):
        alloc(ref, 4096)
        free(p)
    return time.process_time_ns() - start


def paced(rate, seconds):
    p = u64()
    ref = ctypes.byref(p)
    done, start = 0, time.perf_counter()
    end = start + seconds
    while True:
        now = time.perf_counter()
        if now >= end:
            return done
        due = int((now - start) * rate) + 100
        if done >= due:
            time.sleep(0.0005)  # ahead of the pace: leave the CPU to others (the agent's reader)
        while done < due:
            alloc(ref, 4096)
            free(p)
            done += 1


def at_depth(depth, fn, *args):
    if depth <= 1:
        return fn(*args)
    return at_depth(depth - 1, fn, *args)


def timed(depth, n):
    runs = []
    for _ in range(5):
        runs.append(at_depth(depth - 2, pairs, n))  # the caller and pairs() are the other 2 frames
        time.sleep(0.2)  # the agent's reader drains the ring between runs: none dropped
    return min(runs) / n


def guarded(depth, n):
    """``timed`` in a new thread whose first interpreter frame starts right above an unreadable page (as
    where a process's data stack lands above a gap), or None where that layout could not be made."""
    made, ns = run_guarded(timed, depth, n)
    return ns if made else None


print("ready", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "time":
        print(timed(int(cmd[1]), int(cmd[2])), flush=True)
    elif cmd[0] == "guarded":
        ns = guarded(int(cmd[1]), int(cmd[2]))
        print("unguarded" if ns is None else ns, flush=True)
    elif cmd[0] == "rate":
        print(at_depth(int(cmd[3]) - 2, paced, float(cmd[1]), float(cmd[2])), flush=True)
    elif cmd[0] == "exit":
        break
