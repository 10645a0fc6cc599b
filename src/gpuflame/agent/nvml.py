"""GPU memory per process as NVML (the driver's management library) counts it: what the probes did not see.

Blocks a process allocated before the agent started never pass its probes;
NVML knows every process's GPU memory all the same. The difference between
its figure and what the agent has in use for the process is shown as one
frame, ``<allocated before the agent started>`` (NVML also counts the
driver's own memory for the process, its CUDA context, which no allocation
call made: that is under the frame too, and the profile says so).

Loaded through ctypes from ``libnvidia-ml.so.1`` where the node has it; the
prototypes are NVML's public ones (``nvmlInit_v2``, ``nvmlDeviceGetCount_v2``,
``nvmlDeviceGetHandleByIndex_v2``, ``nvmlDeviceGetComputeRunningProcesses_v3``,
``_v2`` on older drivers). Without it the agent says so and counts frees of
blocks it never saw instead.
"""

from __future__ import annotations

import ctypes

LIBRARY = "libnvidia-ml.so.1"
SUCCESS = 0
ERROR_INSUFFICIENT_SIZE = 7
VALUE_NOT_AVAILABLE = (1 << 64) - 1  # usedGpuMemory when the driver cannot tell (e.g. under WDDM)
MAX_DEVICES = 64
MAX_PROCESSES = 4096  # per device, read at most
QUERIES = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2")


class ProcessInfo(ctypes.Structure):
    """``nvmlProcessInfo_t`` (the v2/v3 queries): the process and its GPU memory on one device."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class Nvml:
    """An initialised NVML, or why there is none (:attr:`missing`)."""

    def __init__(self, path: str = LIBRARY) -> None:
        self.missing = ""
        self._lib: ctypes.CDLL | None = None
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            self.missing = f"no NVML here ({path} cannot be loaded)"
            return
        query = next((getattr(lib, q) for q in QUERIES if hasattr(lib, q)), None)
        if query is None or not hasattr(lib, "nvmlInit_v2"):
            self.missing = f"{path} has no per-process memory query"
            return
        rc = lib.nvmlInit_v2()
        if rc != SUCCESS:
            self.missing = f"NVML did not start (nvmlInit_v2 returned {rc})"
            return
        self._query = query  # set with _lib: used only while it is (ready)
        self._lib = lib

    @property
    def ready(self) -> bool:
        return self._lib is not None

    def used(self) -> dict[int, int]:
        """GPU memory in bytes per host pid, summed over devices; {} where NVML cannot say."""
        lib = self._lib
        if lib is None:
            return {}
        count = ctypes.c_uint(0)
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != SUCCESS:
            return {}
        out: dict[int, int] = {}
        for index in range(min(count.value, MAX_DEVICES)):
            device = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(device)) != SUCCESS:
                continue
            for info in self._processes(device):
                if info.usedGpuMemory != VALUE_NOT_AVAILABLE:
                    out[info.pid] = out.get(info.pid, 0) + info.usedGpuMemory
        return out

    def _processes(self, device: ctypes.c_void_p) -> list[ProcessInfo]:
        """One device's compute processes (asked again, larger, while NVML says the array is too small)."""
        size = 64
        while True:
            n = ctypes.c_uint(size)
            infos = (ProcessInfo * size)()
            rc = self._query(device, ctypes.byref(n), infos)
            if rc == SUCCESS:
                return list(infos[: min(n.value, size)])
            if rc != ERROR_INSUFFICIENT_SIZE or size >= MAX_PROCESSES:
                return []
            size = min(MAX_PROCESSES, max(size * 2, n.value))

    def close(self) -> None:
        if self._lib is not None:
            self._lib.nvmlShutdown()
            self._lib = None
