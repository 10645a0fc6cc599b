"""Phases marked without code changes in training frameworks: PyTorch Lightning and Accelerate.

Real frameworks on the CPU, tiny models. Each phase's bytes come from the
model and the optimizer themselves (``numel() * element_size()``), never
from the recorder: what the optimizer made in the training epoch is its
state, and the gradients are made in Accelerate's ``backward``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gpuflame.capture.books import auto_phases, phases  # noqa: E402
from gpuflame.formats import pprof  # noqa: E402
from gpuflame.model import Profile  # noqa: E402
from tests.helpers.torch_helpers import INUSE, PEAK, RECORDERS  # noqa: E402


def record(make: Callable[[], Any], fn: Callable[[], Any]) -> tuple[Profile, Any]:
    rec = make()
    rec.start()
    try:
        result = fn()
    finally:
        rec.stop()
        phases.switch(0)
    profile = rec.snapshot()
    assert not rec.errors
    return pprof.decode(pprof.encode(profile)), result


def by_phase_and_category(profile: Profile, col: int) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for s in profile.samples:
        key = (s.label("phase") or "", s.label("category") or "")
        out[key] = out.get(key, 0) + s.values[col]
    return {k: v for k, v in out.items() if v}


def state_bytes(opt: Any) -> tuple[int, int]:
    """(AdamW's exp_avg and exp_avg_sq bytes, its step tensors' bytes)."""
    moments = sum(s[k].numel() * s[k].element_size() for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq"))
    steps = sum(s["step"].numel() * s["step"].element_size() for s in opt.state.values())
    return moments, steps


@pytest.mark.slow
@pytest.mark.parametrize("recorder", RECORDERS)
def test_lightning_trainer_fit_epochs_validate_test_predict(recorder: str) -> None:
    pl = pytest.importorskip("lightning.pytorch")

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

        def training_step(self, batch: Any, _i: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch: Any, _i: int) -> None:
            x, y = batch
            torch.nn.functional.mse_loss(self.net(x), y)

        test_step = validation_step

        def predict_step(self, batch: Any, _i: int) -> Any:
            return self.net(batch[0])

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 16), torch.randn(32, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    options = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False}

    def run() -> tuple[Any, Any, list[Any]]:
        model = Tiny()
        trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, enable_model_summary=False, **options)
        trainer.fit(model, loader, loader)  # no change to the program: no gpuflame.phase anywhere
        trainer.validate(model, loader, verbose=False)
        trainer.test(model, loader, verbose=False)
        predictions = trainer.predict(model, loader)
        return model, trainer.optimizers[0], predictions

    profile, (model, opt, predictions) = record(RECORDERS[recorder], run)
    rows = {r.phase: r for r in profile.phases}
    assert {"fit", "train_epoch", "val_epoch", "validate", "test", "predict"} <= set(rows)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    moments, steps = state_bytes(opt)
    assert moments == 2 * params and steps > 0
    inuse = by_phase_and_category(profile, INUSE)
    # made in the training epoch (its first step) and live at the end: AdamW's state
    assert inuse[("train_epoch", "optimizer_state")] == moments + steps
    assert not [k for k in inuse if k[0] == "fit" and k[1] in ("optimizer_state", "gradient")]
    outputs = sum(p.untyped_storage().nbytes() for p in predictions)
    assert outputs == 32 * 4 and inuse.get(("predict", "activation"), 0) + inuse.get(("predict", "other"), 0) >= outputs
    peaks = by_phase_and_category(profile, PEAK)
    assert sum(v for (phase, _c), v in peaks.items() if phase in ("val_epoch", "train_epoch")) > 0
    assert rows["val_epoch"].peak > 0 and rows["test"].peak > 0


@pytest.mark.slow
@pytest.mark.parametrize("recorder", RECORDERS)
def test_accelerate_accumulate_and_backward(recorder: str) -> None:
    accelerate = pytest.importorskip("accelerate")

    def run() -> tuple[Any, Any]:
        torch.manual_seed(0)
        accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, opt = accelerator.prepare(model, opt)
        x = torch.randn(8, 16)
        for _ in range(2):
            with accelerator.accumulate(model):
                loss = model(x).pow(2).mean()
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
        return model, opt

    profile, (model, opt) = record(RECORDERS[recorder], run)
    rows = {r.phase: r for r in profile.phases}
    assert {"accumulate", "backward"} <= set(rows)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    peaks = by_phase_and_category(profile, PEAK)
    assert peaks[("backward", "gradient")] == params  # gradients are made in backward, inside the step
    moments, steps = state_bytes(opt)
    assert by_phase_and_category(profile, INUSE)[("accumulate", "optimizer_state")] == moments + steps


def test_a_nested_target_marks_only_inside_its_wrapper_s_phase() -> None:
    """Lightning's epoch loop marks inside ``fit`` (a wrapper's phase) and alone, never inside the program's phase."""
    import gpuflame

    calls: list[str] = []

    def epoch() -> None:
        calls.append(phases.name_of(phases.current()))

    def fit() -> None:
        calls.append(phases.name_of(phases.current()))
        nested()

    nested = auto_phases._wrapped(epoch, phases.intern("train_epoch"), frozenset({phases.intern("fit")}))
    outer = auto_phases._wrapped(fit, phases.intern("fit"))
    outer()
    nested()
    with gpuflame.phase("mine"):
        outer()
    assert calls == ["fit", "train_epoch", "train_epoch", "mine", "mine"]
    assert phases.current() == 0
