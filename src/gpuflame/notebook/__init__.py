"""Notebooks: ``%load_ext gpuflame``, then ``%%gpuflame`` shows a cell's flame graph inline.

Nothing here imports IPython until the extension is loaded, so ``gpuflame.last()``
costs nothing outside a notebook.
"""

from __future__ import annotations

from typing import Any

from gpuflame.model.profile import Profile

_last: Profile | None = None


def last() -> Profile | None:
    """The profile of the last ``%%gpuflame`` cell (as shown), or None before the first."""
    return _last


def remember(profile: Profile) -> None:
    global _last
    _last = profile


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gpuflame``: register the ``%%gpuflame`` and ``%gpuflame_report`` magics."""
    from gpuflame.notebook.magic import GpuflameMagics

    ipython.register_magics(GpuflameMagics)
