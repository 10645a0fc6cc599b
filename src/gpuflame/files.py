"""Reading inputs with plain-worded errors and writing outputs atomically.

A profile that fails half way must never leave a half-written file where the
user expects a good one, so every output goes to a temporary file in the same
folder and is renamed into place only when complete.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO, Protocol

from gpuflame.errors import GpuflameError

# The path that means standard input (for a profile read) or output (for one written).
STDIO = "-"
# standard input is read in steps of this many bytes
READ_STEP = 16 << 20


class Bound(Protocol):
    """A bound on the bytes read (``gpuflame.limits.INFLATED_BYTES``: limits lies beside files, not below)."""

    def value(self) -> int: ...

    def exceeded(self, what: str, limit: int | None = None) -> GpuflameError: ...


def read_bytes(path: str | os.PathLike[str], bound: Bound | None = None) -> bytes:
    """Read a whole input file (``-``: standard input), turning OS errors into one readable line.

    Only a regular file is read (:func:`open_regular`): a FIFO would block
    forever and ``/dev/zero`` never ends. Standard input and a file stop at
    *bound* (a profile: :data:`gpuflame.limits.INFLATED_BYTES`, the most any
    profile inflates to; ``cat /dev/zero | gpuflame report -`` read until
    memory ran out). A file too large for this machine's memory is a
    :class:`GpuflameError` too, not a crash.
    """
    cap = bound.value() if bound else sys.maxsize
    if os.fspath(path) == STDIO:
        if sys.stdin is None or sys.stdin.isatty():
            raise GpuflameError("-: standard input is a terminal; pipe a profile in (... | gpuflame report -)")
        return _read_at_most(sys.stdin.buffer, bound, cap)
    with open_regular(path) as f:
        try:
            if bound and os.fstat(f.fileno()).st_size > cap:  # refused before reading, else read at once
                raise bound.exceeded(str(path), cap)
            return f.read()
        except MemoryError:
            raise GpuflameError(f"{path}: too large to read into this machine's memory") from None
        except OSError as exc:
            raise GpuflameError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _read_at_most(stream: BinaryIO, bound: Bound | None, cap: int) -> bytes:
    """A pipe to its end, in steps (``read(cap)`` would ask for all of *cap* at once), refused past *cap* bytes."""
    chunks: list[bytes] = []
    size = 0
    while chunk := stream.read(min(READ_STEP, cap + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if bound and size > cap:
            raise bound.exceeded("standard input", cap)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def open_regular(path: str | os.PathLike[str], what: str = "profile file") -> BinaryIO:
    """*path* opened for reading when it is a regular file; anything else is one line (naming *what* it should be).

    Opened without blocking (a FIFO with no writer would hang ``open``), then
    checked on the descriptor itself (``fstat``), so a name swapped after a
    check is still refused: a FIFO, a device (``/dev/zero``), a socket or a
    folder is never read as a profile.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise GpuflameError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise GpuflameError(f"{p}: is a directory, not a {what}") from None
    except PermissionError:
        raise GpuflameError(f"{p}: permission denied") from None
    except OSError as exc:
        raise GpuflameError(f"{p}: cannot read ({exc.strerror or exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise GpuflameError(f"{p}: is a directory, not a {what}")
        if not stat.S_ISREG(mode):
            hint = " (for a pipe, give '-' and pipe the profile into standard input)" if what == "profile file" else ""
            raise GpuflameError(f"{p}: is a device, a pipe or a socket, not a file; only regular files are read{hint}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def atomic_write(path: str | os.PathLike[str], data: bytes | str, mode: int | None = None) -> None:
    """Write *data* to *path* so that readers see the old file or the new one.

    The file gets the permissions ``open`` would give it (0666 less the
    umask), or exactly *mode* (the node agent's 0600), never wider meanwhile.
    """
    p = Path(path)
    _refuse_special(p)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    folder = p.parent if str(p.parent) else Path(".")
    try:
        fd, tmp = _create_temporary(folder, p.name, 0o666 if mode is None else mode & 0o600)
    except FileNotFoundError:
        raise GpuflameError(f"{p}: cannot write (folder {folder} does not exist)") from None
    except PermissionError:
        raise GpuflameError(f"{p}: cannot write (permission denied in {folder})") from None
    except OSError as exc:
        raise GpuflameError(f"{p}: cannot write ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
            if mode is not None:
                os.fchmod(out.fileno(), mode)
        os.replace(tmp, p)
    except OSError as exc:
        _remove_quietly(tmp)
        raise GpuflameError(f"{p}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        _remove_quietly(tmp)
        raise


def _refuse_special(p: Path) -> None:
    """A device, pipe or socket is never an output: the rename would put a file in its place (``/dev/null``)."""
    try:
        st = p.stat()
    except OSError:
        return  # nothing there (or unreadable): the write says what goes wrong
    if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        raise GpuflameError(
            f"{p}: is a device, a pipe or a socket, not a file; refusing to put a file in its place "
            "(give a file name; '-' writes to standard output where the command offers it)"
        )


def _create_temporary(folder: Path, name: str, mode: int) -> tuple[int, str]:
    """A new file ``.NAME.RANDOM.tmp`` in *folder*, created with *mode* (the kernel applies the umask)."""
    for _ in range(100):
        tmp = os.path.join(folder, f".{name}.{os.urandom(4).hex()}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {folder}")


def write_output(path: str | os.PathLike[str], data: bytes | str) -> None:
    """:func:`atomic_write`, or standard output for ``-``."""
    if os.fspath(path) != STDIO:
        atomic_write(path, data)
        return
    payload = data.encode("utf-8") if isinstance(data, str) else data
    sys.stdout.flush()
    sys.stdout.buffer.write(payload)
    sys.stdout.buffer.flush()


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# -- where an output may go ---------------------------------------------------

# Bytes read from an existing file to tell whether gpuflame wrote it.
_SNIFF_BYTES = 65536

# What the start of each kind of file gpuflame writes looks like (besides
# gzip pprof, recognised by its structure, and folded stacks, by their first line).
_FOLDED_HEADER = "# gpuflame folded stacks: "  # formats/folded.py's HEADER
_OWN_TEXT_MARKS = (
    "<!-- gpuflame viewer:",  # view: the HTML page
    "<!-- gpuflame flame graph",  # export/flame/view --svg: the SVG picture
    '"format": "gpuflame-flame-tree"',  # export --format json
    '"exporter":"gpuflame ',  # export --format speedscope (every speedscope file names the schema: py-spy's too)
)


def check_output(
    path: str | os.PathLike[str],
    inputs: Iterable[str | os.PathLike[str]] = (),
    force: bool = False,
    make_folders: bool = False,
    force_hint: str = "--force replaces it",
    writes: str | None = None,
) -> None:
    """Refuse an output path that would destroy something, before any work is done.

    An output may replace an empty file or a file gpuflame wrote (a profile,
    a page, a picture) — that is how a run is redone — but never one of the
    command's inputs (the profiled script, the profile being read), never a
    directory, and never any other file unless *force*. A recorded profile is
    replaced only by a profile: *writes* names what a command writes when it
    is something else (``an HTML page``), and such an output leaves a gzip
    pprof alone unless *force* (``view a.pb.gz -o b.pb.gz`` meant as a diff
    would lose the run in b). A folder that cannot be written is said now, in
    one line, rather than after a long run. With *make_folders*
    (``gpuflame run -o``), missing folders are made now.
    """
    p = Path(path)
    for given in inputs:
        if _same_file(p, Path(given)):
            raise GpuflameError(f"{p}: is an input of this command; refusing to overwrite it")
    if p.is_dir():
        raise GpuflameError(f"{p}: cannot write: it is a folder (give a file name)")
    _refuse_special(p)  # even with force, and before a pipe's read would block
    if p.exists() and not force:
        head = _head(p)
        if head is None or not _written_by_gpuflame(head):
            said = f"{p}: exists and is not a file gpuflame wrote; refusing to overwrite it ({force_hint})"
            raise GpuflameError(said)
        if writes is not None and _is_gzip_pprof(head):
            raise GpuflameError(f"{p}: is a profile; refusing to replace it with {writes} ({force_hint})")
    _check_folder(p.parent if str(p.parent) else Path("."), p, make_folders)


def check_folder(folder: str | os.PathLike[str]) -> None:
    """Refuse a folder gpuflame must make files in (the run store) that cannot be written."""
    f = Path(folder)
    _check_folder(f, f, make_folders=True)


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one existing file (links and ``..`` included); False for any odd word."""
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except (OSError, ValueError):  # a command-line word too long or with a NUL for a path
        return False


def _check_folder(folder: Path, target: Path, make_folders: bool) -> None:
    if not folder.exists():
        if not make_folders:
            raise GpuflameError(f"{target}: cannot write (folder {folder} does not exist)")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise GpuflameError(f"{target}: cannot make the folder {folder} ({exc.strerror or exc})") from None
    if not folder.is_dir():
        raise GpuflameError(f"{target}: cannot write ({folder} is not a folder)")
    _probe(folder, target)


def _probe(folder: Path, target: Path) -> None:
    """Make and remove a file in *folder*: the only sure test (``/proc``, read-only mounts)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".gpuflame-probe.", dir=folder)
    except PermissionError:
        raise GpuflameError(f"{target}: cannot write (permission denied in {folder})") from None
    except OSError as exc:
        raise GpuflameError(f"{target}: cannot write in {folder} ({exc.strerror or exc})") from None
    os.close(fd)
    _remove_quietly(tmp)


def _head(path: Path) -> bytes | None:
    """The first bytes of an existing file, to tell what it is; None where it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(_SNIFF_BYTES)
    except OSError:
        return None


def _written_by_gpuflame(head: bytes) -> bool:
    """Whether a file that starts with *head* is empty or looks like something gpuflame writes."""
    if not head:
        return True
    if head[:2] == b"\x1f\x8b":
        return _is_gzip_pprof(head)
    text = head.decode("utf-8", errors="replace")
    # folded stacks only with the header line gpuflame writes: a log of "word NUMBER" lines is no profile
    return text.startswith(_FOLDED_HEADER) or any(mark in text for mark in _OWN_TEXT_MARKS)


def _is_gzip_pprof(head: bytes) -> bool:
    """gzip whose content starts as a pprof Profile does (a sample_type, field 1)."""
    try:
        inner = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 16)
    except zlib.error:
        return False
    return inner[:1] == b"\x0a"
