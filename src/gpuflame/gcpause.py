"""Holding off the cyclic garbage collector while building many acyclic objects."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cycle collector for the block.

    Decoding a profile or unpickling a snapshot allocates hundreds of
    thousands of tuples, dicts and lists, none in reference cycles; every
    allocation burst would otherwise trigger a collection that walks all the
    objects built so far again (15% or more of the decode time).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def kept_to_the_end() -> Iterator[None]:
    """Pause the collector while building objects a one-shot command keeps until it returns, then freeze them.

    After a pause the first collection walks every object built during it
    (two seconds after reading a million-frame profile) and later full ones
    walk them again, though a command's profile lives until it returns.
    ``gc.freeze`` moves them out of the collector's sight instead; the
    command line calls :func:`thaw` when the command returns, so a process
    that goes on (a test calling ``main``) gets them back.
    """
    with gc_paused():
        try:
            yield
        finally:
            gc.freeze()


def thaw() -> None:
    """Give objects frozen by :func:`kept_to_the_end` back to the collector."""
    gc.unfreeze()
