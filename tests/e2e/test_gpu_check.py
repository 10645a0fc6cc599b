"""bench/gpu_check.py (``make gpu-check``) in its dry run on the CPU, so the GPU check cannot rot before a GPU comes.

The whole dry run once (pure-torch models: no transformers import per
process): at most 8 files, each part's file with its status and its
results. A second run makes one part hang past its time limit and another
raise: each is marked failed in its own file and the driver goes on. The
models (models.py) are built in this process at the tiny size, both ways
where transformers imports, and run a training step and a generate.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

SCRIPT = REPO / "bench" / "gpu_check.py"
PART_FILES = {
    "env": "env.txt",
    "tests": "tests.txt",
    "overhead": "overhead.md",
    "simulate": "simulate.md",
    "agent": "agent.md",
}


def gpu_check(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "PYTORCH_CUDA_ALLOC_CONF")}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *args], capture_output=True, text=True, env=env, timeout=900
    )


def status(text: str) -> str:
    lines = text.splitlines()
    assert lines[0].startswith("# "), text[:200]
    assert lines[1].startswith("status: "), text[:200]
    return lines[1][len("status: ") :]


def manifest(out: Path) -> tuple[str, dict[str, bytes]]:
    with tarfile.open(out / "snapshots.tar") as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    return files["MANIFEST.md"].decode(), files


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu-check")
    done = gpu_check(out, "--dry-run", "--impl", "pure-torch")
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_the_dry_run_writes_at_most_8_files_each_part_with_its_status(dry_run: Path) -> None:
    names = sorted(p.name for p in dry_run.iterdir())
    assert len(names) <= 8, names
    assert set(PART_FILES.values()) | {"summary.md", "snapshots.tar", "tests.xml"} == set(names)
    summary = (dry_run / "summary.md").read_text()
    assert status(summary) == "ok"
    for part, name in PART_FILES.items():
        part_status = status((dry_run / name).read_text())
        assert part_status.startswith(("ok", "skipped: ")), (name, part_status)
        assert f"| {part} | {part_status} |" in summary
    manifest_text, _ = manifest(dry_run)
    assert f"| snapshots | {status(manifest_text)} |" in summary


def test_without_cuda_the_cuda_parts_say_so_and_still_ran_their_code(dry_run: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the dry run ran the CUDA parts")
    for name in ("overhead.md", "simulate.md", "agent.md"):
        assert status((dry_run / name).read_text()).startswith("skipped: no CUDA"), name
    overhead = (dry_run / "overhead.md").read_text()
    for workload in ("training step (gpt2-train)", "generate loop (llama-generate)"):
        row = next(line for line in overhead.splitlines() if line.startswith(f"| {workload} |"))
        assert "| 2 x " in row and "MiB" in row, row
    simulate = (dry_run / "simulate.md").read_text()
    for setting in ("recorded settings (replay)", "expandable_segments:True", "max_split_size_mb:32",
                    "roundup_power2_divisions:4", "memory cap", "CPU run predicted for the GPU"):  # fmt: skip
        row = next(line for line in simulate.splitlines() if f"| {setting}" in line)
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[3].endswith("MiB") and cells[4] == "no CUDA", row  # simulated, beside no real run
    cap = next(line for line in simulate.splitlines() if "| memory cap" in line)
    assert cap.rstrip(" |").split("|")[-2].strip() == "yes", cap  # 80% of the peak: simulate says out of memory
    agent = (dry_run / "agent.md").read_text()
    assert "| **total** |" in agent and "gpt2_train > step" in agent


def test_the_tests_part_ran_tests_gpu_with_a_junit_file(dry_run: Path) -> None:
    import xml.etree.ElementTree as ET

    collected = sorted(p.name for p in (REPO / "tests" / "gpu").glob("test_*.py"))
    tests = (dry_run / "tests.txt").read_text()
    suite = ET.parse(dry_run / "tests.xml").getroot().find("testsuite")
    assert suite is not None
    names = {case.get("classname", "").split(".")[-1] + ".py" for case in suite.iter("testcase")}
    assert names == set(collected)
    assert int(suite.get("tests", "0")) == sum(
        1 for line in tests.splitlines() if "tests/gpu/" in line and "::" in line
    )


def test_the_tar_records_the_script_and_its_version(dry_run: Path) -> None:
    text, files = manifest(dry_run)
    for name in ("workloads.py", "models.py"):
        source = (REPO / "bench" / "gpu_check" / name).read_bytes()
        assert files[f"script/{name}"] == source
        assert f"bench/gpu_check/{name} sha256 {hashlib.sha256(source).hexdigest()}" in text
    version = (REPO / "src" / "gpuflame" / "version.py").read_text().split('__version__ = "')[1].split('"')[0]
    assert f"checkout: gpuflame {version}, git " in text
    results = json.loads(files["results.json"])
    assert {r["workload"] for r in results} == {"gpt2-train", "llama-generate"}
    assert all(r["impl"] == "pure-torch" and r["oom"] is None for r in results)


def test_a_part_that_hangs_or_raises_is_marked_failed_and_the_rest_goes_on(tmp_path: Path) -> None:
    done = gpu_check(tmp_path, "--dry-run", "--only", "env,snapshots,agent", "--inject", "env=hang",
                     "--limit", "env=3", "--inject", "snapshots=raise", "--impl", "pure-torch")  # fmt: skip
    assert done.returncode == 0, done.stderr
    env = (tmp_path / "env.txt").read_text()
    assert status(env) == "failed: timed out after 3 s (its time limit)"
    manifest_text, _ = manifest(tmp_path)
    assert status(manifest_text) == "failed: the part exited 1"
    assert "RuntimeError: injected failure in part snapshots" in manifest_text
    assert status((tmp_path / "agent.md").read_text()).startswith(("ok", "skipped: "))
    assert status((tmp_path / "summary.md").read_text()) == "failed: env, snapshots"
    hung = [p for p in Path("/proc").glob("[0-9]*") if _cmdline(p).count(str(tmp_path))]
    assert not hung, "the hanging part's process outlived its time limit"


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize("args", [["--inject", "nopart=raise"], ["--only", "env,gpu"], ["--limit", "env=soon"]])
def test_bad_options_exit_2_in_one_line(tmp_path: Path, args: list[str]) -> None:
    done = gpu_check(tmp_path / "out", *args)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_an_out_folder_holding_other_files_is_refused_and_left_alone(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    done = gpu_check(tmp_path, "--dry-run")
    assert done.returncode == 2 and "notes.txt" in done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.fixture(scope="module")
def models():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from gpu_check import models

        yield models
    finally:
        sys.path.remove(str(REPO / "bench"))


@pytest.mark.parametrize("impl", ["pure-torch", "transformers"])
def test_both_models_train_and_generate_from_a_config(models, impl: str) -> None:
    import torch

    if impl == "transformers":
        pytest.importorskip("transformers")
    size = models.SIZES["tiny"]
    step = models.gpt2_train(size, torch.device("cpu"), impl)
    first, second = step(), step()
    assert first > 0 and second > 0 and first != second  # AdamW moved the weights
    tokens = models.llama_generate(size, torch.device("cpu"), impl)()
    assert tuple(tokens.shape) == (size.batch, size.seq + size.new_tokens)


def test_a_transformers_model_that_fails_gives_way_to_the_stand_in_and_says_why(
    models, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    transformers = pytest.importorskip("transformers")

    def moved(*args: object, **kwargs: object) -> None:
        raise TypeError("generate() got an unexpected keyword argument 'cache_implementation'")

    monkeypatch.setattr(transformers.LlamaForCausalLM, "generate", moved)
    size = models.SIZES["tiny"]
    work, impl = models.started("llama-generate", size, torch.device("cpu"), "transformers")
    assert impl == "pure-torch (transformers failed: TypeError: " + (
        "generate() got an unexpected keyword argument 'cache_implementation')"
    )
    assert tuple(work().shape) == (size.batch, size.seq + size.new_tokens)


def test_an_out_of_memory_error_is_the_workloads_own(models, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    transformers = pytest.importorskip("transformers")

    def full(*args: object, **kwargs: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(transformers.LlamaForCausalLM, "generate", full)
    with pytest.raises(torch.OutOfMemoryError):
        models.started("llama-generate", models.SIZES["tiny"], torch.device("cpu"), "transformers")


def test_the_simulate_part_on_a_gpu_snapshot_runs_each_setting_once_beside_its_prediction(
    models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA branch without CUDA: a real snapshot (tests/data) as the default run, a stand-in for the GPU runs."""
    import gzip
    import pickle

    from gpu_check import part_simulate, workloads
    from gpu_check.common import Context, mib

    path = REPO / "tests" / "data" / "torch-snapshot-silmont2000-mem_snapshot.pickle.gz"
    with gzip.open(path) as f:
        snapshot = pickle.load(f)
    reserved = sum(s["total_size"] for s in snapshot["segments"])
    allocs = sum(1 for t in snapshot["device_traces"] for e in t if e["action"] == "segment_alloc")
    base = {"workload": "gpt2-train", "alloc_conf": "", "snapshot": str(path), "reserved_peak": reserved,
            "segment_events": workloads.segment_events(snapshot), "oom": None}  # fmt: skip
    oom = {**base, "recording": "gpt2-train-oom", "fraction": 0.6 * reserved / (80 << 30), "oom": "CUDA out of memory"}
    recorded = {
        "gpt2-train": base,
        "gpt2-train-expandable": {**base, "alloc_conf": "expandable_segments:True"},
        "gpt2-train-oom": oom,
    }
    calls = []

    def on_the_gpu(ctx: Context, workload: str, conf: str, cap: int) -> dict[str, object]:
        calls.append((workload, conf, cap))
        return {**base, "alloc_conf": conf, "oom": "CUDA out of memory" if cap else None}

    monkeypatch.setattr(part_simulate, "real_run", on_the_gpu)
    monkeypatch.setattr(part_simulate, "cpu_profile", lambda ctx, workload: (None, "no CPU run in this test"))
    monkeypatch.setattr(part_simulate, "device_total", lambda cuda: 80 << 30)
    rows = part_simulate.one_workload(Context(tmp_path, tmp_path, dry_run=False), "gpt2-train", True, recorded)
    cap = int(part_simulate.CAP_SHARE * reserved)
    assert calls == [  # the expandable run is the snapshots part's, not made again
        ("gpt2-train", "max_split_size_mb:32", 0),
        ("gpt2-train", "roundup_power2_divisions:4", 0),
        ("gpt2-train", "", cap),
    ]
    assert [r[1] for r in rows] == [
        "recorded settings (replay)",
        *part_simulate.SETTINGS,
        f"memory cap {mib(cap)} (80% of the default peak; --memory-fraction {cap / (80 << 30):.4g})",
        f"gpt2-train-oom replayed (--memory-fraction {oom['fraction']:.4g})",
        "CPU run predicted for the GPU",
    ]
    for r in rows[:-1]:
        assert r[2].endswith("GPU snapshot") and r[3].endswith(" MiB") and r[4] == mib(reserved), r
        assert f"alloc {allocs}" in r[7], r
    assert [r[9] for r in rows] == ["no"] * 4 + ["yes", "yes", "no"]
    assert rows[-2][8] == "yes"  # 60% of the reserved peak: simulate runs out of memory too
    assert rows[-1][3] == "no CPU run in this test"


def test_the_tar_leaves_out_the_snapshots_that_would_pass_its_limit_and_names_them(models, tmp_path: Path) -> None:
    from gpu_check import part_snapshots
    from gpu_check.common import Context

    ctx = Context(tmp_path / "out", tmp_path / "scratch", dry_run=False)
    ctx.out.mkdir()
    folder = part_snapshots.folder(ctx)
    sizes = {"small.pickle.gz": 100_000, "medium.pickle.gz": 300_000, "large.pickle.gz": 900_000}
    for name, size in sizes.items():
        (folder / name).write_bytes(os.urandom(size))
    part_snapshots.pack(ctx, "ok", "", limit=600_000)
    text, files = manifest(ctx.out)
    assert {n for n in files if n.endswith(".pickle.gz")} == {"small.pickle.gz", "medium.pickle.gz"}
    assert files["small.pickle.gz"] == (folder / "small.pickle.gz").read_bytes()
    assert "| large.pickle.gz | 879 KiB (left out: the tar would pass its limit) |" in text
    assert (ctx.out / "snapshots.tar").stat().st_size <= 600_000


def test_the_docs_page_gives_each_parts_time_limit_and_files(models) -> None:
    from gpu_check import driver

    page = (REPO / "docs" / "gpu-check.md").read_text()
    rows = {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")] for line in
            page.splitlines() if line.startswith("| ")) if cells[0] in driver.PARTS}  # fmt: skip
    assert set(rows) == set(driver.PARTS)
    for name, part in driver.PARTS.items():
        assert rows[name][1] == f"{part.LIMIT_S:.0f} s", rows[name]
        assert all(f"`{f}`" in rows[name][-1] for f in driver.files_of(part)), rows[name]
    assert sum(p.LIMIT_S for p in driver.PARTS.values()) <= driver.BUDGET_S
    assert f"under {driver.BUDGET_S:.0f} seconds" in page
    assert len(driver.all_files()) <= 8


def test_the_agent_part_starts_the_real_agent_waits_for_it_and_stops_it(models, tmp_path: Path) -> None:
    """The agent part's wrapper on this machine's kernel (root, BPF): its 'watching' line, SIGINT, the profile."""
    from tests.agent.agent_helpers import why_not

    why = why_not()
    if why:
        pytest.skip(why)
    import gpuflame
    from gpu_check.part_agent import Agent, compare

    agent = Agent(tmp_path / "agent.pb.gz", [])
    try:
        assert agent.wait_watching(120), agent.said
    finally:
        rc = agent.stop(120)
    assert rc == 0, agent.said
    assert any(line.endswith(str(tmp_path / "agent.pb.gz")) for line in agent.said), agent.said  # written, said
    profile = gpuflame.load(tmp_path / "agent.pb.gz")
    assert "| **total** |" in compare({"agent": (profile, None)})
