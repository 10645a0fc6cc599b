"""The rule ARCHITECTURE.md states for the in-process side: it imports only the standard library.

The profiler runs inside the user's program (and, on Kubernetes, from a
payload copied into the pod without gpuflame's dependencies), so recording
and writing a profile must not import numpy or rich. Each check runs in a
fresh interpreter, where ``sys.modules`` shows exactly what was imported.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.blocking import BLOCK
from tests.helpers.paths import SRC

LAUNCHER_ONLY = ("numpy", "rich", "google")  # google: the protobuf runtime, the pprof reader's
# what recording needs not: the readers of saved files (the snapshot reader compiles a large
# regular expression and parses source files); a recording start pays for every import
READERS_ONLY = ("gpuflame.formats.safe_pickle", "gpuflame.formats.torch_snapshot", "gpuflame.symbols.qualnames")

PLAIN = """
import json, sys
import gpuflame
gpuflame.start(sys.argv[1], backend="jax")
gpuflame.stop()
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {names!r})))
"""


# each backend and hook, recorded with numpy and rich blocked (torch-cuda needs CUDA: tests/gpu/)
RECORD = """
import json, sys, threading, http.server
import torch
try:
    import jax, jax.numpy
except ImportError:
    jax = None
{block}
import gpuflame
out, how = sys.argv[1], sys.argv[2]
pushes = []


class Ingest(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        pushes.append(len(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


if how in ("allocator", "dispatch"):
    with gpuflame.profile(out, backend="torch", torch_hook=how):
        kept = torch.zeros(1 << 16)
elif how == "jax":
    with gpuflame.profile(out, backend="jax"):
        kept = jax.numpy.zeros(1 << 16).block_until_ready()
else:  # continuous push to a loopback Pyroscope
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ingest)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with gpuflame.profile(out, backend="torch", pyroscope=f"http://127.0.0.1:{{server.server_address[1]}}"):
        kept = torch.zeros(1 << 16)
print(json.dumps({{"attempts": attempts, "rich": sorted(m for m in sys.modules if m.split(".")[0] == "rich"),
                  "pushes": len(pushes), "readers": sorted(m for m in sys.modules if m in {readers!r})}}))
"""


def fresh_python(code: str, *args: str, timeout: int = 120) -> tuple[subprocess.CompletedProcess[str], Any]:
    """Run *code* in a fresh interpreter, which must succeed; (the process, its last line of output as JSON)."""
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(proc.stdout.splitlines()[-1])


def run_fresh(code: str, out: Path) -> list[str]:
    return fresh_python(code.format(names=set(LAUNCHER_ONLY)), str(out))[1]


@pytest.mark.subprocess
def test_start_stop_imports_no_launcher_dependency(tmp_path):
    assert run_fresh(PLAIN, tmp_path / "p.pb.gz") == []


@pytest.mark.subprocess
@pytest.mark.parametrize("how", ["allocator", "dispatch", "jax", "push"])
def test_every_backend_and_hook_records_with_numpy_and_rich_blocked(tmp_path, how):
    """elf_symbols.py imported numpy at its top: in a pod without numpy the torch backend recorded nothing.

    The torch hooks' recordings also import none of READERS_ONLY (checked here, in the same fresh
    interpreter: the block saw no import of numpy, so recording took the path it takes without it).
    """
    pytest.importorskip("torch")
    if how == "jax":
        pytest.importorskip("jax")
    out = tmp_path / "t.pb.gz"
    code = RECORD.format(block=BLOCK, readers=set(READERS_ONLY))
    proc, seen = fresh_python(code, str(out), how, timeout=240)
    assert seen["attempts"] == [] and seen["rich"] == [], proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.startswith("gpuflame:")]
    assert all("pyroscope push" in line and "failed 0" in line for line in said), proc.stderr  # nothing lost
    from gpuflame.formats import load

    assert max(load(str(out)).totals().values()) >= 1 << 16  # the block's allocation was recorded
    assert seen["pushes"] >= (1 if how == "push" else 0)
    if how in ("allocator", "dispatch"):
        assert seen["readers"] == [], "recording a torch profile imported a reader of saved files"


@pytest.mark.subprocess
def test_the_block_refuses_numpy_to_gpuflame_even_when_loaded():
    code = (
        BLOCK + "\nimport numpy\nns = {'__name__': 'gpuflame.capture.x'}\ntry:\n    exec('import numpy', ns)\n"
        "except ImportError:\n    print('refused')\n"
    )
    pytest.importorskip("numpy")
    code = "import numpy\n" + code
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["refused"], proc.stderr


@pytest.mark.subprocess
def test_gpuflame_run_imports_only_its_own_command_and_no_analysis(tmp_path):
    """The launcher's imports are CPU time of every profiled run: no other command, no numpy, no reader."""
    code = (
        "import json, sys\nfrom gpuflame.cli.main import main\n"
        "rc = main(['run', '-o', sys.argv[1], '--', sys.executable, '-c', 'pass'])\n"
        "print(json.dumps([rc, sorted(m for m in sys.modules if m.startswith(('gpuflame.cli.', 'numpy', "
        "'rich', 'gpuflame.analysis', 'gpuflame.formats.torch_snapshot')))]))"
    )
    proc, (rc, imported) = fresh_python(code, str(tmp_path / "run.pb.gz"))
    assert rc == 0, proc.stderr
    assert imported == ["gpuflame.cli.main", "gpuflame.cli.options", "gpuflame.cli.run"]


@pytest.mark.subprocess
def test_gpuflame_version_imports_no_command():
    """``gpuflame --version`` answered after importing every command: 0.7 s of CPU for one line."""
    code = (
        "import json, sys\nfrom gpuflame.cli.main import main\ntry:\n    main(['--version'])\n"
        "except SystemExit as done:\n    code = done.code\n"
        "print(json.dumps([code, sorted(m for m in sys.modules if m.startswith(('gpuflame.cli.', 'numpy', 'rich')))]))"
    )
    proc, (exit_code, imported) = fresh_python(code)
    assert proc.stdout.splitlines()[0].startswith("gpuflame ")
    assert exit_code == 0 and imported == ["gpuflame.cli.main"]


@pytest.mark.subprocess
def test_the_dispatch_recorder_imports_torch_only_when_it_starts():
    """capture/recorders/dispatch/mode.py subclasses torch's dispatch mode at its top: the package imports it late."""
    code = (
        "import json, sys\nfrom gpuflame.capture.recorders.dispatch import TorchTensorRecorder\n"
        "TorchTensorRecorder()\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'torch' or m.endswith('dispatch.mode'))))"
    )
    assert fresh_python(code)[1] == []


# -- import direction: read from the source, so a late import inside a function counts too --------

PACKAGE = SRC / "gpuflame"


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


# The layers of ARCHITECTURE.md, lowest first: every package and loose module of src/gpuflame has
# one, and imports only what lies below it (its floor). Same-layer units never import each other.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "defaults", "gcpause", "malloc_reuse", "printable", "symbols", "version"),  # import nothing of gpuflame
    ("files", "limits", "units"),  # standard-library helpers both sides use
    ("boundary",),  # the process boundary: the launcher and the profiled process both import it
    ("model",),
    ("formats",),
    ("analysis", "simulate", "ship"),  # simulate/ replays a history through the allocator model: data, never text
    ("capture", "launch", "render", "pipeline"),  # in-process side; launcher; text and pictures; reading a profile
    ("api", "agent"),
    ("hosted",),
    ("notebook", "pytest_plugin", "serve", "webhook"),
    ("cli",),
    ("__init__", "__main__"),  # the package's public names; python -m gpuflame
    ("inject",),  # the webhook's payload copies the whole package
]
# the in-process side (ARCHITECTURE.md): what a profiled process may reach, at most
IN_PROCESS = {
    "errors",
    "defaults",
    "gcpause",
    "printable",
    "symbols",
    "version",
    "files",
    "limits",
    "units",
    "boundary",
    "model",
    "formats",
    "ship",
    "capture",
}


def unit_of(module: str) -> str | None:
    """The package or loose module *module* belongs to (``gpuflame.capture.session`` -> ``capture``)."""
    parts = module.split(".")
    if parts[0] != "gpuflame":
        return None
    if len(parts) == 1:
        return "__init__"
    return parts[1] if (PACKAGE / parts[1]).is_dir() or (PACKAGE / f"{parts[1]}.py").is_file() else "__init__"


def all_units() -> set[str]:
    found = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    return found | {p.stem for p in PACKAGE.glob("*.py")}


@functools.cache
def unit_imports() -> dict[str, dict[str, set[str]]]:
    """unit -> the units it imports -> the files that do (``from gpuflame import x`` counts as x's).

    Parsed once per worker (every layer's test reads it; callers never change it).
    """
    graph: dict[str, dict[str, set[str]]] = {unit: {} for unit in all_units()}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        source = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        for name in imports_of(path) - {"gpuflame"} | ({"gpuflame"} & plain_imports(path)):
            target = unit_of(name)
            if target is not None and target != source:
                graph[source].setdefault(target, set()).add(str(rel))
    return graph


def plain_imports(path: Path) -> set[str]:
    """``import gpuflame`` itself (the payload reads the package's folder from it)."""
    import ast

    return {
        a.name
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Import)
        for a in node.names
        if a.name == "gpuflame"
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan), each sorted: every import loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_package_and_loose_module_has_a_layer():
    placed = [unit for layer in LAYERS for unit in layer]
    assert sorted(placed) == sorted(set(placed)), "a unit placed twice"
    assert set(placed) == all_units()


@pytest.mark.slow
@pytest.mark.parametrize("layer", range(len(LAYERS)))
def test_each_layer_imports_only_its_floor(layer):
    """formats/ once imported render/ to write SVG; capture/ and launch/ once imported each other (boundary/ now)."""
    floor = {unit for lower in LAYERS[:layer] for unit in lower}
    graph = unit_imports()
    above = {
        (unit, target, ", ".join(sorted(files)))
        for unit in LAYERS[layer]
        for target, files in graph[unit].items()
        if target not in floor
    }
    assert above == set()


@pytest.mark.slow
def test_no_import_loop_between_packages():
    assert cycles({unit: set(targets) for unit, targets in unit_imports().items()}) == []


def test_the_loop_finder_finds_loops():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# -- no circle between modules either: each split of a package is drawn lower to higher -----------


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module under *root* (the folder of *package*)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def module_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules it imports, type-only and late imports included.

    ``from pkg import name`` counts as an import of the module that defines *name*: the submodule
    ``pkg.name``, else the module ``pkg/__init__.py`` takes it from, else ``pkg`` itself.
    """
    import ast

    modules = module_names(root, package)
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in modules.items()}

    def defining(module: str, name: str, seen: frozenset[str] = frozenset()) -> str:
        if f"{module}.{name}" in modules:
            return f"{module}.{name}"
        if module in seen or not modules.get(module, Path()).name == "__init__.py":
            return module
        for node in ast.walk(trees[module]):
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                if any((a.asname or a.name) == name for a in node.names):
                    original = next(a.name for a in node.names if (a.asname or a.name) == name)
                    return defining(node.module, original, seen | {module})
        return module

    graph: dict[str, set[str]] = {}
    for name, tree in trees.items():
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                targets.update(defining(node.module, a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package + "."):
                targets.add(node.module.rsplit(".", 1)[0])  # a name of a module not found: its package
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name in modules)
        graph[name] = targets - {name}
    return graph


@pytest.mark.slow
def test_no_import_circle_between_modules():
    """Six circles inside packages once (pprof's five modules, the snapshot converter's private class,
    session <-> exit_hooks, the recorders and their categories, the model's profile, columns and
    history, qualnames <-> index_cache): a split is drawn along a concept, lower to higher."""
    assert cycles(module_graph(PACKAGE, "gpuflame")) == []


def test_the_module_circle_finder_sees_type_only_late_and_re_exported_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.sub import C\n")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.c import C\n")
    (pkg / "sub" / "c.py").write_text("import pkg.a\n")
    graph = module_graph(pkg, "pkg")
    assert graph["pkg.b"] == {"pkg.sub.c"}, "a re-exported name counts as its defining module"
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    (pkg / "a.py").write_text("")
    assert cycles(module_graph(pkg, "pkg")) == []


@pytest.mark.slow
def test_the_in_process_side_reaches_only_its_own_units():
    """What ``capture/`` imports, directly or through others, stays inside the in-process side."""
    graph = unit_imports()
    reached, todo = set(), ["capture", "boundary"]
    while todo:
        unit = todo.pop()
        if unit not in reached:
            reached.add(unit)
            todo.extend(graph[unit])
    assert reached <= IN_PROCESS, sorted(reached - IN_PROCESS)


def test_the_books_never_import_the_recorders():
    """capture/'s wings: recorders/ keep their rows with books/ (phases, categories, joint peak, site row)."""
    upward = {
        (module, name)
        for module, names in package_imports("capture/books").items()
        for name in names
        if name.startswith("gpuflame.capture.recorders")
    }
    assert upward == set()


def test_capture_never_imports_the_simulation():
    """simulate/ is a stage of its own (ARCHITECTURE.md): the in-process side never reaches it."""
    found = {
        (module, name)
        for module, names in package_imports("capture").items()
        for name in names
        if name.startswith("gpuflame.simulate")
    }
    assert found == set()


# -- a backend is one module and one registry line ---------------------------------------------------

REGISTRY_FILE = PACKAGE / "boundary" / "backends.py"


def backend_literals(path: Path, names: tuple[str, ...]) -> list[str]:
    """The string literals of *path* that write a backend's name or list the backends (docstrings aside).

    A literal equal to a name counts unless it is a module name (``sys.modules.get("torch")``);
    a literal lists them when it joins two names (``torch or jax``) or names them all.
    """
    import ast
    import re

    alt = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    joined = re.compile(rf"(?<![\w/.-])({alt})\s*(,|\||\bor\b|\band\b)\s*({alt})(?![\w/-])")
    words = [re.compile(rf"(?<![\w/.-]){re.escape(n)}(?![\w/-])") for n in names]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    module_names = {
        id(node.args[0])
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and node.args and ast.unparse(node.func) == "sys.modules.get"
    }
    module_names |= {
        id(node.slice)
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "sys.modules"
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in docstrings:
            continue
        text = node.value
        named = text in names and id(node) not in module_names
        if named or joined.search(text) or all(w.search(text) for w in words):
            where = path.relative_to(PACKAGE) if path.is_relative_to(PACKAGE) else path.name
            found.append(f"{where}:{node.lineno}: {text[:60]!r}")
    return sorted(found)


@pytest.mark.slow
def test_backend_names_are_written_only_in_the_registry():
    """cli/run.py, pytest_plugin/record.py and model/prune.py once wrote them (adding a backend touched 4-6 files)."""
    from gpuflame.boundary.backends import REGISTRY

    names = tuple(REGISTRY)
    found = [
        hit for path in sorted(PACKAGE.rglob("*.py")) if path != REGISTRY_FILE for hit in backend_literals(path, names)
    ]
    assert found == []


def test_the_backend_name_check_sees_each_way_of_writing_them(tmp_path):
    module = tmp_path / "probe.py"
    module.write_text(
        '"""Docstrings may say torch-cuda, torch or jax."""\nimport sys\nsys.modules.get("torch")\n'
        'HELP = "auto (default), torch-cuda, torch or jax"\nWANTED = {"jax": 1}\n'
        'DESC = "torch-cuda (history), torch (any device), jax (buffers)"\n'
    )
    found = backend_literals(module, ("torch-cuda", "torch", "jax"))
    assert [hit.split(":")[1] for hit in found] == ["4", "5", "6"]
