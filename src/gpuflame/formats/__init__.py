"""Readers and writers: pprof (native), folded stacks, speedscope, PyTorch snapshots.

``load`` sniffs the format from the bytes, not the file name, so a user can
hand gpuflame whatever file they have.
"""

from gpuflame.formats.detect import FORMATS, detect, load, loads, save

__all__ = ["FORMATS", "detect", "load", "loads", "save"]
