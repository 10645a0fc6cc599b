"""Categories at any moment: the event history (``--at``, ``--between``) gives each block its category.

A block's category is decided when a profile, an optimizer step or a
registration hook classes it, maybe long after it was allocated; the history
must give its allocation and its free that category, so a moment says what
the peak and the end say. Expected bytes come from the model and the
optimizer (``numel() * element_size()``), never from the recorder.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gpuflame.capture.books import categories  # noqa: E402
from gpuflame.capture.recorders.allocator.native import NativeUnavailable, load_cpu_hook  # noqa: E402
from gpuflame.model import Profile, moment  # noqa: E402
from gpuflame.model import history as event_history  # noqa: E402
from tests.helpers.torch_helpers import RECORDERS, record  # noqa: E402

try:
    load_cpu_hook()  # built (a compiler's subprocess) at collection, not inside a test
except NativeUnavailable as exc:  # no compiler on this machine
    pytest.skip(f"the CPU allocator hook cannot be built here: {exc}", allow_module_level=True)


def by_category(profile: Profile, type_name: str) -> dict[str, int]:
    col = profile.type_index(type_name)
    out: dict[str, int] = {}
    for s in profile.samples:
        name = s.label(categories.LABEL)
        assert name in categories.CATEGORIES, s
        out[name] = out.get(name, 0) + s.values[col]
    return {k: v for k, v in out.items() if v}


def seconds(profile: Profile, t_ns: int) -> float:
    """*t_ns* (epoch ns) as seconds on the strip, the form ``--at`` takes."""
    return (t_ns - moment.origin(profile)) / 1e9


@pytest.mark.parametrize("recorder", RECORDERS)
def test_training_steps_every_moment_gives_parameters_gradients_and_state(recorder: str) -> None:
    marks: list[int] = []

    def train() -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(3):
            opt.zero_grad(set_to_none=True)  # each step's gradients are new blocks, the last ones freed
            model(torch.randn(8, 64)).sum().backward()
            opt.step()
            marks.append(time.time_ns())
        opt.zero_grad(set_to_none=True)  # freed before the profile: classed by the step's tags alone
        return model, opt

    profile, (model, opt), _ = record(RECORDERS[recorder], train)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = 2 * params + sum(s["step"].numel() * s["step"].element_size() for s in opt.state.values())
    for t in marks:
        got = by_category(moment.at(profile, seconds(profile, t)), "inuse_space")
        assert got["parameter"] == params, got
        assert got["gradient"] == params, got
        assert got["optimizer_state"] == state, got
    window = by_category(moment.between(profile, 0.0, seconds(profile, marks[-1])), "alloc_space")
    assert window["parameter"] == params, window
    assert window["gradient"] == 3 * params, window  # three backward passes, each its own gradients
    assert window["optimizer_state"] == state, window
    assert profile.history is not None
    end = moment.at(profile, seconds(profile, profile.history.tracks[0].end))
    assert by_category(end, "inuse_space") == by_category(profile, "inuse_space")  # the end: as the samples say


@pytest.mark.parametrize("recorder", RECORDERS)
def test_a_block_classed_after_its_allocation_was_folded_moves_in_the_base(
    recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The history keeps 16 events: the weight's allocation is folded long before it becomes a parameter."""
    monkeypatch.setattr(event_history, "MAX_EVENTS", 16)
    marks: list[int] = []

    def work() -> Any:
        weight = torch.empty(1000)  # nothing knows yet what it is: classed by its stack
        for _ in range(5000):  # the weight's allocation is folded into the history's base (and the
            torch.empty(8)  # dispatch recorder's queue, 4096 events, replayed into its log before the hook)
        module = torch.nn.Module()
        module.w = torch.nn.Parameter(weight)  # the registration hook classes its storage: parameter
        marks.append(time.time_ns())
        return module

    profile, module, _ = record(RECORDERS[recorder], work)
    assert profile.history is not None and profile.history.tracks[0].folded > 0
    weight = module.w.numel() * module.w.element_size()
    got = by_category(moment.at(profile, seconds(profile, marks[0])), "inuse_space")
    assert got == {"parameter": weight}, got  # moved out of its stack's category, nothing left negative there
    assert by_category(profile, "inuse_space") == {"parameter": weight}
