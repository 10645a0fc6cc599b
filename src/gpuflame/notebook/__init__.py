"""Notebooks: ``%load_ext gpuflame``, then ``%%gpuflame`` shows a cell's flame graph inline.

Nothing here imports IPython until the extension is loaded, so ``gpuflame.last()``
costs nothing outside a notebook.
"""

from __future__ import annotations

from typing import Any

from gpuflame.notebook.last_cell import last  # noqa: F401 - gpuflame.last()


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gpuflame``: register the ``%%gpuflame`` and ``%gpuflame_report`` magics."""
    from gpuflame.notebook.magic import GpuflameMagics

    ipython.register_magics(GpuflameMagics)
