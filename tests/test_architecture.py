"""The rule ARCHITECTURE.md states for the in-process side: it imports only the standard library.

The profiler runs inside the user's program (and, on Kubernetes, from a
payload copied into the pod without gpuflame's dependencies), so recording
and writing a profile must not import numpy or rich. Each check runs in a
fresh interpreter, where ``sys.modules`` shows exactly what was imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

LAUNCHER_ONLY = ("numpy", "rich")

PLAIN = """
import json, sys
import gpuflame
gpuflame.start(sys.argv[1], backend="jax")
gpuflame.stop()
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {names!r})))
"""

TORCH = """
import json, sys
before = set(sys.modules)
import torch
imported_by_torch = set(sys.modules) - before
import gpuflame
with gpuflame.profile(sys.argv[1], backend="torch"):
    kept = torch.zeros(1 << 16)
ours = sorted(m for m in set(sys.modules) - before - imported_by_torch if m.split(".")[0] in {names!r})
print(json.dumps(ours))
"""


def run_fresh(code: str, out: Path) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", code.format(names=set(LAUNCHER_ONLY)), str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_start_stop_imports_no_launcher_dependency(tmp_path):
    assert run_fresh(PLAIN, tmp_path / "p.pb.gz") == []


def test_recording_and_writing_a_torch_profile_imports_no_launcher_dependency(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "t.pb.gz"
    assert run_fresh(TORCH, out) == []
    assert out.stat().st_size > 0  # a profile was written, so the writer's imports were counted


# what recording needs not: the readers of saved files (the snapshot reader compiles a large
# regular expression and parses source files); a recording start pays for every import
READERS_ONLY = ("gpuflame.formats.safe_pickle", "gpuflame.formats.torch_snapshot", "gpuflame.symbols.qualnames")


@pytest.mark.parametrize("hook", ["allocator", "dispatch"])
def test_recording_a_torch_profile_imports_no_snapshot_reader(tmp_path, hook):
    pytest.importorskip("torch")
    code = TORCH.replace('backend="torch"', f'backend="torch", torch_hook="{hook}"')
    code = code.replace("m.split(\".\")[0] in {names!r}", "m in {names!r}")
    proc = subprocess.run([sys.executable, "-c", code.format(names=set(READERS_ONLY)), str(tmp_path / "t.pb.gz")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == []


def test_gpuflame_run_imports_only_its_own_command_and_no_analysis(tmp_path):
    """The launcher's imports are CPU time of every profiled run: no other command, no numpy, no reader."""
    code = ("import json, sys\nfrom gpuflame.cli.main import main\n"
            "rc = main(['run', '-o', sys.argv[1], '--', sys.executable, '-c', 'pass'])\n"
            "print(json.dumps([rc, sorted(m for m in sys.modules if m.startswith(('gpuflame.cli.', 'numpy', "
            "'rich', 'gpuflame.analysis', 'gpuflame.formats.torch_snapshot')))]))")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run.pb.gz")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rc, imported = json.loads(proc.stdout.splitlines()[-1])
    assert rc == 0, proc.stderr
    assert imported == ["gpuflame.cli.main", "gpuflame.cli.options", "gpuflame.cli.run"]


def test_the_dispatch_recorder_imports_torch_only_when_it_starts():
    """capture/recorders/dispatch/mode.py subclasses torch's dispatch mode at its top: the package imports it late."""
    code = ("import json, sys\nfrom gpuflame.capture.recorders.dispatch import TorchTensorRecorder\n"
            "TorchTensorRecorder()\n"
            "print(json.dumps(sorted(m for m in sys.modules if m == 'torch' or m.endswith('torch_tensors.mode'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


# -- import direction: read from the source, so a late import inside a function counts too --------

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "gpuflame"


def imports_of(path: Path) -> set[str]:
    """Every ``gpuflame.*`` module *path* imports, at the top or inside a function."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpuflame"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("gpuflame"))
    return found


def package_imports(package: str) -> dict[str, set[str]]:
    return {str(p.relative_to(PACKAGE)): imports_of(p) for p in sorted((PACKAGE / package).rglob("*.py"))}


def test_imports_of_sees_late_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from gpuflame.render import svg\n    import gpuflame.cli.main\n")
    assert {"gpuflame.render", "gpuflame.render.svg", "gpuflame.cli.main"} <= imports_of(module)


def test_commands_share_helpers_only_through_the_shared_modules():
    """A command module imports no other command (cli/webhook.py once took its port type from cli/serve.py)."""
    from gpuflame.cli.main import COMMANDS

    commands = {f"gpuflame.cli.{name}" for name in COMMANDS}
    crossing = {(module, name) for module, names in package_imports("cli").items() for name in names & commands}
    assert crossing == {("cli/convert.py", "gpuflame.cli.export")}  # convert is export's other name


def test_every_command_module_declares_the_command_protocol():
    from gpuflame.cli.main import COMMAND_ATTRIBUTES, COMMANDS, command_module

    for name in COMMANDS:
        module = command_module(name)
        assert isinstance(module.HELP, str) and module.HELP and isinstance(module.DESCRIPTION, str), name
        assert callable(module.add_arguments) and callable(module.run), name
    with pytest.raises(TypeError, match="not a command: it lacks"):
        command_module("common")
    assert COMMAND_ATTRIBUTES == ("HELP", "DESCRIPTION", "EPILOG", "add_arguments", "run")


# The layers of ARCHITECTURE.md, lowest first: a module never imports a package of a higher layer.
LAYERS = [
    ("symbols",),  # frame names and kinds: the model names its frames with them (once a cycle)
    ("model",),
    ("formats",),
    ("analysis", "simulate"),  # simulate/ replays a history through the allocator model: data, never text
    ("render",),
    ("cli", "serve", "webhook", "notebook", "pytest_plugin"),
]


def higher_than(layer: int) -> tuple[str, ...]:
    return tuple(f"gpuflame.{p}" for packages in LAYERS[layer + 1:] for p in packages)


@pytest.mark.parametrize("layer", range(len(LAYERS) - 1))
def test_layers_point_one_way(layer):
    """formats/ once imported render/ to write SVG and the JSON flame tree; render/writers.py owns them now."""
    upward = {
        (module, name)
        for package in LAYERS[layer]
        for module, names in package_imports(package).items()
        for name in names
        if name.startswith(higher_than(layer))
    }
    assert upward == set()


def test_capture_never_imports_the_simulation():
    """simulate/ is a stage of its own (ARCHITECTURE.md): the in-process side never reaches it."""
    found = {(module, name) for module, names in package_imports("capture").items()
             for name in names if name.startswith("gpuflame.simulate")}
    assert found == set()
