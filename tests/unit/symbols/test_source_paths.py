"""Class names for snapshot frames whose source is on another machine (symbols/source_paths.py).

The snapshots are HAND-WRITTEN STAND-INS (tests/fixtures/make_snapshots.py)
with their paths moved to where a recording machine would have had them:
``/recording/home/proj/llama_like.py`` (not on this machine) and
``/opt/conda/lib/python3.11/site-packages/torch/...`` (the installed torch
here, at the same relative path).
"""

from __future__ import annotations

import copy
import inspect
from pathlib import Path
from typing import Any

import pytest

from gpuflame.cli.main import main
from gpuflame.formats import torch_snapshot
from gpuflame.symbols.qualnames import Resolver
from gpuflame.symbols.source_paths import SourceMap, parse_root
from tests.helpers.paths import DATA, FIXTURES

make_snapshots = pytest.importorskip("tests.fixtures.make_snapshots")  # needs torch (a test dependency)
torch = pytest.importorskip("torch")

ELSEWHERE = "/recording/home/proj"
CONDA = "/opt/conda/lib/python3.11/site-packages"


def moved(snap: dict[str, Any]) -> dict[str, Any]:
    """The snapshot as recorded on another machine: its paths under ELSEWHERE and CONDA."""
    out = copy.deepcopy(snap)
    torch_root = str(Path(torch.__file__).parent.parent)
    seen: set[int] = set()
    for frames in _frame_lists(out):
        for f in frames:
            if id(f) in seen:
                continue
            seen.add(id(f))
            if f["filename"].startswith(str(FIXTURES)):
                f["filename"] = ELSEWHERE + f["filename"][len(str(FIXTURES)) :]
            elif f["filename"].startswith(torch_root):
                f["filename"] = CONDA + f["filename"][len(torch_root) :]
    return out


def _frame_lists(snap: dict[str, Any]) -> list[list[dict[str, Any]]]:
    lists = [e.get("frames") or [] for t in snap["device_traces"] for e in t]
    return lists + [b.get("frames") or [] for s in snap["segments"] for b in s["blocks"]]


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    return moved(make_snapshots.build_all()["handwritten_small_trace"])


def names(profile) -> set[str]:
    return {f.name for f in profile.frames}


def test_without_the_source_names_lack_their_class_and_the_profile_says_how_many(recorded) -> None:
    profile = torch_snapshot.from_snapshot(recorded, resolver=Resolver(SourceMap(library_dirs=[])))
    assert "forward" in names(profile) and "LlamaMLP > forward" not in names(profile)
    (note,) = [c for c in profile.comments if "could not be qualified" in c]
    python = [f for f in profile.frames if f.kind == "python" and f.name != "<module>"]
    assert note.startswith(f"{len(python):,} of {len(python):,} Python frames")
    assert "--source-root" in note


def test_source_root_maps_the_recording_machines_paths(recorded) -> None:
    sources = SourceMap([(ELSEWHERE, str(FIXTURES))], library_dirs=[])
    profile = torch_snapshot.from_snapshot(recorded, resolver=Resolver(sources))
    assert {"LlamaMLP > forward", "GPUModelRunner > initialize_kv_cache"} <= names(profile)
    note = [c for c in profile.comments if "could not be qualified" in c]
    torch_frames = {f for f in profile.frames if f.file.startswith(CONDA)}
    assert note and note[0].startswith(f"{len(torch_frames):,} of")  # torch's own stay unqualified


def test_installed_packages_are_found_in_this_machines_site_packages(recorded) -> None:
    profile = torch_snapshot.from_snapshot(recorded, resolver=Resolver(SourceMap()))
    assert {"Linear > forward", "Module > _call_impl", "Linear > __init__"} <= names(profile)


def test_a_different_version_of_a_package_names_a_function_by_its_one_class(tmp_path: Path) -> None:
    """Lines moved between versions: a name one class defines keeps that class (one function, one name:
    not `Module > _apply` here and `_apply` there); a name several classes define is not guessed."""
    lib = tmp_path / "site-packages" / "pkg"
    lib.mkdir(parents=True)
    (lib / "mod.py").write_text(
        "class A:\n    def step(self):\n        pass\n\n\ndef other():\n    pass\n\n\n"
        "class B:\n    def run(self):\n        pass\n\n\nclass C:\n    def run(self):\n"
        "        pass\n"
    )
    resolver = Resolver(SourceMap(library_dirs=[str(tmp_path / "site-packages")]))
    recorded = "/venv/lib/python3.12/site-packages/pkg/mod.py"
    assert resolver.display(recorded, 3, "step") == "A > step"
    assert resolver.display(recorded, 7, "step") == "A > step"  # line 7 is in other() here: the name decides
    assert resolver.def_line(recorded, 7, "step") == 0  # where it starts in the recording's version is unknown
    assert resolver.display(recorded, 3, "run") == "run"  # B's or C's: not guessed
    assert (recorded, 3, "run") in resolver.unqualified and recorded in resolver.other_version


def test_stdlib_paths_are_mapped_too() -> None:
    import asyncio.events as events

    line = inspect.getsourcelines(events.Handle._run)[1] + 2
    recorded = "/root/miniconda3/envs/py3.10/lib/python3.10/asyncio/events.py"
    assert Resolver().display(recorded, line, "_run") == "Handle > _run"


@pytest.mark.parametrize("text", ["foo", "=x", "x=", ""])
def test_bad_source_root_is_a_plain_error(text: str) -> None:
    with pytest.raises(ValueError, match="OLD=NEW"):
        parse_root(text)


def test_convert_takes_source_root_and_native(recorded, tmp_path: Path, capsys) -> None:
    import pickle

    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(recorded))
    out = tmp_path / "out.folded"
    code = main(["convert", str(path), "-o", str(out), "--source-root", f"{ELSEWHERE}={FIXTURES}"])
    assert code == 0 and "LlamaMLP > forward" in out.read_text()
    native = make_snapshots.build_all()["handwritten_native_frames"]
    path.write_bytes(pickle.dumps(native))
    assert main(["convert", str(path), "-o", str(out)]) == 0
    plain = out.read_text()
    assert main(["convert", str(path), "-o", str(out), "--native"]) == 0
    assert "torch::autograd::THPVariable_zeros" in out.read_text() and "THPVariable" not in plain
    assert "aten::empty.memory_format" in plain
    with pytest.raises(SystemExit) as exit_:
        main(["convert", str(path), "-o", str(out), "--source-root", "nonsense"])
    assert exit_.value.code == 2
    assert "OLD=NEW" in capsys.readouterr().err


def test_paths_recorded_on_windows_are_mapped(tmp_path: Path) -> None:
    """A snapshot from Windows: backslashes, ``Lib\\site-packages``, a drive letter in --source-root."""
    lib = tmp_path / "site-packages" / "pkg"
    lib.mkdir(parents=True)
    (lib / "mod.py").write_text("class A:\n    def step(self):\n        pass\n")
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("class Trainer:\n    def fit(self):\n        pass\n")
    sources = SourceMap(
        [("C:\\research\\proj", str(tmp_path / "proj"))], library_dirs=[str(tmp_path / "site-packages")]
    )
    resolver = Resolver(sources)
    assert resolver.display("C:\\venv\\Lib\\site-packages\\pkg\\mod.py", 3, "step") == "A > step"
    assert resolver.display("C:\\research\\proj\\train.py", 3, "fit") == "Trainer > fit"


def test_a_real_windows_snapshot_gets_class_names_from_this_machines_torch() -> None:
    data = (DATA / "torch-snapshot-DeComFL-memory.pickle.gz").read_bytes()
    found = torch_snapshot.decode(data, resolver=Resolver(SourceMap()))
    alone = torch_snapshot.decode(data, resolver=Resolver(SourceMap(library_dirs=[])))
    qualified = {f.name for f in found.frames if " > " in f.name}
    assert qualified - {f.name for f in alone.frames}  # torch's own frames, found in site-packages here
    assert all(f.file.startswith("C:\\") for f in found.frames if f.kind == "python" and f.file)
    # torch here is another version than the recording's: its files are here, their lines are not the same
    assert any(
        c.startswith(f"{n} of ") and "another version of their file is here" in c
        for c in found.comments
        for n in range(1, 200)
    )
    # one function, one name: a name torch's file defines in one class is qualified at every line it ran
    # (transformers' modeling files define `forward` in many classes: those stay as they are)
    by_file: dict[tuple[str, str], set[str]] = {}
    for f in found.frames:
        if f.kind == "python" and "\\torch\\" in f.file:
            by_file.setdefault((f.file, f.name.rsplit(" > ", 1)[-1]), set()).add(f.name)
    assert not [names for names in by_file.values() if len(names) > 1 and any(" > " in n for n in names)]


def test_analysis_commands_read_snapshots_with_the_same_options(recorded, tmp_path: Path, capsys) -> None:
    """report/top/flame/explain/view/diff take --source-root and --native as convert does."""
    import pickle

    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(recorded))
    top = ["top", str(path), "--json", "-n", "50", "--type", "alloc", "--by", "total"]
    assert main(top) == 0
    plain = capsys.readouterr().out
    assert main([*top, "--source-root", f"{ELSEWHERE}={FIXTURES}"]) == 0
    mapped = capsys.readouterr().out
    assert "LlamaMLP > forward" in mapped and "LlamaMLP > forward" not in plain
    native = tmp_path / "native.pickle"
    native.write_bytes(pickle.dumps(make_snapshots.build_all()["handwritten_native_frames"]))
    assert main(["top", str(native), "--json", "-n", "50", "--by", "total", "--native"]) == 0
    assert "torch::autograd::THPVariable_zeros" in capsys.readouterr().out
    assert main(["view", str(native), "--native", "-o", str(tmp_path / "v.html")]) == 0
