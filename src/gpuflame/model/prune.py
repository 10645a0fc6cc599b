"""Prune framework frames so the user's own code stands out.

A stack through PyTorch looks like ``user -> Module._call_impl ->
Module._wrapped_call_impl -> user -> Linear.__init__ -> reset_parameters ->
kaiming_uniform_``. The frames between two user frames say nothing about
*why* memory was taken, so they go; below the last user frame the
framework function the user called is kept (the entry, ``Optimizer >
profile_hook_step > wrapper``), and with it the innermost framework method
of a class (``Adam > _init_group``, ``Linear > reset_parameters``): the
class says what the memory is, and a search for "Adam" must find it.

Native frames (C++ under a torch op, shared-library code) are never the
user's code: they count as framework frames wherever they sit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpuflame.boundary.backends import framework_packages
from gpuflame.model.profile import NATIVE, PYTHON, Frame, Profile, Sample

DEFAULT_FRAMEWORKS = framework_packages()  # torch/, jax/, jaxlib/: every backend's framework


def framework_regex(packages: Iterable[str]) -> re.Pattern[str]:
    """Paths of installed packages: ``.../torch/nn/...`` or ``torch/nn/...``."""
    names = "|".join(re.escape(p.strip("/")) for p in packages if p.strip("/"))
    return re.compile(rf"(^|[/\\])({names})[/\\]")


# ``Adam > _init_group``: a method of a class (CapWords, as PEP 8 names classes),
# not a closure (``Optimizer > profile_hook_step > wrapper``) or a function
_CLASS_METHOD = re.compile(r"[A-Z][A-Za-z0-9_]* > [^>]+")


def is_framework(frame: Frame, regex: re.Pattern[str]) -> bool:
    return framework_files(frame.kind, [frame.file], regex)[0]


def framework_files(kind: str, files: list[str], regex: re.Pattern[str]) -> list[bool]:
    """:func:`is_framework` of a frame of *kind* in each of *files*: a page asks once per kind and file."""
    if kind == NATIVE:
        return [True] * len(files)
    if kind != PYTHON:
        return [False] * len(files)
    search = regex.search
    return [bool(file) and search(file) is not None for file in files]


def names_the_memory(frame: Frame) -> bool:
    """A framework frame worth keeping under the entry: a class's own method (``Adam > _init_group``)."""
    return frame.kind == PYTHON and _CLASS_METHOD.fullmatch(frame.name) is not None


def prune_framework(
    profile: Profile,
    packages: Iterable[str] = DEFAULT_FRAMEWORKS,
    keep_entry: bool = True,
) -> Profile:
    """Drop framework frames sandwiched between user frames.

    Runs of framework frames at the leaf end collapse to their outermost frame
    (the API the user called) and their innermost class method (what the
    memory is) when *keep_entry*, else disappear with their bytes attributed
    to the calling user frame. Stacks made only of framework frames are left
    whole: there is no user frame to attribute them to.
    """
    regex = framework_regex(packages)
    fw = [is_framework(f, regex) for f in profile.frames]
    named = [names_the_memory(f) for f in profile.frames]
    out: list[Sample] = []
    for s in profile.samples:
        stack = s.stack
        users = [i for i, f in enumerate(stack) if not fw[f]]
        if not users or len(users) == len(stack):
            out.append(s)
            continue
        first_user, last_user = users[0], users[-1]  # leaf-most, root-most
        kept: list[int] = []
        if first_user and keep_entry:
            inner = next((f for f in stack[: first_user - 1] if named[f]), None)
            if inner is not None:
                kept.append(inner)
            kept.append(stack[first_user - 1])
        kept.extend(f for f in stack[first_user : last_user + 1] if not fw[f])
        kept.extend(stack[last_user + 1 :])
        out.append(Sample(tuple(kept), s.values, s.labels))
    return profile.derive(out)
