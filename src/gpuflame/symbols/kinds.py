"""Frame kinds, and a frame's kind from its name and file for formats that do not store it (pprof, folded).

The kinds live here, below the model (``model.profile`` re-exports them with
``Frame``), so that symbols/ never imports model/: the model names its frames
with symbols/, not the other way round.
"""

from __future__ import annotations

import re

from gpuflame.symbols.names import MODULE, TRAMPOLINE_NAME

# Frame kinds. Plain strings (not an Enum) because frames are hashed millions
# of times and Enum hashing runs Python code.
PYTHON = "python"
NATIVE = "native"
TRAMPOLINE_KIND = "trampoline"  # the kind; TRAMPOLINE_NAME is the frame's name, <interpreter trampoline>
SYNTHETIC = "synthetic"
FRAME_KINDS = (PYTHON, NATIVE, TRAMPOLINE_KIND, SYNTHETIC)

_ADDRESS = re.compile(r"^(0x)?[0-9a-fA-F]{6,}$")
# Python files: these endings (as a regular expression's ``$`` reads them, a final newline allowed) or
# these beginnings; str methods, not a regular expression: a million-frame profile asks for 381k files
_PYTHON_ENDINGS = tuple(e + nl for nl in ("", "\n") for e in (".py", ".pyw", ".pyx", ".ipynb"))
_PYTHON_BEGINNINGS = ("<frozen ", "<string", "<stdin", "<ipython")


def guess_kind(name: str, file: str = "") -> str:
    """python / native / trampoline / synthetic, as the AKS guide's table reads them.

    ``<module>``, ``<lambda>`` and comprehensions are Python; other names in
    angle brackets without a Python file are synthetic (``<cached free
    blocks>``); a raw address or a frame whose file is not Python is native.
    """
    if name == TRAMPOLINE_NAME:
        return TRAMPOLINE_KIND
    if python_file(file):
        return PYTHON
    if name == MODULE:
        return PYTHON
    if name.startswith("<") and name.endswith(">"):
        return SYNTHETIC
    if _ADDRESS.match(name) or file or "::" in name:  # C++ (aten::mm) without a file
        return NATIVE
    return PYTHON


def python_file(file: str) -> bool:
    """Whether every frame in *file* is Python whatever its name (but the trampoline): what :func:`guess_kind` says.

    Asked once per file by readers of a million frames instead of once per frame.
    """
    return file.endswith(_PYTHON_ENDINGS) or file.startswith(_PYTHON_BEGINNINGS)
