"""What kind of memory a block is: the ``category`` label of every sample.

The flame graph says *which function* holds memory; the category says *what
kind*: the weights, their gradients, the optimizer's state, the KV cache,
activations. Two sources, the first that knows wins:

1. **The object graph**, read when it is cheap to read: every profile
   (snapshot) walks the garbage collector's objects for ``nn.Module``
   parameters (``frozen_parameter`` when ``requires_grad=False``) and
   buffers, their ``.grad`` (a DTensor's by its local shard), ``torch.optim.Optimizer.state``
   and transformers ``Cache`` objects, and maps each tensor's storage to a
   category; every ``optimizer.step()`` (a global step pre- and post-hook,
   O(parameters)) does the same for that optimizer, and every parameter or
   buffer a module registers is a ``parameter`` from that moment on. A block the recorder
   holds at such a storage takes the category and keeps it as a *tag*, so a
   block live at the peak and freed since (a gradient dropped by
   ``zero_grad(set_to_none=True)``) is still classed right.
2. **The stack that allocated it**: a frame in transformers'
   ``cache_utils.py`` (or vLLM's KV-cache allocation) is ``kv_cache``, a
   ``torch.optim`` ``_init_group`` frame is ``optimizer_state``, an
   innermost frame in torch.distributed's communication code (DDP's bucket
   making, a collective, FSDP2's all-gather) ``comm_buffer``, a module's
   ``forward`` or a ``backward`` frame is ``activation``; anything else is
   ``other``.

Blind spots: a block freed before any snapshot, optimizer step or
registration hook saw it is classed by its stack alone (the gradient of a
parameter made before the recording started, in a loop without a
``torch.optim`` optimizer, freed before the profile is taken, is an
``activation``: it was made in backward); a storage shared by two roles
takes the first of parameter, gradient, optimizer state, KV cache, a
module's buffer (a DDP bucket whose views are the gradients is ``gradient``,
once; a compiled optimizer step's graph module keeps the state as buffers); tensors
held only by C++ (autograd's saved tensors) are activations by their stack.

This module runs inside the profiled process: standard library only, torch
and transformers only through ``sys.modules`` (never imported here).
"""

from __future__ import annotations

import gc
import itertools
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gpuflame.capture.books.site_row import ALLOC, COUNT, INUSE, JOINT, PEAK
from gpuflame.gcpause import gc_paused
from gpuflame.model.categories import (  # noqa: F401 - the vocabulary, re-exported for the recorders
    CATEGORIES,
    COMM_BUFFER,
    FROZEN_PARAMETER,
    GRADIENT,
    KV_CACHE,
    LABEL,
    OPTIMIZER_STATE,
    PARAMETER,
    stack_category,
)

# categories found in the object graph; a block's tag is its index here plus
# one (0: no tag), as the C++ hook stores it (precedence is graph_roles' order)
TAGGED = (PARAMETER, GRADIENT, OPTIMIZER_STATE, KV_CACHE, FROZEN_PARAMETER, COMM_BUFFER)
TAG_OF = {name: i + 1 for i, name in enumerate(TAGGED)}

StorageKey = Callable[[Any], int]  # a storage -> the key its recorder books it under

# An event history's site, in a recorder's log, is a key: its site and its block's tag, site << 3 | tag,
# so a block's allocation and free carry its category (the C++ hook's HistoryBooks keys alike)
HISTORY_TAG_BITS = 3
_TAG_MASK = (1 << HISTORY_TAG_BITS) - 1


def history_key(site: int, tag: int) -> int:
    """The history key of a block of *site* with category *tag* (0: none yet)."""
    return (site << HISTORY_TAG_BITS) | tag


def history_site(key: int) -> int:
    """The recorder's site of a history key."""
    return key >> HISTORY_TAG_BITS


def history_category(key: int, default: Callable[[int], str]) -> str:
    """The category of a history key: its tag's, else its site's stack's (*default*)."""
    tag = key & _TAG_MASK
    return TAGGED[tag - 1] if 0 < tag <= len(TAGGED) else default(key >> HISTORY_TAG_BITS)


# -----------------------------------------------------------------------------
# the object graph
# -----------------------------------------------------------------------------


_graph_walk = True  # off: blocks are classed by their stacks alone (set_graph_walk)


def set_graph_walk(on: bool) -> None:
    """Whether a profile walks the object graph for categories.

    The walk costs 45-95 ms per profile in a process of a few hundred
    thousand objects: nothing for one run, too much for a profile per test
    (the pytest plugin turns it off unless ``--gpuflame-categories``).
    Without it, blocks are classed by the stacks that allocated them.
    """
    global _graph_walk
    _graph_walk = on


_frozen_found: list[weakref.ref[Any]] | None = None  # the wanted objects a host's freeze hid (freeze_for_walks)


def freeze_for_walks() -> bool:
    """For a host that takes a profile per test: each later walk reads only the objects made since now.

    The collector's objects are frozen (``gc.freeze``: ``gc.get_objects``
    lists them no more, and cyclic collections skip them), after one full
    walk that keeps the modules, optimizers and KV caches among them, held
    weakly, so a model made at import is still found. A walk of a test
    suite's process (torch, pytest, the collected tests: a few hundred
    thousand objects) costs tens of ms; of what a test made, little.
    False, and nothing frozen, when one of them cannot be held weakly.
    """
    global _frozen_found
    torch = sys.modules.get("torch")
    gc.collect()  # garbage now would otherwise wait, frozen, for thaw_walks()
    if torch is None:
        found: list[Any] = []
    else:
        _wanted, found = _objects_of((torch.nn.Module, torch.optim.Optimizer, _cache_types()))
    try:
        refs = [weakref.ref(obj) for obj in found]
    except TypeError:
        return False
    _frozen_found = refs
    gc.freeze()
    return True


def thaw_walks() -> None:
    """Undo :func:`freeze_for_walks`: the frozen objects go back to the collector, walks read all again."""
    global _frozen_found
    if _frozen_found is not None:
        _frozen_found = None
        gc.unfreeze()


def graph_roles(key: StorageKey) -> dict[int, str]:
    """Every storage the object graph gives a role, by *key*: one walk of the collector's objects."""
    torch = sys.modules.get("torch")
    if torch is None or not _graph_walk:
        return {}
    module_type = torch.nn.Module
    optimizer_type = torch.optim.Optimizer
    kinds = (module_type, optimizer_type, _cache_types())
    wanted, chosen = _objects_of(kinds)
    if _frozen_found is not None:  # a host froze what there was: those objects are not in the collector's lists
        older = [obj for ref in _frozen_found if (obj := ref()) is not None]
        wanted.update({t: i for t in set(map(type, older)) if (i := _kind(t, kinds)) >= 0})
        chosen += [obj for obj in older if type(obj) in wanted]
    found: list[list[Any]] = [[], [], []]
    for obj in chosen:
        found[wanted[type(obj)]].append(obj)
    modules, optimizers, caches = found
    roles: dict[int, str] = {}
    # lowest precedence first: a later role overwrites an earlier one. A buffer is the weakest: a
    # compiled optimizer step's graph module keeps the optimizer's state as its buffers
    _assign_parameters(roles, key, [b for m in modules for b in _values(m, "_buffers")])
    _assign(roles, key, KV_CACHE, (t for c in caches for t in _tensors_in(vars(c), 4)))
    for opt in optimizers:
        _assign(roles, key, OPTIMIZER_STATE, _state_tensors(opt))
    # a module still in its __init__ (a profile taken from another thread) may lack the dicts yet
    params = [p for m in modules for p in _values(m, "_parameters")]
    _assign(roles, key, GRADIENT, (p.grad for p in params))
    _assign_parameters(roles, key, params)
    return roles


def _assign_parameters(roles: dict[int, str], key: StorageKey, tensors: list[Any]) -> None:
    """Trainable parameters and buffers are ``parameter``; parameters with requires_grad=False ``frozen_parameter``.

    A buffer never requires grad, yet is part of the model as it trains
    (running means, rotary tables): it stays ``parameter``, as it always was.
    """
    torch = sys.modules["torch"]
    frozen = [t for t in tensors if isinstance(t, torch.nn.Parameter) and not t.requires_grad]
    _assign(roles, key, FROZEN_PARAMETER, frozen)
    _assign(
        roles, key, PARAMETER, [t for t in tensors if not (isinstance(t, torch.nn.Parameter) and not t.requires_grad)]
    )


def _objects_of(kinds: tuple[type | tuple[type, ...], ...]) -> tuple[dict[type, int], list[Any]]:
    """The objects of the wanted *kinds*, by kind index of their type: two passes in C, the second short.

    The first finds the types present among the collector's objects (by
    ``type()``, as isinstance() reads ``__class__``, which some lazy module
    objects warn on); the second asks the collector for the referrers of
    the few wanted classes, as every instance of a class defined in Python
    refers to its class: the instances and a few class tuples, where taking
    every object again cost three times as long. Each list the collector
    hands out must never reach Python code: another thread may be inside
    ``tuple(generator)``, whose tuple the collector already tracks, and if
    that thread runs while the list holds the tuple, CPython's resize of it
    fails with SystemError in the profiled program (CPython issue 39117; a
    loaded run of the demo under Pyroscope push hit it). So each is taken
    inside a chain of C iterators that one C call consumes and frees before
    any Python code (a finalizer of a collection included: the collector is
    paused) lets another thread run.
    """
    with gc_paused():
        present = set(map(type, _tracked()))
    wanted = {t: i for t in present if (i := _kind(t, kinds)) >= 0}
    if not wanted:
        return wanted, []
    # a class written in C need not be referred to by its instances, and the collector compares each
    # reference with every class asked about: past a few dozen, picking from every object is quicker
    everything = len(wanted) > _REFERRERS_OF_AT_MOST or not all(t.__flags__ & _HEAPTYPE for t in wanted)
    source = (
        _tracked()
        if everything
        else itertools.chain.from_iterable(itertools.starmap(gc.get_referrers, (tuple(wanted),)))
    )
    objects, types = itertools.tee(itertools.chain(source, _PADDING))
    with gc_paused():
        chosen = list(itertools.compress(objects, map(wanted.__contains__, map(type, types))))
    return wanted, chosen


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made at run time (every class statement), whose instances refer to it
_REFERRERS_OF_AT_MOST = 64  # classes (a model has a few dozen module classes): 0.6x the full pass at 64, 0.4x at 20


def _tracked() -> Iterator[Any]:
    """The collector's objects, its list taken only when the iterator is first read and freed at its end."""
    return itertools.chain.from_iterable(map(gc.get_objects, (None,)))


# more than a tee keeps in one block (57): the block left when both copies end holds only these
_PADDING = (None,) * 256


def _values(module: Any, name: str) -> list[Any]:
    found = vars(module).get(name)
    return [v for v in list(found.values()) if v is not None] if isinstance(found, dict) else []


def _kind(t: type, kinds: tuple[type | tuple[type, ...], ...]) -> int:
    """0: a module type, 1: an optimizer type, 2: a KV-cache type, -1: none of them."""
    for i, base in enumerate(kinds):
        if base and issubclass(t, base):
            return i
    return -1


def optimizer_roles(optimizer: Any, key: StorageKey) -> dict[int, str]:
    """One optimizer's parameters, their gradients and its state: cheap enough for every step."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    roles: dict[int, str] = {}
    _assign(roles, key, OPTIMIZER_STATE, _state_tensors(optimizer))
    _assign(roles, key, GRADIENT, (p.grad for p in params))
    _assign_parameters(roles, key, params)
    return roles


def _assign(roles: dict[int, str], key: StorageKey, role: str, tensors: Iterable[Any]) -> None:
    for t in tensors:
        if t is None:
            continue
        # a DTensor (FSDP2's sharded parameters and gradients) holds its rank's shard as _local_tensor;
        # its own storage is a wrapper's with no data
        t = getattr(t, "_local_tensor", t)
        try:
            if t.device.type == "meta":
                continue
            roles[key(t.untyped_storage())] = role
        except (RuntimeError, NotImplementedError, AttributeError, TypeError):
            continue  # sparse, nested or subclass tensors without a plain storage


def _state_tensors(optimizer: Any) -> Iterator[Any]:
    for state in list(optimizer.state.values()):
        if isinstance(state, dict):
            yield from _tensors_in(state, 1)


def _tensors_in(value: Any, depth: int) -> Iterator[Any]:
    """Tensors in *value* and in the lists, tuples, dicts and plain objects in it, *depth* levels down."""
    torch = sys.modules["torch"]
    if isinstance(value, torch.Tensor):
        yield value
    elif depth <= 0:
        return
    elif isinstance(value, dict):
        for v in list(value.values()):
            yield from _tensors_in(v, depth - 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors_in(v, depth - 1)
    elif hasattr(value, "__dict__") and type(value).__module__.startswith("transformers."):
        yield from _tensors_in(vars(value), depth - 1)


def _cache_types() -> tuple[type, ...]:
    """transformers' KV-cache classes, when transformers is imported."""
    cache_utils = sys.modules.get("transformers.cache_utils")
    names = ("Cache", "CacheLayerMixin")
    return tuple(t for t in (getattr(cache_utils, n, None) for n in names) if isinstance(t, type))


# -----------------------------------------------------------------------------
# splitting a recorder's rows by category
# -----------------------------------------------------------------------------


class Block:
    """One live block as a recorder holds it: key, size, site, live at the peak, tag, live at the run's joint peak."""

    __slots__ = ("key", "nbytes", "site", "at_peak", "tag", "at_joint")

    def __init__(self, key: int, nbytes: int, site: int, at_peak: bool, tag: int, at_joint: bool = False) -> None:
        self.key, self.nbytes, self.site, self.at_peak, self.tag = key, nbytes, site, at_peak, tag
        self.at_joint = at_joint


def split_rows(
    rows: dict[int, list[int]],
    default: Callable[[int], str],
    blocks: Iterable[Block],
    gone_tagged: Iterable[tuple[int, int, int, int]],
    roles: dict[int, str],
    joint_gone_tagged: Iterable[tuple[int, int, int, int]] = (),
) -> dict[tuple[int, str], list[int]]:
    """Per (site, category): its row (capture/books/site_row.py), split from each site's *rows*.

    A site's row starts under its stack's category (*default*); each live
    block the graph (*roles*) or a tag gives another category moves there,
    in use, at the peak when it was live then, and at the run's joint peak
    when it was live then (rows of a process in ``gpuflame run`` carry what
    it held at that moment, capture/books/joint_peak.py: each block keeps
    the category this process gives it, whichever moment that was);
    *gone_tagged* and *joint_gone_tagged* (site, tag, bytes, count) move the
    tagged blocks freed since the peak and since the joint peak. Allocated
    bytes follow only when every allocation of the site is live in one
    other category.
    """
    out: dict[tuple[int, str], list[int]] = {(site, default(site)): list(row) for site, row in rows.items()}

    def move(site: int, role: str, col: int, nbytes: int, count: int) -> None:
        base = default(site)
        if role == base or (site, base) not in out:
            return
        src = out[(site, base)]
        if len(src) <= col or src[col + COUNT] < count:  # not in the rows (made or freed by another thread meanwhile)
            return
        dst = out.setdefault((site, role), [0] * len(src))
        src[col] -= nbytes
        src[col + COUNT] -= count
        dst[col] += nbytes
        dst[col + COUNT] += count

    for b in blocks:
        role = roles.get(b.key) or (TAGGED[b.tag - 1] if 0 < b.tag <= len(TAGGED) else None)
        if role is None:
            continue
        move(b.site, role, INUSE, b.nbytes, 1)
        if b.at_peak:
            move(b.site, role, PEAK, b.nbytes, 1)
        if b.at_joint:
            move(b.site, role, JOINT, b.nbytes, 1)
    for col, gone in ((PEAK, gone_tagged), (JOINT, joint_gone_tagged)):
        for site, tag, nbytes, count in gone:
            if 0 < tag <= len(TAGGED):
                move(site, TAGGED[tag - 1], col, nbytes, count)
    _follow_alloc(out, default)
    return {k: v for k, v in out.items() if any(v)}


def _follow_alloc(out: dict[tuple[int, str], list[int]], default: Callable[[int], str]) -> None:
    """A site whose every allocation is live in one other category: its allocated bytes go there too.

    Otherwise allocated bytes stay under the stack's category: which role a
    block freed long ago had is not known.
    """
    for (site, _role), row in list(out.items()):
        base = out.get((site, default(site)))
        if base is None or row is base or base[INUSE + COUNT] or row[INUSE + COUNT] != base[ALLOC + COUNT]:
            continue
        row[ALLOC], row[ALLOC + COUNT] = base[ALLOC], base[ALLOC + COUNT]
        base[ALLOC] = base[ALLOC + COUNT] = 0


# -----------------------------------------------------------------------------
# tagging at every optimizer step and every weight a module registers
# -----------------------------------------------------------------------------


class EventTagger:
    """Global torch hooks that hand roles to *tag* as they become known (never raising into the program).

    Every ``optimizer.step()`` (pre and post) tags that optimizer's
    parameters, gradients and state; every parameter or buffer a module
    registers is tagged ``parameter`` then and there, so a model freed before
    the profile is written (the demo's, at exit) keeps its weights classed
    whoever allocated them (``LlamaRMSNorm``'s ``torch.ones``, not only
    ``torch.nn``'s own modules), and such a parameter's gradient is tagged
    ``gradient`` when autograd accumulates it, with or without an optimizer
    (a post-accumulate-grad hook, removed at stop). One Python call per
    registration and per parameter per backward pass.
    """

    def __init__(self, key: StorageKey, tag: Callable[[dict[int, str]], None]) -> None:
        self.key = key
        self.tag = tag
        self.handles: list[Any] = []
        self.failed = 0

    def install(self) -> None:
        optimizer = sys.modules.get("torch.optim.optimizer")
        if optimizer is not None and hasattr(optimizer, "register_optimizer_step_pre_hook"):
            self.handles += [
                optimizer.register_optimizer_step_pre_hook(self._on_step),
                optimizer.register_optimizer_step_post_hook(self._on_step),
            ]
        module = sys.modules.get("torch.nn.modules.module")
        if module is not None and hasattr(module, "register_module_parameter_registration_hook"):
            self.handles += [
                module.register_module_parameter_registration_hook(self._on_parameter),
                module.register_module_buffer_registration_hook(self._on_weight),
            ]

    def remove(self) -> None:
        handles, self.handles = self.handles, []
        for h in handles:
            h.remove()

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            self.tag(optimizer_roles(optimizer, self.key))
        except Exception:  # noqa: BLE001 - a failed tag loses a category, never the step
            self.failed += 1

    def _on_parameter(self, module: Any, name: str, value: Any) -> None:
        """A parameter is a weight now, and its gradient a gradient once autograd accumulates it."""
        self._on_weight(module, name, value)
        if getattr(value, "requires_grad", False) and hasattr(value, "register_post_accumulate_grad_hook"):
            try:
                self.handles.append(value.register_post_accumulate_grad_hook(self._on_grad))
            except Exception:  # noqa: BLE001 - a failed hook loses a category, never the module
                self.failed += 1

    def _on_grad(self, parameter: Any) -> None:
        try:
            roles: dict[int, str] = {}
            _assign(roles, self.key, GRADIENT, (parameter.grad,))
            if roles:
                self.tag(roles)
        except Exception:  # noqa: BLE001 - a failed tag loses a category, never the backward pass
            self.failed += 1

    def _on_weight(self, module: Any, name: str, value: Any) -> None:
        if value is None:
            return
        try:
            roles: dict[int, str] = {}
            _assign_parameters(roles, self.key, [value])
            if roles:
                self.tag(roles)
        except Exception:  # noqa: BLE001 - a failed tag loses a category, never the module
            self.failed += 1
