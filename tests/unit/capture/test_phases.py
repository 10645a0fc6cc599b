"""Phases (``gpuflame.phase``): the ``phase`` label and the exact per-phase table, on both torch recorders.

Expectations come from torch and the model themselves (``nbytes()``,
``numel() * element_size()``), never from the recorder; the hook's phase
peaks are also checked against its own timeline, a separate book.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import gpuflame  # noqa: E402
from gpuflame.capture.books import auto_phases, phases  # noqa: E402
from gpuflame.formats import pprof  # noqa: E402
from gpuflame.model import (  # noqa: E402
    Frame,
    Profile,
    merge,
    moment,  # noqa: E402
)
from gpuflame.model import phases as phase_model  # noqa: E402
from gpuflame.model.phases import PhaseStat  # noqa: E402
from tests.helpers.run_cli import gpuflame_run  # noqa: E402
from tests.helpers.torch_helpers import INUSE, PEAK, RECORDERS, tiny_llama_config  # noqa: E402


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
    return pprof.decode(pprof.encode(profile)), result  # the table survives the file


def table(profile: Profile) -> dict[str, PhaseStat]:
    return {r.phase: r for r in profile.phases}


def by_phase(profile: Profile, col: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in profile.samples:
        name = s.label(phase_model.LABEL)
        assert name is not None, s  # every sample says its phase
        out[name] = out.get(name, 0) + s.values[col]
    return {k: v for k, v in out.items() if v}


def nbytes(*tensors: Any) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


@pytest.mark.parametrize("recorder", RECORDERS)
def test_tensors_exact_per_phase(recorder: str) -> None:
    def run() -> list[Any]:
        a = torch.empty(1000, dtype=torch.uint8)
        with gpuflame.phase("load"):
            b = torch.empty(5000, dtype=torch.uint8)
            c = torch.empty(7000, dtype=torch.uint8)
            del c
        gpuflame.phase("train")  # a plain call: runs until the next mark
        d = torch.empty(100, dtype=torch.uint8)
        del b
        e = torch.empty(3000, dtype=torch.uint8)
        with gpuflame.phase("eval"):
            with gpuflame.phase("inner"):
                f = torch.empty(200, dtype=torch.uint8)
            g = torch.empty(40, dtype=torch.uint8)  # the outer phase again
        h = torch.empty(8, dtype=torch.uint8)  # train again, after the with block
        return [a, d, e, f, g, h]

    profile, _ = record(RECORDERS[recorder], run)
    rows = table(profile)
    assert list(rows) == ["<none>", "load", "train", "eval", "inner"]  # in the order they began
    assert (rows["load"].peak, rows["load"].inuse_end) == (13000, 6000)
    assert rows["train"].peak == 1000 + 5000 + 100  # b freed before e: 4100 + 3000 never exceeds it
    assert rows["train"].inuse_end == 1000 + 100 + 3000 + 200 + 40 + 8  # train ran last
    assert (rows["eval"].peak, rows["eval"].inuse_end) == (4340, 4340)
    assert (rows["inner"].peak, rows["inner"].inuse_end) == (4300, 4300)
    # unmarked again between the load block and the train call, holding a and b
    assert rows["<none>"].peak == 6000 and rows["<none>"].inuse_end == 6000
    assert rows["load"].top == "test_tensors_exact_per_phase > run" and rows["load"].top_bytes == 13000
    assert by_phase(profile, INUSE) == {"<none>": 1000, "train": 3108, "inner": 200, "eval": 40}
    assert by_phase(profile, PEAK) == {"<none>": 1000, "load": 12000}  # the run's peak is in load
    assert all(r.start <= r.end for r in rows.values())
    assert rows["load"].start < rows["train"].start < rows["eval"].start <= rows["inner"].start


@pytest.mark.slow
@pytest.mark.parametrize("recorder", RECORDERS)
def test_llama_load_train_generate_exact_per_phase(recorder: str) -> None:
    cfg = tiny_llama_config()

    def run() -> Any:
        torch.manual_seed(0)
        with gpuflame.phase("load_model"):
            model = transformers.LlamaForCausalLM(cfg)
        with gpuflame.phase("train"):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            ids = torch.randint(0, 128, (2, 16))
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                model(input_ids=ids, labels=ids).loss.backward()
                opt.step()
            opt.zero_grad(set_to_none=True)
        with gpuflame.phase("generate"), torch.no_grad():
            cache = transformers.StaticCache(config=cfg, max_cache_len=64)
            prompt = torch.randint(0, 128, (1, 8))
            out = model.generate(prompt, cache=cache, max_new_tokens=6, do_sample=False)
        return model, opt, ids, cache, prompt, out

    profile, (model, opt, ids, cache, prompt, out) = record(RECORDERS[recorder], run)
    rows = table(profile)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    state = sum(nbytes(*s.values()) for s in opt.state.values())
    assert state == 2 * params + 4 * len(list(model.parameters()))
    cache_bytes = nbytes(*{t.untyped_storage().data_ptr(): t for t in _cache_tensors(cache)}.values())
    assert list(rows)[-3:] == ["load_model", "train", "generate"]
    # load: the weights and buffers, nothing else stays
    assert rows["load_model"].inuse_end == params + buffers
    assert by_phase(profile, INUSE)["load_model"] == params + buffers
    # train: at its peak (the first step, after backward) weights, gradients and the state were live at once
    assert rows["train"].peak >= params + buffers + params + state
    assert rows["train"].peak == sum(s.values[PEAK] for s in profile.samples)  # the run's peak is train's
    assert rows["train"].inuse_end == params + buffers + state + nbytes(ids)
    assert by_phase(profile, INUSE)["train"] == state + nbytes(ids)
    # generate: the static cache, the prompt and the output are what it leaves
    left = cache_bytes + nbytes(prompt, out)
    assert rows["generate"].inuse_end == rows["train"].inuse_end + left
    assert by_phase(profile, INUSE)["generate"] == left
    assert rows["generate"].peak > rows["generate"].inuse_end  # activations came and went
    # the event history, a separate book, had exactly that much live at each phase's peak moment, and the
    # strip (bucket maxima: a bucket may straddle a phase's end) never shows more within the phase
    if recorder == "allocator":  # the hook stamps each phase's peak moment
        [track] = profile.history.tracks
        points = next(iter(profile.timeline.series.values()))
        for r in (rows["load_model"], rows["train"], rows["generate"]):  # each one stretch
            assert r.start <= r.peak_time <= r.end
            assert sum(b for b, _ in track.live_at(r.peak_time).values()) == r.peak, r.phase
            assert max(b for t, b in points if r.start <= t <= r.end) <= r.peak, r.phase


def _cache_tensors(cache: Any) -> list[Any]:
    from gpuflame.capture.books import categories

    return list(categories._tensors_in(vars(cache), 4))


@pytest.mark.parametrize("recorder", RECORDERS)
def test_no_phase_no_label_no_table(recorder: str) -> None:
    profile, _ = record(RECORDERS[recorder], lambda: torch.empty(64, dtype=torch.uint8))
    assert profile.phases == []
    assert all(s.label(phase_model.LABEL) is None for s in profile.samples)


@pytest.mark.parametrize("recorder", RECORDERS)
def test_started_inside_a_phase(recorder: str) -> None:
    with gpuflame.phase("serve"):
        profile, _ = record(RECORDERS[recorder], lambda: torch.empty(64, dtype=torch.uint8))
    assert [r.phase for r in profile.phases if r.peak] == ["serve"]
    assert by_phase(profile, INUSE) == {"serve": 64}


def test_phase_without_a_recording_does_nothing() -> None:
    told: list[int] = []
    before = phases.current()
    with gpuflame.phase("alone") as p:
        assert p.name == "alone" and phases.name_of(phases.current()) == "alone"
        gpuflame.phase("again")
    assert phases.current() == before  # the with block puts back what ran before it
    phases.listen(lambda i, t: told.append(i))
    phases._listeners.clear()
    assert told == []


@pytest.mark.parametrize("recorder", RECORDERS)
def test_a_mark_inside_torch_compile_leaves_the_graph_whole(recorder: str) -> None:
    """A mark in code torch.compile traces does nothing: fullgraph compiles, the call runs in the phase around it.

    Before, the mark's lock broke the graph: fullgraph=True raised, and without it the code ran uncompiled.
    """

    def step(x: Any) -> Any:
        with gpuflame.phase("inside_compiled"):
            y = x * 2
        return y + 1

    compiled = torch.compile(step, backend="eager", fullgraph=True)
    x = torch.ones(1000, dtype=torch.uint8)

    def run() -> Any:
        with gpuflame.phase("outer"):
            out = compiled(x)
            assert phases.name_of(phases.current()) == "outer"
        return out

    profile, out = record(RECORDERS[recorder], run)
    assert int(out[0]) == 3
    assert "inside_compiled" not in table(profile)
    assert by_phase(profile, INUSE) == {"outer": nbytes(out)}
    with gpuflame.phase("outer"):  # called eagerly, the same code marks its phase
        step(x)
        assert phases.name_of(phases.current()) == "outer"
    phases.switch(0)


@pytest.mark.parametrize("bad", ["", " ", "x" * 65, " train", "a\nb", 3, None])
def test_bad_phase_names_are_one_clear_error(bad: Any) -> None:
    before = phases.current()
    with pytest.raises(ValueError, match="phase name"):
        gpuflame.phase(bad)
    assert phases.current() == before


def test_table_comment_round_trip_and_damage() -> None:
    rows = [PhaseStat("train", "cpu", "1", 5, 9, 100, 7, 40, "f", 60, 2)]
    assert phase_model.split_comments(["a", phase_model.to_comment(rows), "b"]) == (rows, ["a", "b"])
    assert phase_model.split_comments([phase_model.PREFIX + "{"]) == ([], [phase_model.DAMAGED_NOTE])


def test_merge_keeps_each_process_rows() -> None:
    p1 = Profile(sample_types=[("peak_space", "bytes")], phases=[PhaseStat("train", "cpu", "1", 1, 9, 100)])
    p2 = Profile(sample_types=[("peak_space", "bytes")], phases=[PhaseStat("train", "cpu", "2", 2, 9, 50)])
    merged = merge([p1, p2, p1])
    assert [(r.pid, r.peak) for r in merged.phases] == [("1", 100), ("2", 50)]


PHASE_SCRIPT = """
import json, sys
import torch, gpuflame
with gpuflame.phase("load_model"):
    w = torch.empty(1 << 20, dtype=torch.uint8)
gpuflame.phase("serve")
tmp = torch.empty(3 << 20, dtype=torch.uint8)
del tmp
kept = torch.empty(1 << 10, dtype=torch.uint8)
"""


@pytest.mark.subprocess
def test_gpuflame_run_then_report_by_phase(tmp_path: Path) -> None:
    """End to end as a user runs it: the report's By phase table and its --json."""
    (tmp_path / "app.py").write_text(PHASE_SCRIPT)
    result = gpuflame_run("-o", "run.pb.gz", "app.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = subprocess.run(
        [sys.executable, "-m", "gpuflame", "report", "--json", "run.pb.gz"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    rows = {r["phase"]: r for r in json.loads(report.stdout)["by_phase"]}
    assert list(rows) == ["load_model", "serve", "<none>"]  # the phases as they began; unmarked time last
    assert rows["<none>"]["peak"] == 1 << 20  # between the load block and serve, the weights were live
    assert rows["load_model"]["peak"] == 1 << 20 and rows["load_model"]["inuse_end"] == 1 << 20
    assert rows["serve"]["peak"] == (1 << 20) + (3 << 20)
    assert rows["serve"]["inuse_end"] == (1 << 20) + (1 << 10)
    assert rows["serve"]["top_function"] == "<module>" and rows["serve"]["top_bytes"] == (4 << 20)
    assert rows["load_model"]["start_s"] <= rows["serve"]["start_s"]
    # the table's times are the strip's, which --at reads: at each phase's end, what it left live
    profile = gpuflame.load(tmp_path / "run.pb.gz")
    for name, left in (("load_model", 1 << 20), ("serve", (1 << 20) + (1 << 10))):
        assert moment.at(profile, rows[name]["end_s"]).totals()["inuse_space"] == left, name
    text = subprocess.run(
        [sys.executable, "-m", "gpuflame", "report", "run.pb.gz"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "160"},
    ).stdout
    assert "By phase" in text
    line = next(x for x in text.splitlines() if x.startswith("serve"))
    assert "4.00 MiB" in line and "1.00 MiB" in line and "<module> (4.00 MiB)" in line
    unmarked = next(x for x in text.splitlines() if x.startswith("<none>"))
    assert unmarked.split()[1] == "unmarked"  # every unmarked stretch: no one start (0.000s last misled)
    top = subprocess.run(
        [sys.executable, "-m", "gpuflame", "top", "--by", "phase", "--type", "inuse", "--json", "run.pb.gz"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert {r["phase"]: r["total"] for r in json.loads(top.stdout)["phases"]} == {
        "load_model": 1 << 20,
        "serve": 1 << 10,
    }
    filtered = subprocess.run(
        [sys.executable, "-m", "gpuflame", "top", "--label", "phase=serve", "--type", "inuse", "--json", "run.pb.gz"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(filtered.stdout)["total"] == 1 << 10


@pytest.mark.subprocess
def test_top_by_phase_without_phases_is_one_clear_error(tmp_path: Path) -> None:
    profile = Profile(sample_types=[("inuse_space", "bytes")])
    profile.add([Frame("f", "/f.py", 1)], [10], {"pid": "1"})
    (tmp_path / "p.pb.gz").write_bytes(pprof.encode(profile))
    result = subprocess.run(
        [sys.executable, "-m", "gpuflame", "top", "--by", "phase", "p.pb.gz"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "no phases" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("recorder", RECORDERS)
def test_transformers_load_and_generate_marked_without_code_changes(recorder: str, tmp_path: Path) -> None:
    cfg = tiny_llama_config()
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)  # a local checkpoint: no download

    def run() -> Any:
        # saved as float32, loaded as bfloat16: the weights are converted into fresh storages (loaded as
        # saved, they would stay memory-mapped from the file: not allocator memory, see README)
        model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
        prompt = torch.randint(0, 128, (1, 8))
        out = model.generate(prompt, max_new_tokens=4, do_sample=False)
        with gpuflame.phase("mine"):  # the program's own phase wins over the automatic one
            model.generate(prompt, max_new_tokens=2, do_sample=False)
        return model, prompt, out

    profile, (model, prompt, out) = record(RECORDERS[recorder], run)
    rows = table(profile)
    assert [r for r in rows if r != "<none>"] == ["load_model", "generate", "mine"]
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert rows["load_model"].inuse_end == params + buffers
    assert by_phase(profile, INUSE)["load_model"] == params + buffers
    assert rows["generate"].inuse_end == params + buffers + nbytes(prompt, out)  # all that was live then
    assert by_phase(profile, INUSE)["generate"] == nbytes(out)
    assert rows["generate"].peak > rows["generate"].inuse_end


VLLM_STAND_IN = '''
"""STAND-IN for vLLM's V1 GPU model runner (vLLM needs a GPU and is not installed here): same module,
class and method names as vllm/v1/worker/gpu_model_runner.py, allocating CPU tensors instead."""
import torch


class GPUModelRunner:
    def load_model(self):
        self.weights = torch.empty(1000, dtype=torch.uint8)

    def initialize_kv_cache(self):
        self.kv = torch.empty(5000, dtype=torch.uint8)

    def capture_model(self):
        scratch = torch.empty(300, dtype=torch.uint8)
        self.graph = torch.empty(20, dtype=torch.uint8)
        del scratch
'''


@pytest.mark.parametrize("recorder", RECORDERS)
def test_vllm_phases_by_function_name_on_a_stand_in(
    recorder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stand_in_vllm(tmp_path, monkeypatch)

    def run() -> Any:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # imported while recording

        return _load_and_capture(GPUModelRunner())

    try:
        profile, _runner = record(RECORDERS[recorder], run)
    finally:
        _forget_vllm()
    _assert_vllm_phases(table(profile))


def test_a_framework_imported_while_the_watch_was_off_sys_meta_path_is_marked_at_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pytester and sandboxes restore ``sys.meta_path``, taking the import watch off: a framework imported
    then (vLLM here, Lightning in the suite) was never wrapped, and every later recording had no phases."""
    _stand_in_vllm(tmp_path, monkeypatch)
    auto_phases.install()  # an earlier recording set the watch
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if type(f).__name__ != "_PostImportFinder"])
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        assert not hasattr(GPUModelRunner.load_model, "__gpuflame_phase__")  # the watch missed it
        profile, _runner = record(RECORDERS["dispatch"], lambda: _load_and_capture(GPUModelRunner()))
    finally:
        _forget_vllm()
    _assert_vllm_phases(table(profile))


def _stand_in_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """VLLM_STAND_IN importable as vllm.v1.worker.gpu_model_runner, watched for afresh."""
    package = tmp_path / "vllm" / "v1" / "worker"
    package.mkdir(parents=True)
    for folder in (tmp_path / "vllm", tmp_path / "vllm" / "v1", package):
        (folder / "__init__.py").write_text("")
    (package / "gpu_model_runner.py").write_text(VLLM_STAND_IN)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(auto_phases, "_installed", False)  # watch for the (new) stand-in module again


def _forget_vllm() -> None:
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]


def _load_and_capture(runner: Any) -> Any:
    runner.load_model()
    runner.initialize_kv_cache()
    runner.capture_model()
    return runner


def _assert_vllm_phases(rows: dict[str, Any]) -> None:
    assert [r for r in rows if r != "<none>"] == ["load_model", "kv_cache_allocation", "cuda_graph_capture"]
    assert (rows["load_model"].peak, rows["load_model"].inuse_end) == (1000, 1000)
    assert (rows["kv_cache_allocation"].peak, rows["kv_cache_allocation"].inuse_end) == (6000, 6000)
    assert (rows["cuda_graph_capture"].peak, rows["cuda_graph_capture"].inuse_end) == (6320, 6020)
    assert rows["kv_cache_allocation"].top == "GPUModelRunner > initialize_kv_cache"


@pytest.mark.subprocess
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # JAX, imported by other tests, warns
@pytest.mark.parametrize("recorder", RECORDERS)
def test_a_forked_child_starts_in_the_running_phase(recorder: str) -> None:
    rec = RECORDERS[recorder]()
    rec.start()
    gpuflame.phase("serve")
    parent = torch.empty(4096, dtype=torch.uint8)
    pid = os.fork()
    if pid == 0:  # the child's window starts at the fork, in the phase running then
        code = 1
        try:
            x = torch.empty(300, dtype=torch.uint8)
            profile = rec.snapshot()
            rows = {r.phase: r for r in profile.phases}
            ok = rows["serve"].peak == 300 and by_phase(profile, INUSE) == {"serve": 300} and x.numel() == 300
            code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    rec.stop()
    phases.switch(0)
    assert os.waitstatus_to_exitcode(status) == 0 and parent.numel() == 4096


def test_names_past_the_limit_share_one_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name per step would grow every recorder's books: past MAX_PHASES names they share MORE."""
    monkeypatch.setattr(phases, "_names", list(phases._names))
    monkeypatch.setattr(phases, "_ids", dict(phases._ids))
    kept = phases.intern("step_kept")
    while len(phases._names) < phase_model.MAX_PHASES:
        phases.intern(f"step_{len(phases._names)}")
    more = phases.intern("step_x")
    assert phases.name_of(more) == phase_model.MORE and phases.intern("step_y") == more
    assert phases.intern("step_kept") == kept != more  # earlier names keep their ids
    assert len(phases._names) == phase_model.MAX_PHASES + 1


def test_a_thread_s_block_ending_leaves_a_later_thread_s_phase_running() -> None:
    """Two threads' with blocks overlap (load begins, train begins, load ends, train allocates): train's
    3000 B stay train's (the load block's end had put back <none> over it), and once both end the
    process is in <none> again (train's end had put back load, which had ended)."""
    import threading

    step = [threading.Event() for _ in range(3)]

    def loader() -> None:
        with gpuflame.phase("load_t"):
            step[0].set()
            step[1].wait(30)
        step[2].set()

    def trainer(kept: list[Any]) -> None:
        step[0].wait(30)
        with gpuflame.phase("train_t"):
            step[1].set()
            step[2].wait(30)
            kept.append(torch.empty(3000, dtype=torch.uint8))

    def run() -> list[Any]:
        kept: list[Any] = []
        threads = [threading.Thread(target=loader), threading.Thread(target=trainer, args=(kept,))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        kept.append(phases.name_of(phases.current()))
        return kept

    profile, kept = record(RECORDERS["allocator"], run)
    assert kept[1] == "<none>"
    assert by_phase(profile, INUSE) == {"train_t": 3000}
