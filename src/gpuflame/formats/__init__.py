"""Readers and writers of interchange formats: pprof (native), folded stacks, speedscope, PyTorch snapshots.

``load`` sniffs the format from the bytes, not the file name, so a user can
hand gpuflame whatever file they have.
"""

from gpuflame.formats.load_save import FORMATS, detect, dumps, load, loads, save

__all__ = ["FORMATS", "detect", "dumps", "load", "loads", "save"]
