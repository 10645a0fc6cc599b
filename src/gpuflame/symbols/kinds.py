"""Frame kind from a name and a file, for formats that do not store it (pprof, folded)."""

from __future__ import annotations

import re

from gpuflame.model.profile import NATIVE, PYTHON, SYNTHETIC, TRAMPOLINE
from gpuflame.symbols.names import MODULE
from gpuflame.symbols.names import TRAMPOLINE as TRAMPOLINE_NAME

_ADDRESS = re.compile(r"^(0x)?[0-9a-fA-F]{6,}$")
_PYTHON_FILE = re.compile(r"\.(py|pyw|pyx|ipynb)$|^<(frozen |string|stdin|ipython)")


def guess_kind(name: str, file: str = "") -> str:
    """python / native / trampoline / synthetic, as the AKS guide's table reads them.

    ``<module>``, ``<lambda>`` and comprehensions are Python; other names in
    angle brackets without a Python file are synthetic (``<cached free
    blocks>``); a raw address or a frame whose file is not Python is native.
    """
    if name == TRAMPOLINE_NAME:
        return TRAMPOLINE
    if file and _PYTHON_FILE.search(file):
        return PYTHON
    if name == MODULE:
        return PYTHON
    if name.startswith("<") and name.endswith(">"):
        return SYNTHETIC
    if _ADDRESS.match(name) or file or "::" in name:  # C++ (aten::mm) without a file
        return NATIVE
    return PYTHON
