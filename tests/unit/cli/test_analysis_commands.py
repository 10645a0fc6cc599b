"""report, top, explain, diff and export, run as a user runs them.

Numbers are checked against sums over the samples of the file read back,
not against constants; every failure must be one line on stderr, exit 2.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from gpuflame.cli.main import COMMANDS
from gpuflame.formats import load, save
from gpuflame.model import Frame, Profile, SampleType
from gpuflame.units import format_bytes
from tests.helpers.cli import run, run_json
from tests.helpers.guide import GiB, guide_profile

ANALYSIS = ("report", "top", "explain", "diff", "export")


@pytest.fixture(scope="module")
def guide_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("profiles") / "guide.pb.gz"
    save(guide_profile(), path)
    return path


@pytest.fixture(scope="module")
def guide(guide_file) -> Profile:
    """The profile as gpuflame reads it back: what the commands see."""
    return load(guide_file)


def by_self(profile: Profile, index: int) -> Counter:
    out: Counter = Counter()
    for s in profile.samples:
        out[profile.frames[s.stack[0]].name] += s.values[index]
    return out


def by_total(profile: Profile, index: int) -> Counter:
    out: Counter = Counter()
    for s in profile.samples:
        for name in {profile.frames[i].name for i in s.stack}:
            out[name] += s.values[index]
    return out


def total(profile: Profile, type_name: str, keep=lambda names: True) -> int:
    i = profile.type_index(type_name)
    return sum(s.values[i] for s in profile.samples if keep([profile.frames[f].name for f in s.stack]))


# -- report --------------------------------------------------------------------


def test_report_text_answers_the_quick_reference_table(capsys, guide_file, guide):
    rc, out, err = run(capsys, "report", guide_file)
    assert rc == 0 and err == ""
    assert "note: trace ring buffer overflowed; peak only over the recorded window" in out
    for title in ("What allocates the most", "What is responsible", "Optimisation targets", "Skippable"):
        assert title in out
    leaf, leaf_bytes = by_self(guide, guide.type_index("peak_space")).most_common(1)[0]
    line = next(line for line in out.splitlines() if leaf in line)
    assert format_bytes(leaf_bytes) in line and "gpu_model_runner.py:2010" in line
    assert "splits here" in out
    assert format_bytes(total(guide, "peak_space")) in out


def test_report_json_is_exact(capsys, guide_file, guide):
    data = run_json(capsys, "report", guide_file)
    index = guide.type_index("peak_space")
    assert data["sample_type"] == "peak_space"
    assert data["total"] == total(guide, "peak_space")
    assert {t["type"]: t["total"] for t in data["totals"]} == guide.totals()
    assert data["comments"] == guide.comments
    want = by_self(guide, index)
    assert [(e["name"], e["self"]) for e in data["widest_leaves"]] == want.most_common(len(data["widest_leaves"]))
    totals = by_total(guide, index)
    for e in data["skippable_wrappers"]:
        assert e["total"] == totals[e["name"]] and e["self"] == want.get(e["name"], 0)
    assert data["widest_roots"][0]["trunk"][-1]["name"] == "EngineCore > __init__"


def test_report_type_choice(capsys, guide_file, guide):
    inuse = run_json(capsys, "report", guide_file, "--type", "inuse")
    assert inuse["sample_type"] == "inuse_space" and inuse["total"] == total(guide, "inuse_space")
    alloc = run_json(capsys, "report", guide_file, "--type", "alloc_space/bytes")
    assert alloc["total"] == total(guide, "alloc_space")


def test_report_filters(capsys, guide_file, guide):
    peak = "peak_space"
    no_cached = run_json(capsys, "report", guide_file, "--no-cached")
    assert no_cached["total"] == total(guide, peak, lambda n: "<cached free blocks>" not in n)

    one_device = run_json(capsys, "report", guide_file, "--label", "device=cuda:1")
    index = guide.type_index(peak)
    assert one_device["total"] == sum(s.values[index] for s in guide.samples if s.label("device") == "cuda:1")

    focused = run_json(capsys, "report", guide_file, "--focus", "Worker.load_model")
    assert focused["total"] == total(guide, peak, lambda n: "Worker > load_model" in n)
    assert focused["widest_roots"][0]["trunk"][0]["name"] == "Worker > load_model"

    hidden = run_json(capsys, "report", guide_file, "--hide-trampolines", "--ignore", "compile")
    names = {e["name"] for e in hidden["skippable_wrappers"]}
    assert "<interpreter trampoline>" not in names and "<module>" in names
    assert hidden["total"] == total(guide, peak, lambda n: "_compile_fx_inner" not in n)

    cut = run_json(capsys, "report", guide_file, "--min-size", "5GiB", "-n", "50")
    leaves = {e["name"] for e in cut["widest_leaves"]}
    assert "<frames under 5.00 GiB>" in leaves and "LlamaMLP > __init__" in leaves
    assert cut["total"] == total(guide, peak)

    pruned = run_json(capsys, "report", guide_file, "--prune-framework=vllm")
    wrappers = {e["name"] for e in pruned["skippable_wrappers"]}
    assert "Worker > load_model" not in wrappers and "<module>" in wrappers
    assert pruned["total"] == total(guide, peak)


def test_report_group_by_label(capsys, guide_file, guide):
    data = run_json(capsys, "report", guide_file, "--group-by", "device")
    index = guide.type_index("peak_space")
    roots = {r["trunk"][0]["name"]: r["trunk"][0]["total"] for r in data["widest_roots"]}
    for device in ("cuda:0", "cuda:1"):
        assert roots[f"device={device}"] == sum(s.values[index] for s in guide.samples if s.label("device") == device)


# -- top -----------------------------------------------------------------------


@pytest.mark.parametrize("by", ["self", "total"])
def test_top_by_self_and_total(capsys, guide_file, guide, by):
    data = run_json(capsys, "top", guide_file, "--by", by, "-n", "4")
    index = guide.type_index("peak_space")
    want = (by_self if by == "self" else by_total)(guide, index)
    got = [(f["name"], f[by]) for f in data["functions"]]
    assert len(got) == 4
    assert [v for _, v in got] == [v for _, v in want.most_common(4)]
    assert all(want[name] == v for name, v in got)


def test_top_text(capsys, guide_file, guide):
    rc, out, _ = run(capsys, "top", guide_file, "-n", "3", "--type", "peak")
    assert rc == 0
    name, value = by_self(guide, guide.type_index("peak_space")).most_common(1)[0]
    assert name in out and format_bytes(value) in out and "file:line" in out


# -- explain ---------------------------------------------------------------------


def test_explain_reads_the_chain_bottom_up(capsys, guide_file, guide):
    rc, out, _ = run(capsys, "explain", guide_file, "GPUModelRunner._allocate_kv_cache_tensors")
    assert rc == 0
    order = [
        "0x7f151",
        "<module>",
        "EngineCore > _initialize_kv_caches",
        "GPUModelRunner > _allocate_kv_cache_tensors",
    ]
    chain = out[out.index("Chain 1 of 1") :]
    positions = [chain.index(name) for name in order]
    assert positions == sorted(positions)
    data = run_json(capsys, "explain", guide_file, "GPUModelRunner > _allocate_kv_cache_tensors")
    want = total(guide, "peak_space", lambda n: "GPUModelRunner > _allocate_kv_cache_tensors" in n)
    assert data["total"] == want == data["chains"][0]["total"]
    assert [s["name"] for s in data["chains"][0]["steps"]][:3] == [
        "0x7f151",
        "<interpreter trampoline>",
        "<module>",
    ]


def test_explain_unknown_function_suggests_names(capsys, guide_file):
    rc, out, err = run(capsys, "explain", guide_file, "GPUModelRuner.allocate_kv_cach")
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert "did you mean" in err and "GPUModelRunner > _allocate_kv_cache_tensors" in err


# -- diff ------------------------------------------------------------------------


def test_diff_by_function(capsys, tmp_path, guide_file, guide):
    grown = guide_profile()
    grown.add([Frame("new_cache", "/app/cache.py", 3), Frame("<module>", "/app/serve.py", 1)], [GiB] * 6)
    grown.samples = [s for s in grown.samples if "LlamaMLP > __init__" not in {grown.frames[i].name for i in s.stack}]
    new_file = tmp_path / "new.pb.gz"
    save(grown, new_file)
    new = load(new_file)
    data = run_json(capsys, "diff", guide_file, new_file, "-n", "50")
    index, new_index = guide.type_index("peak_space"), new.type_index("peak_space")
    before, after = by_total(guide, index), by_total(new, new_index)
    changes = {c["name"]: c for c in data["grew"] + data["shrank"]}
    assert changes["new_cache"]["status"] == "new" and changes["new_cache"]["new"] == after["new_cache"]
    assert changes["LlamaMLP > __init__"]["status"] == "vanished"
    assert changes["LlamaMLP > __init__"]["delta"] == -before["LlamaMLP > __init__"]
    assert data["delta"] == total(new, "peak_space") - total(guide, "peak_space")
    rc, out, _ = run(capsys, "diff", guide_file, new_file)
    assert rc == 0 and "[new]" in out and "[vanished]" in out and "Grew" in out and "Shrank" in out


@pytest.mark.parametrize("option", ["--hide", "--ignore"])
def test_a_pattern_that_matches_nothing_is_a_warning(capsys, guide_file, guide, option):
    """pprof: "expression matched no samples". A typo must not read as "hiding changed nothing"."""
    rc, out, err = run(capsys, "report", guide_file, option, "Worker.load_modl", "--json")
    assert rc == 0 and json.loads(out)["total"] == total(guide, "peak_space")
    [line] = err.splitlines()
    assert (
        line.startswith(
            f"gpuflame report: warning: {option} changed nothing: no function matches 'Worker.load_modl'; did you mean "
        )
        and "'Worker > load_model'" in line
    )
    rc, _, err = run(capsys, "report", guide_file, option, "Worker.load_model", "--json")
    assert rc == 0 and err == ""  # it matched: no word
    rc, _, err = run(capsys, "report", guide_file, "--hide-trampolines", "--label", "device=cuda:1", "--json")
    assert rc == 0 and err == ""  # a flag, not a pattern: a profile without trampolines is fine


# -- export ----------------------------------------------------------------------


def test_export_json_tree(capsys, tmp_path, guide_file, guide):
    out_file = tmp_path / "tree.json"
    rc, out, err = run(capsys, "export", guide_file, "-o", out_file)
    assert rc == 0 and str(out_file) in out and "json" in out
    assert err.splitlines() == [f"gpuflame export: note: {c}" for c in guide.comments]  # its notes, as report says them
    data = json.loads(out_file.read_text())
    assert data["total"] == total(guide, "peak_space") == sum(r["total"] for r in data["roots"])
    assert sorted(os.listdir(tmp_path)) == ["tree.json"], "no temporary file left"


@pytest.mark.parametrize("fmt,suffix", [("pprof", ".pb.gz"), ("folded", ".folded"), ("speedscope", ".json")])
def test_export_other_formats(capsys, tmp_path, guide_file, guide, fmt, suffix):
    out_file = tmp_path / f"out{suffix}"
    info = run_json(capsys, "export", guide_file, "--format", fmt, "-o", out_file, "--no-cached")
    assert info["format"] == fmt and info["bytes"] == out_file.stat().st_size > 0
    if fmt != "speedscope":
        back = load(out_file)
        type_name = "peak_space" if fmt == "pprof" else back.type_names()[0]
        assert total(back, type_name) == total(guide, "peak_space", lambda n: "<cached free blocks>" not in n)


def test_export_says_one_sample_in_the_singular(capsys, tmp_path):
    one = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    one.add([Frame("alloc", "a.py", 3)], [4096])
    save(one, tmp_path / "one.pb.gz")
    rc, out, _ = run(capsys, "export", tmp_path / "one.pb.gz", "--format", "pprof", "-o", tmp_path / "out.pb.gz")
    assert rc == 0 and "1 sample," in out and "1 samples" not in out


def test_export_format_from_the_name(capsys, tmp_path, guide_file):
    rc, out, _ = run(capsys, "export", guide_file, "-o", tmp_path / "x.folded")
    assert rc == 0 and "folded" in out
    rc, out, _ = run(capsys, "export", guide_file, "-o", tmp_path / "x.png")  # says nothing: pprof, as convert
    assert rc == 0 and "(pprof, " in out and load(tmp_path / "x.png").totals() == load(guide_file).totals()


# -- bad input: one line, exit 2, nothing left behind ------------------------------


def bad_inputs(tmp: Path, good: Path) -> dict[str, Path]:
    (tmp / "empty.pb.gz").write_bytes(b"")
    (tmp / "garbage.bin").write_bytes(bytes([0xFF, 0x00, 0x13, 0x37]) * 64)
    (tmp / "truncated.pb.gz").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    (tmp / "bad-gzip.pb.gz").write_bytes(gzip.compress(b"\x0a\xff\xff\xff")[:-6] + b"zzzzzz")
    (tmp / "folder").mkdir(exist_ok=True)
    return {
        "missing": tmp / "nope.pb.gz",
        "empty": tmp / "empty.pb.gz",
        "garbage": tmp / "garbage.bin",
        "truncated": tmp / "truncated.pb.gz",
        "corrupt": tmp / "bad-gzip.pb.gz",
        "directory": tmp / "folder",
    }


@pytest.mark.parametrize("kind", ["missing", "empty", "garbage", "truncated", "corrupt", "directory"])
@pytest.mark.parametrize("command", ["report", "top", "explain", "diff", "export"])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, guide_file, kind, command):
    bad = bad_inputs(tmp_path, guide_file)[kind]
    out_file = tmp_path / "kept.folded"
    out_file.write_text("earlier;export 1\n")  # one gpuflame may replace: the bad input must stop it
    argv = {
        "report": ["report", bad],
        "top": ["top", bad],
        "explain": ["explain", bad, "forward"],
        "diff": ["diff", guide_file, bad],
        "export": ["export", bad, "-o", out_file],
    }[command]
    rc, out, err = run(capsys, *argv)
    assert rc == 2, err
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"gpuflame {command}: error: ")
    assert out_file.read_text() == "earlier;export 1\n"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["report", "{f}", "--type", "gpu_seconds"], "has no sample type 'gpu_seconds' (it has: peak_space"),
        (["top", "{f}", "--by", "width"], "invalid choice"),
        (["report", "{f}", "--wrong-flag"], "unrecognized arguments"),
        (["report", "{f}", "--min-size", "lots"], "not a size"),
        (["report", "{f}", "--label", "nodevice"], "KEY=VALUE"),
        (["report", "{f}", "--label", "device=tpu:3"], "device values here: cuda:0, cuda:1"),
        (["report", "{f}", "--focus", "NoSuchThing"], "--focus: no function matches"),
        (["diff", "{f}", "{f}", "--type", "vram"], "no sample type 'vram'"),
        (["export", "{f}", "-o", "{dir}/missing-folder/out.json"], "cannot write"),
        (["export", "{f}", "--format", "json", "-o", "{dir}"], "cannot write"),
        (["export", "{f}", "-o", "/proc/gpuflame-test.json"], "cannot write"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(capsys, tmp_path, guide_file, argv, words):
    argv = [a.format(f=guide_file, dir=tmp_path) for a in argv]
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert words in err and "Traceback" not in err
    assert os.listdir(tmp_path) == []


def test_export_onto_a_folder_leaves_it_alone(capsys, tmp_path, guide_file):
    folder = tmp_path / "out.json"
    folder.mkdir()
    (folder / "inside").write_text("kept")
    rc, _, err = run(capsys, "export", guide_file, "-o", folder)
    assert rc == 2 and "cannot write" in err and len(err.strip().splitlines()) == 1
    assert os.listdir(folder) == ["inside"] and os.listdir(tmp_path) == ["out.json"]


def test_failed_export_keeps_the_existing_file(capsys, tmp_path, guide_file):
    target = tmp_path / "out.pb.gz"
    target.write_bytes(b"the old profile")
    os.chmod(tmp_path, 0o500)
    try:
        if os.access(tmp_path, os.W_OK):
            pytest.skip("running as a user who can write anywhere")
        rc, _, err = run(capsys, "export", guide_file, "-o", target)
    finally:
        os.chmod(tmp_path, 0o700)
    assert rc == 2 and "cannot write" in err and len(err.strip().splitlines()) == 1
    assert target.read_bytes() == b"the old profile"


# -- help ------------------------------------------------------------------------


def test_every_analysis_command_is_registered():
    assert set(ANALYSIS) <= set(COMMANDS)


@pytest.mark.parametrize("command", ANALYSIS)
def test_help_teaches_and_gives_examples(capsys, command):
    rc, out, _ = run(capsys, command, "--help")
    assert rc == 0
    assert "examples:" in out and f"gpuflame {command} " in out
    if command != "export":
        assert "filters, applied in this order" in out
        assert "--json" in out and "--type" in out


def test_report_help_gives_the_reading_rules(capsys):
    _, out, _ = run(capsys, "report", "--help")
    text = " ".join(out.split())
    for rule in (
        "Start from the leaves",
        "skip wide zero-self bars",
        "wide high-self bars are the targets",
        "bottom-up",
    ):
        assert rule in text


# -- as a real process -------------------------------------------------------------


@pytest.mark.subprocess
def test_python_dash_m_gpuflame(guide_file, guide):
    done = subprocess.run(
        [sys.executable, "-m", "gpuflame", "report", str(guide_file), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["total"] == total(guide, "peak_space")
    bad = subprocess.run(
        [sys.executable, "-m", "gpuflame", "report", str(guide_file) + ".missing"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert len(bad.stderr.strip().splitlines()) == 1 and "no such file" in bad.stderr


def test_the_report_header_names_the_filters_it_shows(capsys, tmp_path) -> None:
    """A filtered report must not read as the whole profile: the header repeats the filters."""
    from gpuflame.formats import save
    from gpuflame.model import Frame, Profile

    p = Profile([("peak_space", "bytes")])
    p.add([Frame("f", "/a.py", 1), Frame("<interpreter trampoline>", kind="trampoline")], [10], {"device": "cpu"})
    save(p, tmp_path / "p.pb.gz")
    rc, out, err = run(
        capsys,
        "report",
        tmp_path / "p.pb.gz",
        "--hide-trampolines",
        "--label",
        "device=cpu",
        "--min-size",
        "1KiB",
        "--hide",
        "g h",
    )
    assert rc == 0, err
    lines = out.splitlines()
    header = " ".join(x.strip() for x in lines[: next(i for i, x in enumerate(lines) if x.startswith("peak_space"))])
    assert header.endswith("p.pb.gz --label device=cpu --hide 'g h' --hide-trampolines --min-size 1024"), header


def test_top_by_phase_on_a_jax_profile_with_phases_does_not_ask_to_mark_them(capsys, tmp_path: Path) -> None:
    """JAX's phases are a table of sampled peaks, its samples carry no phase label: ``top --by phase`` told
    a user who had marked phases to mark them with gpuflame.phase."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    jnp = pytest.importorskip("jax.numpy")
    import gpuflame
    from gpuflame.capture.books import phases
    from gpuflame.capture.recorders.jax_memory import JaxMemoryRecorder

    rec = JaxMemoryRecorder()
    rec.start()
    try:
        with gpuflame.phase("load"):
            kept = jnp.ones((64, 64), dtype=jnp.float32)
    finally:
        rec.stop()
        phases.switch(0)
    save(rec.snapshot(), tmp_path / "jax.pb.gz")
    assert kept.nbytes == 64 * 64 * 4
    rc, out, err = run(capsys, "top", "--by", "phase", tmp_path / "jax.pb.gz")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "carry no phase" in err and "gpuflame report" in err and "mark them" not in err
    rc, out, _ = run(capsys, "report", tmp_path / "jax.pb.gz", "--json")
    assert rc == 0 and [r["phase"] for r in json.loads(out)["by_phase"]] == ["load", "<none>"]


def test_a_run_folder_names_the_profile_in_it(capsys, tmp_path):
    """`gpuflame report <run folder>` said only 'is a directory, not a profile file' (a trial gave a store's folder)."""
    run_folder = tmp_path / "2026-12-07T10-00-00-train"
    run_folder.mkdir()
    profile = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    profile.add([Frame("leaf", "a.py", 3)], [4096])
    save(profile, run_folder / "profile.pb.gz")
    for command in ("report", "top", "flame"):
        rc, out, err = run(capsys, command, run_folder)
        assert rc == 2 and out == ""
        said = f"is a run folder, not a profile file; its profile is {run_folder / 'profile.pb.gz'}"
        assert err.strip().endswith(said)
    rc, _, err = run(capsys, "report", tmp_path)  # any other folder: as before
    assert rc == 2 and "is a directory, not a profile file" in err
