"""Every output format by name: the interchange formats (formats/) and the renderings (the flame-tree JSON, SVG).

``gpuflame export``/``convert`` and ``gpuflame.save`` write through here, so
a format's name and the file names that imply it have one owner. formats/
never imports render/: the JSON tree and the SVG picture are laid out from
the analysis, as the terminal and the HTML page are.
"""

from __future__ import annotations

import os

from gpuflame.files import write_output
from gpuflame.formats import load_save
from gpuflame.model.profile import Profile

RENDERINGS = ("json", "svg")
FORMATS = load_save.FORMATS + RENDERINGS

# Output names and the format they imply; the first match wins.
SUFFIXES = (
    (".speedscope.json", "speedscope"),
    (".json", "json"),
    (".folded", "folded"),
    (".collapsed", "folded"),
    (".txt", "folded"),
    (".pb.gz", "pprof"),
    (".pb", "pprof"),
    (".pprof", "pprof"),
    (".svg", "svg"),
)


def format_from_name(path: str | os.PathLike[str]) -> str | None:
    """The format an output file's name implies (``run.folded`` -> ``folded``), or None."""
    name = os.path.basename(os.fspath(path)).lower()
    for suffix, fmt in SUFFIXES:
        if name.endswith(suffix):
            return fmt
    return None


def output_format(path: str | os.PathLike[str], requested: str | None = None) -> str:
    """The format asked for, else the one the name implies, else pprof (also for ``-``)."""
    return requested or format_from_name(path) or "pprof"


def dumps(profile: Profile, fmt: str = "pprof", type_name: str | None = None) -> bytes:
    """*profile* in format *fmt*; all but pprof carry one sample type (*type_name*, else the default)."""
    if fmt not in RENDERINGS:
        return load_save.dumps(profile, fmt, type_name)
    index = profile.pick_type(type_name)
    if fmt == "json":
        from gpuflame.render import flame_json

        return flame_json.encode(profile, index).encode("utf-8")
    from gpuflame.render import svg

    return svg.encode(profile, index).encode("utf-8")


def save(profile: Profile, path: str | os.PathLike[str], fmt: str = "pprof", type_name: str | None = None) -> None:
    """Write *profile* atomically (``-``: to standard output)."""
    write_output(path, dumps(profile, fmt, type_name))
