"""``gpuflame convert``: snapshots and profiles in, pprof/folded/speedscope/JSON out, plain errors.

Snapshots are the HAND-WRITTEN STAND-INS of ``tests/fixtures/make_snapshots.py``,
written afresh for the session so their frames point at the installed torch.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from gpuflame.cli.main import main
from gpuflame.formats import load, torch_snapshot
from gpuflame.render.writers import FORMATS
from tests.helpers.paths import SRC

make_snapshots = pytest.importorskip("tests.fixtures.make_snapshots")  # needs torch (a test dependency)


@pytest.fixture(scope="session")
def snapshot_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("snapshots")
    return {path.stem: path for path in make_snapshots.write_all(folder)}


@pytest.fixture
def small(snapshot_files: dict[str, Path]) -> Path:
    return snapshot_files["handwritten_small_trace"]


class Attack:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["convert", *args])
    out, err = capsys.readouterr()
    return code, out, err


def run_process(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The installed entry point in a fresh interpreter, as a user runs it."""
    env = dict(os.environ)
    src = str(SRC)
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("GPUFLAME_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "gpuflame", "convert", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )


# -- happy paths --------------------------------------------------------------------


def test_snapshot_to_pprof(capsys, small: Path, tmp_path: Path) -> None:
    out_path = tmp_path / "memory.pb.gz"
    code, out, err = run_cli(capsys, str(small), "-o", str(out_path))
    assert code == 0, err
    written = load(out_path)
    direct = torch_snapshot.decode(small.read_bytes())
    assert written.totals() == direct.totals()
    assert written.default_type == "peak_space"
    names = {f.name for f in written.frames}
    assert {
        "LlamaMLP > forward",
        "Linear > __init__",
        "LlamaAttention > forward",
        "<cached free blocks>",
    } <= names
    lines = out.splitlines()
    assert lines[0].startswith(f"wrote {out_path} (pprof, ")
    assert "on cuda:0" in lines[0] and "peak_space 42.0 MiB" in lines[0] and "inuse_space" in lines[0]
    assert lines[-1] == f"next: gpuflame report {out_path}"
    assert err == ""


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "pprof"])
def test_snapshot_to_single_type_formats(capsys, small: Path, tmp_path: Path, fmt: str) -> None:
    out_path = tmp_path / f"memory.{fmt}"
    code, out, err = run_cli(capsys, str(small), "-o", str(out_path), "--format", fmt, "--type", "inuse_space")
    assert code == 0, err
    text = out_path.read_text(encoding="utf-8")
    assert f"({fmt}, inuse_space, " in out
    if fmt == "folded":
        total = sum(int(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line and not line.startswith("# "))
        snap = pickle.loads(small.read_bytes())
        assert total == sum(seg["total_size"] for seg in snap["segments"])
        assert "LlamaMLP > __init__" in text
        assert load(out_path).totals()["inuse_space"] == total
    elif fmt == "svg":
        assert "LlamaMLP &gt; __init__" in text and ET.fromstring(text.encode("utf-8")) is not None
    else:
        json.loads(text)


def test_format_follows_the_output_name(capsys, small: Path, tmp_path: Path) -> None:
    for name, fmt in (
        ("a.folded", "folded"),
        ("a.speedscope.json", "speedscope"),
        ("a.json", "json"),
        ("a.pb.gz", "pprof"),
        ("a.out", "pprof"),
    ):
        code, out, _ = run_cli(capsys, str(small), "-o", str(tmp_path / name))
        assert code == 0
        assert f"({fmt}" in out, (name, out)


def test_json_summary(capsys, snapshot_files: dict[str, Path], tmp_path: Path) -> None:
    path = snapshot_files["handwritten_overflowed_trace"]
    out_path = tmp_path / "o.pb.gz"
    code, out, err = run_cli(capsys, str(path), "-o", str(out_path), "--json")
    assert code == 0, err
    summary = json.loads(out)
    profile = torch_snapshot.decode(path.read_bytes())
    assert summary["output"] == str(out_path)
    assert summary["format"] == "pprof"
    assert summary["bytes_written"] == out_path.stat().st_size
    assert {k: v["total"] for k, v in summary["totals"].items()} == profile.totals()
    assert summary["totals"]["peak_space"]["unit"] == "bytes"
    assert summary["labels"] == {"device": ["cuda:0"]}
    assert summary["comments"] == profile.comments and summary["comments"]
    assert summary["next"] == f"gpuflame report {out_path}"


def test_overflow_and_oom_are_warnings_on_stderr(capsys, snapshot_files: dict[str, Path], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, str(snapshot_files["handwritten_overflowed_trace"]), "-o", str(tmp_path / "a.pb.gz"))
    assert code == 0
    assert err.startswith("gpuflame convert: note: cuda:0: the allocator trace does not reach back")
    code, _, err = run_cli(capsys, str(snapshot_files["handwritten_oom"]), "-o", str(tmp_path / "b.pb.gz"))
    assert code == 0
    assert "gpuflame convert: note: cuda:0: out of memory" in err and "asked for 40.0 GiB" in err


def test_pprof_type_choice_becomes_the_default_view(capsys, small: Path, tmp_path: Path) -> None:
    out_path = tmp_path / "a.pb.gz"
    assert run_cli(capsys, str(small), "-o", str(out_path), "--type", "alloc_space")[0] == 0
    assert load(out_path).default_type == "alloc_space"


def test_every_fixture_converts_and_names_classes(capsys, snapshot_files: dict[str, Path], tmp_path: Path) -> None:
    for name, path in snapshot_files.items():
        out_path = tmp_path / f"{name}.pb.gz"
        code, _, err = run_cli(capsys, str(path), "-o", str(out_path))
        assert code == 0, (name, err)
        names = {f.name for f in load(out_path).frames}
        assert "Linear > __init__" in names and any(" > " in n for n in names), name


def test_gzip_snapshot_and_pprof_input(capsys, small: Path, tmp_path: Path) -> None:
    import gzip

    zipped = tmp_path / "snap.pickle.gz"
    zipped.write_bytes(gzip.compress(small.read_bytes()))
    assert run_cli(capsys, str(zipped), "-o", str(tmp_path / "a.pb.gz"))[0] == 0
    # and a pprof converted again, to folded
    assert run_cli(capsys, str(tmp_path / "a.pb.gz"), "-o", str(tmp_path / "a.folded"))[0] == 0
    assert (tmp_path / "a.folded").read_text()


def test_the_real_entry_point(small: Path, tmp_path: Path) -> None:
    done = run_process(str(small), "-o", str(tmp_path / "x.pb.gz"))
    assert done.returncode == 0, done.stderr
    assert "next: gpuflame report" in done.stdout


# -- failures: one line, exit 2, no traceback, nothing left behind -------------------------


def one_plain_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("gpuflame convert: error: ")
    return lines[0]


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])  # what pickle.dump writes (0 and 1 are not read as pickles)
def test_malicious_pickle_exits_2_with_one_line_and_runs_nothing(tmp_path: Path, protocol: int) -> None:
    sentinel = tmp_path / "PWNED"
    evil = tmp_path / "snapshot.pickle"
    evil.write_bytes(pickle.dumps({"segments": [], "device_traces": [[Attack(sentinel)]]}, protocol=protocol))
    out_path = tmp_path / "out.pb.gz"
    done = run_process(str(evil), "-o", str(out_path))
    assert done.returncode == 2
    line = one_plain_line(done.stderr)
    assert "refusing to load: the pickle asks to import" in line and "system" in line
    assert not sentinel.exists()
    assert not out_path.exists()
    assert done.stdout == ""


def test_malicious_pickle_in_process(capsys, tmp_path: Path) -> None:
    sentinel = tmp_path / "PWNED"
    evil = tmp_path / "s.pickle"
    evil.write_bytes(pickle.dumps(Attack(sentinel), protocol=4))
    code, out, err = run_cli(capsys, str(evil), "-o", str(tmp_path / "o.pb.gz"))
    assert code == 2 and out == ""
    one_plain_line(err)
    assert not sentinel.exists()


def leftovers(folder: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


def test_unwritable_output_leaves_no_partial_file(capsys, small: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir" / "o.pb.gz"
    code, _, err = run_cli(capsys, str(small), "-o", str(missing))
    assert code == 2
    assert "cannot write" in one_plain_line(err)
    assert not missing.parent.exists()
    if os.getuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        try:
            code, _, err = run_cli(capsys, str(small), "-o", str(locked / "o.pb.gz"))
            assert code == 2 and "cannot write" in one_plain_line(err)
            assert list(locked.iterdir()) == []
        finally:
            locked.chmod(0o700)
    # the output's name is taken by a folder: the temporary file must not stay behind
    taken = tmp_path / "taken.pb.gz"
    taken.mkdir()
    before = set(p.name for p in tmp_path.iterdir())
    code, _, err = run_cli(capsys, str(small), "-o", str(taken))
    assert code == 2
    one_plain_line(err)
    assert leftovers(tmp_path, before) == []


def test_failed_conversion_keeps_the_old_output(capsys, tmp_path: Path) -> None:
    out_path = tmp_path / "o.pb.gz"
    out_path.write_bytes(b"previous")
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(pickle.dumps({"segments": [{"total_size": "x", "blocks": []}]}))
    code, _, err = run_cli(capsys, str(bad), "-o", str(out_path))
    assert code == 2
    assert "not a valid PyTorch memory snapshot" in one_plain_line(err) or "not" in err
    assert out_path.read_bytes() == b"previous"
    assert leftovers(tmp_path, {"o.pb.gz", "bad.pickle"}) == []


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "no such file"),
        (b"", "empty"),
        (b"\x80\x04\x95\x10\x00", "truncated"),
        (b"\x1f\x8b\x08\x00broken", "gzip"),
    ],
)
def test_bad_inputs_exit_2_with_one_line(capsys, tmp_path: Path, content: bytes | None, expected: str) -> None:
    path = tmp_path / "input.pickle"
    if content is not None:
        path.write_bytes(content)
    out_path = tmp_path / "o.pb.gz"
    code, out, err = run_cli(capsys, str(path), "-o", str(out_path))
    assert code == 2 and out == ""
    assert expected in one_plain_line(err)
    assert not out_path.exists()


def test_truncated_snapshot_file(capsys, small: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(small.read_bytes()[:5000])
    code, _, err = run_cli(capsys, str(cut), "-o", str(tmp_path / "o.pb.gz"))
    assert code == 2
    assert "truncated" in one_plain_line(err)


def test_unknown_type_writes_nothing(capsys, small: Path, tmp_path: Path) -> None:
    out_path = tmp_path / "o.folded"
    code, _, err = run_cli(capsys, str(small), "-o", str(out_path), "--type", "bogus_space")
    assert code == 2
    assert "bogus_space" in one_plain_line(err)
    assert not out_path.exists()


def test_bad_flags_exit_2(small: Path, tmp_path: Path) -> None:
    done = run_process(str(small), "-o", str(tmp_path / "o"), "--format", "png")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    done = run_process(str(small))
    assert done.returncode == 2


def test_help_has_examples(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["convert", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "gpuflame convert snapshot.pickle -o memory.pb.gz" in out
    for fmt in FORMATS:
        assert fmt in out


def _summary_keys() -> set[str]:
    """convert's keys since it began, and export's (``bytes``, ``sample_type``): one summary now."""
    return {
        "input",
        "output",
        "format",
        "bytes_written",
        "bytes",
        "type",
        "sample_type",
        "default_type",
        "totals",
        "samples",
        "frames",
        "labels",
        "comments",
        "next",
    }


def test_json_summary_keys(capsys, small: Path, tmp_path: Path) -> None:
    code, out, _ = run_cli(capsys, str(small), "-o", str(tmp_path / "o.folded"), "--json")
    summary: dict[str, Any] = json.loads(out)
    assert code == 0 and set(summary) == _summary_keys()
    assert summary["type"] == "peak_space" and summary["format"] == "folded"


def test_type_aliases_work_as_in_export(capsys, small: Path, tmp_path: Path) -> None:
    """``--type peak`` was refused by convert ("no sample type 'peak'") while export took it."""
    for alias, full in (("peak", "peak_space"), ("inuse", "inuse_space"), ("alloc", "alloc_space")):
        out_path = tmp_path / f"{alias}.folded"
        code, out, err = run_cli(capsys, str(small), "-o", str(out_path), "--type", alias, "--json")
        assert code == 0, err
        assert json.loads(out)["type"] == full
        want = torch_snapshot.decode(small.read_bytes()).totals()[full]
        assert load(out_path).totals()[load(out_path).type_names()[0]] == want
    assert run_cli(capsys, str(small), "-o", str(tmp_path / "a.pb.gz"), "--type", "inuse")[0] == 0
    assert load(tmp_path / "a.pb.gz").default_type == "inuse_space"


def test_convert_is_export(capsys, small: Path, tmp_path: Path) -> None:
    """Same options, filters and bytes: ``convert`` is ``export`` under another name."""
    written = {}
    for command in ("convert", "export"):
        out_path = tmp_path / f"{command}.folded"
        code = main(
            [command, str(small), "-o", str(out_path), "--type", "inuse", "--no-cached", "--hide", "LlamaMLP > forward"]
        )
        _, err = capsys.readouterr()
        assert code == 0, err
        written[command] = out_path.read_text(encoding="utf-8")
    assert written["convert"] == written["export"]
    assert "<cached free blocks>" not in written["convert"] and "LlamaMLP > forward" not in written["convert"]
