"""The profile of the last ``%%gpuflame`` cell, kept for ``gpuflame.last()``.

Its own module, below both the magics that set it and the package that hands it
out, so that neither imports the other for it (and IPython stays unimported).
"""

from __future__ import annotations

from gpuflame.model.profile import Profile

_last: Profile | None = None


def last() -> Profile | None:
    """The profile of the last ``%%gpuflame`` cell (as shown), or None before the first."""
    return _last


def remember(profile: Profile) -> None:
    global _last
    _last = profile
