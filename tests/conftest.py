"""Shared pytest fixtures. Each section belongs to one part of the code base."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
from pathlib import Path
from types import ModuleType

import pytest

from gpuflame.model import Profile
from tests.helpers.rich_profile import build_rich_profile

TESTS = Path(__file__).resolve().parent

# =============================================================================
# formats: pprof / folded / speedscope readers and writers
# =============================================================================


@pytest.fixture(scope="session")
def profile_pb2() -> ModuleType:
    """Google protobuf's classes for pprof's own profile.proto, as the package ships them generated.

    The reader parses through the same runtime, but with gpuflame's view of the
    message (``split_profile.proto``); these are pprof's messages, unchanged.
    """
    from gpuflame.formats.pprof_proto import profile_pb2 as module

    return module


@pytest.fixture(scope="session")
def push_pb2(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """Google protobuf classes for tests/proto/push.proto (Pyroscope's PushRequest)."""
    return compile_proto("push", tmp_path_factory)


def compile_proto(name: str, tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """Compile tests/proto/<name>.proto with grpc_tools' protoc and import it.

    If the generated code refuses the installed protobuf runtime (its version
    guard), the guard is removed: the tests only need the message classes.
    """
    pytest.importorskip("google.protobuf")
    pytest.importorskip("grpc_tools")
    out = tmp_path_factory.mktemp(f"{name}_pb2")
    proto = TESTS / "proto"
    from grpc_tools import protoc  # in this process: the fast lane starts no subprocess

    args = ["protoc", f"-I{proto}", f"--python_out={out}", str(proto / f"{name}.proto")]
    assert protoc.main(args) == 0, f"protoc failed on {name}.proto"
    path = out / f"{name}_pb2.py"
    try:
        return _import_file(f"gpuflame_test_{name}_pb2", path)
    except Exception as exc:  # google.protobuf.runtime_version.VersionError
        if "version" not in str(exc).lower():
            raise
        source = path.read_text()
        path.write_text(re.sub(r"_runtime_version\.ValidateProtobufRuntimeVersion\([^)]*\)", "", source))
        return _import_file(f"gpuflame_test_{name}_pb2_unchecked", path)


def _import_file(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def rich_profile() -> Profile:
    return build_rich_profile()


# =============================================================================
# the terminal: output is checked as a pipe gets it (132 columns), however pytest runs
# =============================================================================


def pytest_configure(config: pytest.Config) -> None:
    """Forget an inherited terminal size and an inherited ignored Ctrl-C.

    pytest-xdist's workers get COLUMNS=80, a shell may export one. A suite
    started in the background of a script (``make test &``, nohup) inherits
    SIGINT ignored, and so would every program the tests start: the Ctrl-C
    tests would then see a program that cannot be interrupted, as plain
    Python would not be either. A handler here is reset to the default in
    every child at exec.
    """
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# =============================================================================
# workers: `-n auto` starts half as many again as there are cores
# =============================================================================


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Cores x 1.5: about a sixth of the suite's time is spent waiting (on child processes,
    a browser, a server, the kernel's ring buffer), and a third worker fills it: on 2 cores
    the suite took 10:59 with 2 workers and 10:07 with 3 (CONTRIBUTING.md has the figures).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores * 3 // 2)


# =============================================================================
# lanes: each test is marked by the folder it lives in (see CONTRIBUTING.md)
# =============================================================================

LANES = ("unit", "e2e", "browser", "agent", "gpu", "deploy")


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark every test with its folder's lane, so `-m unit` or `-m "not browser"` selects by folder.

    Done as each test is collected, before any plugin's collection hook looks at the markers.
    """
    parts = Path(str(item.fspath)).resolve().relative_to(TESTS).parts
    if len(parts) > 1 and parts[0] in LANES:
        item.add_marker(getattr(pytest.mark, parts[0]))


# =============================================================================
# the end of a run: what was skipped, and the one command that enables it
# =============================================================================

INSTALL_TOOLS = TESTS.parent / ".ci" / "install-tools"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say which tests skipped, grouped by reason, and what `make tools` would install.

    A suite that skips quietly looks green while the agent or the browser went untested;
    the reasons and the missing tools (from the one script that installs them) are the
    last lines a reader sees.
    """
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons: dict[str, int] = {}
    for report in skipped:
        reason = skip_reason(report)
        reasons[reason] = reasons.get(reason, 0) + 1
    terminalreporter.section(f"{len(skipped)} skipped, by reason", sep="-")
    for reason, count in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        terminalreporter.write_line(f"{count:5d}  {reason}")
    for line in missing_tools():
        terminalreporter.write_line(line)


def skip_reason(report: pytest.TestReport) -> str:
    """The reason pytest gives for a skip, without its 'Skipped: ' prefix and location."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def missing_tools() -> list[str]:
    """The install script's own list of what is missing here (it installs nothing with --check)."""
    import subprocess

    try:
        done = subprocess.run(
            ["sh", str(INSTALL_TOOLS), "--check"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return done.stdout.splitlines()
