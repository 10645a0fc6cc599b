"""The object-graph walk for categories never breaks another thread of the profiled program.

CPython tracks the tuple that ``tuple(generator)`` is filling before it is
done, and resizes it at the end only if nothing else holds it; a list from
``gc.get_objects()`` that is still alive when that thread runs makes the
resize raise SystemError in the user's code (a loaded run of the demo under
Pyroscope push hit it in ``torch._dynamo``'s import). Here the walk is held
at the moment it first runs Python code of its own, while another thread
finishes such a tuple.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gpuflame.capture.books import categories  # noqa: E402


def test_a_tuple_built_in_another_thread_during_the_walk_is_never_broken(monkeypatch) -> None:
    started, proceed = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def slow_items():
        yield 1
        started.set()
        proceed.wait(10)  # the tuple is half built (10 slots, 1 filled) while the walk runs
        yield 2

    def build() -> None:
        try:
            outcome["tuple"] = tuple(slow_items())
        except SystemError as exc:  # what the user's program would see
            outcome["error"] = exc

    real_kind = categories._kind

    def kind_after_letting_the_builder_finish(t: type, kinds: Any) -> int:
        if not proceed.is_set():
            proceed.set()
            builder.join(10)  # the builder resizes its tuple now, while the walk is inside Python code
        return real_kind(t, kinds)

    monkeypatch.setattr(categories, "_kind", kind_after_letting_the_builder_finish)
    model = torch.nn.Linear(2, 2)
    builder = threading.Thread(target=build)
    builder.start()
    assert started.wait(10)
    roles = categories.graph_roles(lambda storage: storage.data_ptr())
    builder.join(10)
    assert outcome == {"tuple": (1, 2)}
    assert roles[model.weight.untyped_storage().data_ptr()] == categories.PARAMETER


def test_the_walk_finds_modules_optimizers_and_caches_by_their_exact_type() -> None:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3, 3)

    net = Net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    wanted, chosen = categories._objects_of((torch.nn.Module, torch.optim.Optimizer, ()))
    assert wanted[Net] == 0 and wanted[torch.nn.Linear] == 0 and wanted[torch.optim.SGD] == 1
    ids = {id(o) for o in chosen}
    assert {id(net), id(net.layer), id(optimizer)} <= ids
    assert all(type(o) in wanted for o in chosen)


def _instances_by_hand(wanted: dict[type, int]) -> set[int]:
    import gc

    return {id(o) for o in gc.get_objects() if type(o) in wanted}


@pytest.mark.parametrize("referrers_of_at_most", [64, 0], ids=["referrers-of-the-classes", "every-object"])
def test_the_walk_finds_every_instance_of_the_wanted_types_by_either_road(monkeypatch, referrers_of_at_most) -> None:
    monkeypatch.setattr(categories, "_REFERRERS_OF_AT_MOST", referrers_of_at_most)
    models = [torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()) for _ in range(3)]
    optimizer = torch.optim.Adam(models[0].parameters())
    wanted, chosen = categories._objects_of((torch.nn.Module, torch.optim.Optimizer, ()))
    assert len(chosen) == len({id(o) for o in chosen})  # each once
    assert {id(o) for o in chosen} == _instances_by_hand(wanted)
    assert {id(models[2][1]), id(optimizer)} <= {id(o) for o in chosen}


def test_instances_of_a_class_written_in_c_are_found_too(monkeypatch) -> None:
    # a C class's instances need not refer to it, so the collector's referrers would miss them
    import types

    marker = types.SimpleNamespace(note="a C type's instance")
    real_kind = categories._kind
    monkeypatch.setattr(categories, "_kind", lambda t, kinds: 0 if t is types.SimpleNamespace else real_kind(t, kinds))
    wanted, chosen = categories._objects_of((torch.nn.Module, (), ()))
    assert types.SimpleNamespace in wanted
    assert id(marker) in {id(o) for o in chosen}
    assert {id(o) for o in chosen} == _instances_by_hand(wanted)
