"""Backend ``torch-cuda``: PyTorch's caching-allocator history on CUDA devices.

PyTorch records every allocator action with its Python stack when
``torch.cuda.memory._record_memory_history`` is on; ``_snapshot()`` returns
the allocator's state and that trace. The conversion into a profile (peak by
replaying the trace, in use, allocated, cached free blocks) is the same one
``gpuflame convert`` uses on a saved snapshot, so a live run and a file read
give the same numbers.

A live process keeps taking snapshots (every ``--interval``, at exit, at an
OOM), and :class:`~gpuflame.capture.recorders.torch_cuda.history.SnapshotHistory` folds them
so that peak and allocated cover the whole run although PyTorch's ring
buffer holds only the last ``max_entries`` events.

Two things only a live process can add:

* ``<outside framework>``: what the device holds for this process beyond
  what PyTorch reserved (CUDA context, NCCL, cuBLAS workspaces), from NVML
  (``nvidia-ml-py``) when it is installed, so the in-use total matches what
  ``nvidia-smi`` shows for the process;
* the profile at the moment of an out-of-memory error, written from the
  allocator's OOM observer: the most useful file a user can get.

This backend needs a GPU and is tested in ``tests/gpu/``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpuflame.boundary.backends import TORCH_CUDA
from gpuflame.capture.base import Recorder, empty_profile
from gpuflame.capture.books import phases
from gpuflame.capture.recorders.categories import mark_categories
from gpuflame.capture.recorders.torch_cuda.history import SnapshotHistory
from gpuflame.formats.snapshot_phases import PHASES_KEY
from gpuflame.model import SYNTHETIC, Frame, Profile, categories, make_labels
from gpuflame.model import phases as phase_model
from gpuflame.symbols.names import OUTSIDE_FRAMEWORK

if TYPE_CHECKING:
    from gpuflame.capture.session import Session

# Trace entries kept by PyTorch's ring buffer: about 100 bytes each plus the
# stacks, shared. Enough for minutes of a training step; a comment in the
# profile says when it overflowed.
DEFAULT_MAX_ENTRIES = 200_000


def create(session: Session) -> TorchCudaRecorder:
    """The ``torch-cuda`` backend's recorder for *session* (its registry line names this module)."""
    return TorchCudaRecorder(on_oom=session.write, native=session.settings.native)


class TorchCudaRecorder(Recorder):
    """Caching-allocator history with Python stacks, snapshots on demand and at OOM."""

    marks_known_phases = True
    name = TORCH_CUDA
    backend = TORCH_CUDA

    def __init__(
        self,
        on_oom: Callable[[], object] | None = None,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        native: bool = False,
    ) -> None:
        super().__init__()
        self.on_oom = on_oom
        self.max_entries = max_entries
        self.native = native
        self.oom_events: list[str] = []
        self.history = SnapshotHistory(max_entries, native)
        self.phase_marks: list[list[Any]] = []  # [time_us, phase name]: replayed against the trace

    def _on_phase(self, phase_id: int, now_ns: int) -> None:
        self.phase_marks.append([now_ns // 1000, phases.name_of(phase_id)])

    def _start(self) -> None:
        import torch

        self._listen_to_phases()  # started inside a phase: it runs from here

        torch.cuda.memory._record_memory_history(
            enabled="all",
            context="all",
            stacks="all" if self.native else "python",
            max_entries=self.max_entries,
        )
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is not None:
            attach(self._on_oom)

    def _stop(self) -> None:
        import torch

        self._stop_listening()
        torch.cuda.memory._record_memory_history(enabled=None)

    def _snapshot(self) -> Profile:
        import torch

        if not torch.cuda.is_initialized():
            return empty_profile()
        snapshot = torch.cuda.memory._snapshot()
        mark_categories(snapshot)
        if self.phase_marks:
            snapshot[PHASES_KEY] = list(self.phase_marks)
        profile = self.history.add(snapshot)
        pid = str(os.getpid())
        profile.phases = [replace(r, pid=pid) for r in profile.phases]
        add_outside_framework(profile, outside_framework_bytes(torch))
        label_gpu_models(profile, device_names(torch))
        for note in self.oom_events:
            if note not in profile.comments:
                profile.comments.append(note)
        return profile

    def _on_oom(self, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        """Called by the allocator when an allocation fails: write the profile now."""
        try:
            self.oom_events.append(
                f"CUDA out of memory on cuda:{device}: asked for {alloc} bytes with "
                f"{device_alloc} allocated and {device_free} free on the device"
            )
            if self.on_oom is not None:
                self.on_oom()
        except BaseException as exc:  # noqa: BLE001 - the OOM error itself must reach the workload
            self.fail("could not write the profile at the out-of-memory error", "the OOM profile", exc, degrade=False)


def outside_framework_bytes(torch: Any) -> dict[int, int]:
    """Per device index: this process's device memory (NVML) minus PyTorch's reserved bytes."""
    try:
        import pynvml
    except ImportError:
        return {}
    out: dict[int, int] = {}
    try:
        pynvml.nvmlInit()
    except Exception:
        return {}
    try:
        pid = os.getpid()
        for index in range(torch.cuda.device_count()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(_physical_index(index))
            used = sum(
                p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == pid
            )
            reserved = torch.cuda.memory_reserved(index)
            if used > reserved:
                out[index] = used - reserved
    except Exception:
        return out
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out


def device_names(torch: Any) -> dict[str, str]:
    """``cuda:0`` -> ``NVIDIA H200``, for the ``gpu_model`` label Grafana can group by."""
    try:
        return {f"cuda:{i}": torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())}
    except Exception:
        return {}


def label_gpu_models(profile: Profile, names: dict[str, str]) -> None:
    """Add ``gpu_model`` to every sample of a named device (a label with few values)."""
    if not names:
        return
    for s in profile.samples:
        model = names.get(s.label("device") or "")
        if model and s.label("gpu_model") is None:
            s.labels = make_labels(dict(s.labels) | {"gpu_model": model})


def _physical_index(index: int) -> int:
    """NVML counts every GPU; CUDA_VISIBLE_DEVICES renumbers the ones torch sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    if index < len(parts) and parts[index].isdigit():
        return int(parts[index])
    return index


def add_outside_framework(profile: Profile, outside: dict[int, int]) -> None:
    """Add ``<outside framework>`` to the in-use and peak views of each device.

    The CUDA context and library workspaces are made once, early, and live as
    long as the process, so the same bytes stand in the peak as at the end.
    """
    if not outside:
        return
    frame = Frame(OUTSIDE_FRAMEWORK, kind=SYNTHETIC)
    names = profile.type_names()
    for index, size in sorted(outside.items()):
        values: dict[str, int] = {t: size for t in ("inuse_space", "peak_space") if t in names}
        if values:
            labels = {"device": f"cuda:{index}", "pid": os.getpid(), categories.LABEL: categories.OUTSIDE_FRAMEWORK}
            if profile.phases:  # every sample says its phase: memory made in none (the CUDA context, early)
                labels[phase_model.LABEL] = phase_model.NONE
            profile.add([frame], values, labels)
    profile.comments.append(
        "<outside framework> is device memory of this process that PyTorch did not reserve "
        "(CUDA context, NCCL, cuBLAS workspaces), from NVML; it is counted in the peak as at the end"
    )
