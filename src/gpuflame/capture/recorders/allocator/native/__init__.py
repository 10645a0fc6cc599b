"""Native helpers, compiled on first use against the torch and Python of the workload.

A C++ extension that talks to PyTorch's allocator must match the exact
torch it runs in (C++ ABI, c10's headers), and every user has a different
torch. So instead of shipping binaries, gpuflame ships the source and
compiles it once per (source, torch, Python) on the user's machine, as
``torch.utils.cpp_extension`` does for JIT extensions, but with only c10's
headers and without pybind11 or ninja: a build takes about two seconds.

The result is cached under ``$GPUFLAME_CACHE_DIR`` (default
``~/.cache/gpuflame``); concurrent builds (parallel child processes) each
compile to a private file and rename it into place.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

from gpuflame.defaults import cache_dir as cache_dir  # where compiled helpers are kept between runs

HERE = Path(__file__).resolve().parent
BUILD_TIMEOUT = 300.0  # seconds; a cold compiler on a busy machine


class NativeUnavailable(Exception):
    """The native helper cannot be built or loaded here; the message says why in plain words."""


CPU_HOOK = "gpuflame_cpu_hook"  # the extension module's name (cpu_hook.cpp's PyInit_)


def load_cpu_hook() -> ModuleType:
    """The CPU allocator hook for the torch already imported in this process (built if needed)."""
    loaded = sys.modules.get(CPU_HOOK)
    if loaded is not None:  # loaded already (a host starts a recording per test): no flags to work out
        return loaded
    torch = sys.modules.get("torch")
    if torch is None:
        raise NativeUnavailable("torch is not imported")
    return _load(CPU_HOOK, HERE / "cpu_hook.cpp", _torch_flags(torch), key=str(torch.__version__))


def _load(name: str, source: Path, flags: list[str], key: str) -> ModuleType:
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    path = _built(name, source, flags, key)
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    if spec is None:
        raise NativeUnavailable(f"cannot load {path}")
    try:
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except ImportError as exc:
        raise NativeUnavailable(f"cannot load {path}: {exc}") from None
    sys.modules[name] = module
    return module


def _built(name: str, source: Path, flags: list[str], key: str) -> Path:
    """The compiled extension, from the cache or compiled now."""
    compiler = _compiler()
    text = source.read_bytes()
    material = [text, compiler.encode(), key.encode(), sys.version.encode(), *(f.encode() for f in flags)]
    digest = hashlib.sha256(b"\0".join(material)).hexdigest()[:16]
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    folder = cache_dir() / "native"
    target = folder / f"{name}-{digest}{suffix}"
    if target.exists():
        return target
    include = sysconfig.get_paths().get("include", "")
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise NativeUnavailable(f"Python's C headers are missing ({include}/Python.h; on Debian: python3-dev)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise NativeUnavailable(f"cannot create the cache folder {folder} ({exc.strerror})") from None
    print(f"gpuflame: compiling {source.name} for this torch (once, a few seconds)", file=sys.stderr, flush=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=suffix, dir=folder)
    os.close(fd)
    command = [
        *shlex.split(compiler),
        "-O2",
        "-std=c++17",
        "-shared",
        "-fPIC",
        "-fvisibility=hidden",
        f"-I{include}",
        str(source),
        "-o",
        tmp,
        *flags,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False)
        if done.returncode != 0:
            first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:300])
            raise NativeUnavailable(
                f"compiling {source.name} with {compiler} failed: {first or f'exit code {done.returncode}'}"
            )
        os.replace(tmp, target)
    except subprocess.TimeoutExpired:
        raise NativeUnavailable(f"compiling {source.name} took more than {BUILD_TIMEOUT:.0f} s") from None
    except OSError as exc:
        raise NativeUnavailable(f"compiling {source.name} failed ({exc})") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _compiler() -> str:
    """$CXX, else the first C++ compiler on PATH."""
    cxx = os.environ.get("CXX")
    if cxx:
        return cxx
    for candidate in ("c++", "g++", "clang++"):
        if shutil.which(candidate):
            return candidate
    raise NativeUnavailable("no C++ compiler found (install g++, or set CXX)")


def _torch_flags(torch: ModuleType) -> list[str]:
    """Compile and link flags that match the running torch."""
    if torch.__file__ is None:  # a namespace package: no install folder to compile against
        raise NativeUnavailable("torch has no install folder (torch.__file__ is None)")
    root = Path(torch.__file__).resolve().parent
    include, lib = root / "include", root / "lib"
    if not (include / "c10" / "core" / "Allocator.h").exists():
        raise NativeUnavailable(f"this torch has no C++ headers ({include})")
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    flags = [f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{include}", f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}"]
    if sys.platform == "darwin":
        flags += ["-undefined", "dynamic_lookup"]
    return flags
