"""Backend ``torch``: tensor storages made by torch operations on any device, with the Python stack.

Works wherever torch runs (CPU, MPS, XPU, CUDA): a ``TorchDispatchMode``
sees every aten operation after autograd, so it sees what the user's Python
asked for, what autograd's backward computes, and factory calls. For each
operation it decides whether an output's storage is *new*:

- Ops whose schema says an output aliases an input (views such as ``view``,
  ``transpose``, ``expand``, ``detach``, slicing; in-place ops such as
  ``add_``, ``copy_``, ``zero_``) allocate nothing.
- Other outputs are new unless their storage is already known (``reshape``
  of a non-contiguous tensor is ``clone`` + ``_unsafe_view``, and the view
  shares the clone's storage) or, for ops whose names say they may alias
  without saying so in the schema (``_unsafe_view``, ``*alias*``), belongs
  to an input.
- ``resize_``, ``resize_as_`` and ``out=`` variants may grow a storage: its
  size is compared before and after; growth is a new allocation at this
  stack, and the old bytes are freed.
- ``torch.tensor(...)`` / ``as_tensor`` build the tensor below the dispatcher
  and hand it to ``lift_fresh``: its storage counts as new when torch owns it
  (``resizable()``; ``from_numpy`` memory is numpy's and is not counted).

A storage's size is ``untyped_storage().nbytes()``, one storage is one
object. Frees come from a weak reference on the storage's Python object,
which torch keeps alive exactly as long as the C++ storage (views, autograd's
saved tensors and ``.grad`` hold it, and so hold the bytes). Storages that
existed before ``start()`` are never counted, so touching an old tensor
(in-place ops, views) is not mistaken for allocating it.

Threads: dispatch modes are thread-local. The mode is entered in the thread
that calls ``start()`` and, through ``threading.setprofile``, in every
``threading.Thread`` started afterwards. Threads that were already running,
and threads started by C/C++ code outside ``threading``, are not seen
(autograd's own worker threads inherit the mode from the caller).

Blind spots (for the README): memory a kernel allocates and frees inside
one operation (workspaces, intermediate temporaries of fused or composite
C++ kernels) is invisible, so the true peak can be a little higher; storages
made without a dispatcher call (``torch.UntypedStorage(n)``, tensors
unpickled by ``torch.load`` into fresh storages, memory of C++ extensions
that bypass the dispatcher) are not seen, nor is a storage resized
directly (``untyped_storage().resize_(n)``, FSDP's flat parameters: it keeps
the size it was made with); wrapper tensor subclasses are
seen only as their outputs; ``torch.compile`` still compiles and runs
compiled code as usual, but what Inductor's generated code allocates (it
calls the allocator directly) is not seen; the caching allocator's
reserved-but-free memory is not tensors and is not shown (the
``torch-cuda`` backend shows it).

Overhead: a dispatch mode costs a trip through Python for every operation,
so tiny, fast operations slow down most (bench/bench_capture_torch.py;
bench/bench_dispatch_tiny.py measures it against memray and against a mode
that does nothing, torch's own share). Stacks cost O(1) per operation in the
common case: see :class:`Stacks`.

The package, one job a module: ``ledger.py`` (the books: live storages,
peak, totals per site), ``stacks.py`` (the interned tree of Python stacks),
``plans.py`` (what each operator can do to memory), ``recorder.py`` (the
recorder: sites, the run's peak tables, threads, the profile) and
``mode.py`` (the ``TorchDispatchMode`` subclass, the hot path). Importing
the package imports the standard library only; ``mode.py`` imports torch
and is imported when a recording starts.
"""

from gpuflame.capture.recorders.dispatch.ledger import Ledger
from gpuflame.capture.recorders.dispatch.recorder import OWN_THREAD_PREFIX, TorchTensorRecorder
from gpuflame.capture.recorders.dispatch.stacks import Stacks

__all__ = ["OWN_THREAD_PREFIX", "Ledger", "Stacks", "TorchTensorRecorder"]
