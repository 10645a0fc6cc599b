"""A workload with known stacks for the agent's tests: runs on any CPython 3.10+, standard library only.

It calls the stand-in libcuda through ctypes and writes, for every call, a
JSON line with what it did and the Python stack that did it (from
``sys._getframe`` on the line of the call: one line each, ``# fmt: skip``), so a test can compute the exact
profile the agent must produce. Commands come one per line on stdin
(``load``, ``open`` and ``model N`` with ``late``, ``basic``, ``ptsz``, ``vmm``, ``threads``, ``race N``,
``crowd N``, ``cells N``, ``deep N``, ``guarded N`` (deep N in a thread whose frames sit right above an
unreadable page, tests/agent/guarded.py; ``unguarded`` is said where that layout cannot be made), ``hold``,
``release``, ``fork``, ``refused``, ``refused_vmm``, ``init``,
``oom``, ``exit``); ``ready`` and ``done`` lines pace the test. With the argument
``seccomp`` it first puts itself under an allow-all seccomp filter.
"""

import ctypes
import json
import os
import sys
import threading

from guarded import run_guarded  # this folder's (the script's own)

LIB = None if "late" in sys.argv else ctypes.CDLL(sys.argv[1])  # late: loaded by the command load


def seccomp_allow_all():
    """A seccomp filter that allows everything: the process reads as filtered (as under a container runtime)."""

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]

    allow = (Filter * 1)(Filter(0x06, 0, 0, 0x7FFF0000))  # BPF_RET|BPF_K, SECCOMP_RET_ALLOW
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
    assert libc.prctl(22, 2, ctypes.byref(Prog(1, allow)), 0, 0) == 0  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


if "seccomp" in sys.argv:
    seccomp_allow_all()
OUT = sys.stdout
_lock = threading.Lock()
u64 = ctypes.c_uint64
size_t = ctypes.c_size_t


def stack(frame):
    """[(qualname or None, co_name, file, firstlineno, line)] leaf first, as in-process capture sees them."""
    out = []
    while frame is not None:
        code = frame.f_code
        out.append(
            [getattr(code, "co_qualname", None), code.co_name, code.co_filename, code.co_firstlineno, frame.f_lineno]
        )
        frame = frame.f_back
    return out


def say(**record):
    with _lock:
        OUT.write(json.dumps(record) + "\n")
        OUT.flush()


def check(rc, api, addr, size, device, where):
    say(op="alloc" if rc == 0 else "failed", api=api, addr=addr, size=size, device=device, stack=where, pid=os.getpid())
    return addr


# -- the driver calls: each makes its call and takes its stack on one line -------------------------


def device_alloc(n):
    p = u64(); rc = LIB.cuMemAlloc_v2(ctypes.byref(p), size_t(n)); here = stack(sys._getframe())  # noqa: E702  # fmt: skip
    return check(rc, "cuMemAlloc_v2", p.value, n, "cuda", here)


def async_alloc(n):
    p = u64(); rc = LIB.cuMemAllocAsync(ctypes.byref(p), size_t(n), None); here = stack(sys._getframe())  # noqa: E702  # fmt: skip
    return check(rc, "cuMemAllocAsync", p.value, n, "cuda", here)


def pool_alloc(n):
    p = u64(); rc = LIB.cuMemAllocFromPoolAsync(ctypes.byref(p), size_t(n), None, None); here = stack(sys._getframe())  # noqa: E501,E702  # fmt: skip
    return check(rc, "cuMemAllocFromPoolAsync", p.value, n, "cuda", here)


def ptsz_alloc(n):
    p = u64(); rc = LIB.cuMemAllocAsync_ptsz(ctypes.byref(p), size_t(n), None); here = stack(sys._getframe())  # noqa: E501,E702  # fmt: skip
    return check(rc, "cuMemAllocAsync_ptsz", p.value, n, "cuda", here)


def ptsz_pool_alloc(n):
    p = u64(); rc = LIB.cuMemAllocFromPoolAsync_ptsz(ctypes.byref(p), size_t(n), None, None); here = stack(sys._getframe())  # noqa: E501,E702  # fmt: skip
    return check(rc, "cuMemAllocFromPoolAsync_ptsz", p.value, n, "cuda", here)


def managed_alloc(n):
    p = u64(); rc = LIB.cuMemAllocManaged(ctypes.byref(p), size_t(n), 1); here = stack(sys._getframe())  # noqa: E702  # fmt: skip
    return check(rc, "cuMemAllocManaged", p.value, n, "cuda", here)


def pitch_alloc(width, height):
    p, pitch = u64(), size_t(); rc = LIB.cuMemAllocPitch_v2(ctypes.byref(p), ctypes.byref(pitch), size_t(width), size_t(height), 4); here = stack(sys._getframe())  # noqa: E501,E702  # fmt: skip
    return check(rc, "cuMemAllocPitch_v2", p.value, pitch.value * height, "cuda", here)


class Prop(ctypes.Structure):
    """CUmemAllocationProp: type, requestedHandleTypes, location {type, id}, win32HandleMetaData, allocFlags."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("handle_types", ctypes.c_int),
        ("loc_type", ctypes.c_int),
        ("loc_id", ctypes.c_int),
        ("win32", ctypes.c_void_p),
        ("flags", ctypes.c_ubyte * 8),
    ]


def vmm_create(n, device):
    prop = Prop(1, 0, 1, device)
    h = u64(); rc = LIB.cuMemCreate(ctypes.byref(h), size_t(n), ctypes.byref(prop), u64(0)); here = stack(sys._getframe())  # noqa: E501,E702  # fmt: skip
    return check(rc, "cuMemCreate", h.value, n, f"cuda:{device}", here)


def vmm_lifetimes():
    """VMM memory is held while a handle or a mapping holds it (cuMemRelease and cuMemUnmap drop one each): a
    release while mapped, a retained handle (as NCCL does), then the last drop frees it. The log's "free" is
    that last drop, made here by counting as the driver does."""
    va = 0x7E0000000000  # a made-up reserved range (the stand-in needs no cuMemAddressReserve)
    size = 12 << 20
    h = vmm_create(size, 0)
    assert LIB.cuMemMap(u64(va), size_t(size), size_t(0), u64(h), u64(0)) == 0
    assert LIB.cuMemRelease(u64(h)) == 0  # still mapped: still held
    say(op="checkpoint", name="released while mapped")
    again = u64()
    assert LIB.cuMemRetainAllocationHandle(ctypes.byref(again), ctypes.c_void_p(va + 4096)) == 0
    assert LIB.cuMemUnmap(u64(va), size_t(size)) == 0  # still retained: still held
    say(op="checkpoint", name="unmapped while retained")
    assert LIB.cuMemRelease(u64(again.value)) == 0  # the last hold
    say(op="free", api="cuMemRelease", addr=h, pid=os.getpid())
    h2 = vmm_create(1 << 20, 0)  # mapped, unmapped, released: the plain order
    assert LIB.cuMemMap(u64(va), size_t(1 << 20), size_t(0), u64(h2), u64(0)) == 0
    assert LIB.cuMemUnmap(u64(va), size_t(1 << 20)) == 0
    assert LIB.cuMemRelease(u64(h2)) == 0
    say(op="free", api="cuMemRelease", addr=h2, pid=os.getpid())
    h3 = vmm_create(3 << 20, 0)  # mapped and kept
    assert LIB.cuMemMap(u64(va), size_t(3 << 20), size_t(0), u64(h3), u64(0)) == 0
    assert LIB.cuMemRelease(u64(h3)) == 0


REFUSED = []


def refused_frees():
    """A context with a sticky error: the driver refuses a free, a pinned free, a release and an unmap, and
    the blocks live on (the log says failed_free); each is booked at its call's entry, then undone."""
    va = 0x7D0000000000
    kept, pinned, handle = device_alloc(1 << 16), pinned_alloc(4096), vmm_create(1 << 20, 0)
    assert LIB.cuMemMap(u64(va), size_t(1 << 20), size_t(0), u64(handle), u64(0)) == 0
    LIB.gpuflame_standin_refuse(1)
    free("cuMemFree_v2", kept)
    free("cuMemFreeHost", pinned)
    free("cuMemRelease", handle)
    assert LIB.cuMemUnmap(u64(va), size_t(1 << 20)) != 0
    LIB.gpuflame_standin_refuse(0)
    REFUSED[:] = [va, handle]


def refused_vmm_dropped():
    """After refused_frees: the mapping and the handle dropped for real (the memory goes with the second)."""
    va, handle = REFUSED
    assert LIB.cuMemUnmap(u64(va), size_t(1 << 20)) == 0
    free("cuMemRelease", handle)


def pinned_alloc(n):
    p = u64(); rc = LIB.cuMemAllocHost_v2(ctypes.byref(p), size_t(n)); here = stack(sys._getframe())  # noqa: E702  # fmt: skip
    return check(rc, "cuMemAllocHost_v2", p.value, n, "host", here)


def pinned_hostalloc(n):
    p = u64(); rc = LIB.cuMemHostAlloc(ctypes.byref(p), size_t(n), 0); here = stack(sys._getframe())  # noqa: E702  # fmt: skip
    return check(rc, "cuMemHostAlloc", p.value, n, "host", here)


def free(api, addr):
    if api in ("cuMemFreeAsync", "cuMemFreeAsync_ptsz"):
        rc = getattr(LIB, api)(u64(addr), None)
    elif api in ("cuMemRelease", "cuMemFreeHost"):
        rc = getattr(LIB, api)(u64(addr) if api == "cuMemRelease" else ctypes.c_void_p(addr))
    else:
        rc = LIB.cuMemFree_v2(u64(addr))
    say(op="free" if rc == 0 else "failed_free", api=api, addr=addr, pid=os.getpid())


# -- workloads with distinct Python stacks -------------------------------------------------------


class Model:
    def __init__(self):
        self.weights = [self.layer(1 << 20) for _ in range(3)]

    def layer(self, n):
        return device_alloc(n)

    def activations(self, n):
        return device_alloc(n)  # the same native stack as layer(), another Python stack


class KVCache:
    def allocate(self):
        return [async_alloc(4096 * (i + 1)) for i in range(2)] + [pool_alloc(8192)]


def basic():
    model = Model()
    act = model.activations(5000)
    free("cuMemFree_v2", act)
    free("cuMemFree_v2", model.weights[0])
    kv = KVCache().allocate()
    free("cuMemFreeAsync", kv[0])
    managed_alloc(12345)
    pitch_alloc(1000, 3)
    handle = vmm_create(2 << 20, 1)
    vmm_create(1 << 20, 0)
    free("cuMemRelease", handle)
    pinned = pinned_alloc(65536)
    pinned_hostalloc(4096)
    free("cuMemFreeHost", pinned)
    device_alloc(0)  # fails: nothing allocated
    free("cuMemFree_v2", 0x1234)  # fails: never allocated


def per_thread_stream():
    """The _ptsz entry points (per-thread default stream), as a program built with that option calls them."""
    a = ptsz_alloc(3000)
    ptsz_pool_alloc(5000)
    free("cuMemFreeAsync_ptsz", a)


def worker(n):
    for _ in range(n):
        device_alloc(777)


def threads():
    ts = [threading.Thread(target=worker, args=(5,)) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def churn(n, size):
    """Allocate and free at once, *n* times: with the stand-in's reuse on, threads trade addresses."""
    for _ in range(n):
        p = u64()
        assert LIB.cuMemAlloc_v2(ctypes.byref(p), size_t(size)) == 0
        assert LIB.cuMemFree_v2(u64(p.value)) == 0


def race(pairs):
    """4 threads, *pairs* alloc/free pairs in all, addresses reused at once (no per-call log: it would serialise
    them); one record of the totals."""
    LIB.gpuflame_standin_reuse(1)
    ts = [threading.Thread(target=churn, args=(pairs // 4, 8192)) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    LIB.gpuflame_standin_reuse(0)
    say(op="raced", pairs=pairs // 4 * 4, size=8192, pid=os.getpid())


def crowd(n):
    """An old thread, then *n* newer idle ones (a server's pool; the interpreter lists the newest first): the
    main thread and the old one allocate while all are alive."""
    go, stop = threading.Event(), threading.Event()

    def old():
        go.wait()
        device_alloc(4321)

    first = threading.Thread(target=old)
    first.start()
    idle = [threading.Thread(target=stop.wait) for _ in range(n)]
    for t in idle:
        t.start()
    device_alloc(1234)
    go.set()
    first.join()
    stop.set()
    for t in idle:
        t.join()


CELL = "def {name}():\n    return device_alloc({size})\n\n\n{name}()\n"


def cells(n):
    """Notebook cells and generated functions: each run in a namespace of its own, dropped after, so its code
    objects are freed and the next cell's are likely made at their addresses."""
    for i in range(n):
        name = "cell" if i % 2 else f"generated_{i}"
        exec(compile(CELL.format(name=name, size=1000 + i), f"<cell {i}>", "exec"), {"device_alloc": device_alloc})


def deep(n):
    if n <= 1:
        return device_alloc(333)
    return deep(n - 1)


HELD = []
OPENED = []


def load_model(n):
    """The driver loaded, then *n* weights allocated at once (a framework loading a checkpoint right after its
    dlopen): 4 KiB to 520 KiB each, about 268 KiB on average."""
    global LIB
    LIB = ctypes.CDLL(sys.argv[1])
    LIB.cuInit(0)
    for i in range(n):
        device_alloc(4096 * (1 + i * 37 % 130))


def out_of_memory():
    device_alloc(1 << 50)  # fails (out of memory): nothing allocated
    device_alloc(4096)


def fork():
    pid = os.fork()
    if pid == 0:
        device_alloc(2222)
        OUT.flush()
        os._exit(0)
    os.waitpid(pid, 0)


def main():
    global LIB
    if LIB is not None:
        LIB.cuInit(0)
    say(op="ready", pid=os.getpid())
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "exit":
            break
        if cmd[0] == "load":
            LIB = ctypes.CDLL(sys.argv[1])
            LIB.cuInit(0)
        elif cmd[0] == "open":  # the driver file opened and held, not mapped: what the dynamic loader does first
            OPENED.append(os.open(sys.argv[1], os.O_RDONLY | os.O_CLOEXEC))
        elif cmd[0] == "model":
            load_model(int(cmd[1]))
        elif cmd[0] == "basic":
            basic()
        elif cmd[0] == "vmm":
            vmm_lifetimes()
        elif cmd[0] == "ptsz":
            per_thread_stream()
        elif cmd[0] == "threads":
            threads()
        elif cmd[0] == "race":
            race(int(cmd[1]))
        elif cmd[0] == "crowd":
            crowd(int(cmd[1]))
        elif cmd[0] == "cells":
            cells(int(cmd[1]))
        elif cmd[0] == "deep":
            deep(int(cmd[1]))
        elif cmd[0] == "guarded":
            if not run_guarded(deep, int(cmd[1]))[0]:
                say(op="unguarded")
        elif cmd[0] == "hold":
            HELD.extend(device_alloc(1000) for _ in range(3))
        elif cmd[0] == "release":
            for addr in HELD:
                free("cuMemFree_v2", addr)
            HELD.clear()
        elif cmd[0] == "fork":
            fork()
        elif cmd[0] == "refused":
            refused_frees()
        elif cmd[0] == "refused_vmm":
            refused_vmm_dropped()
        elif cmd[0] == "init":  # one driver call (through ctypes' one call site), allocating nothing
            LIB.cuInit(0)
        elif cmd[0] == "oom":
            out_of_memory()
        say(op="done", cmd=cmd[0])


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "now":  # started after the agent: allocate at once
        LIB.cuInit(0)
        Model()
        say(op="done", cmd="now")
    else:
        main()
