"""What a reader accepts from a file: the one owner of every bound on hostile input.

A profile file is untrusted: a few kilobytes of gzip can inflate to
gigabytes, a pickle byte can become a 56-byte list, a comment can hold a
compressed JSON bomb, a stack can be a million frames deep. Every reader
checks the counts below as it goes (plain integer comparisons on its hot
path, never a second pass) and stops at the first one exceeded with one
line that names the limit and the variable that raises it (exit 2).

The defaults sit well above any real profile: the largest PyTorch
snapshots seen inflate to a few hundred MB, have a container object per
25-60 bytes and stacks of a few hundred frames; a gpuflame run of ten
processes, each with a full event history, carries about 250 MB of
comment data. Each can be raised (or lowered) by its ``GPUFLAME_MAX_*``
variable. JSON nesting is bounded by the interpreter's own recursion guard
(a clean error, as deep pickles are). Standard library only: the model's
comment decoders use it too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpuflame.errors import GpuflameError, ProfileFormatError


@dataclass(frozen=True)
class Limit:
    """One bound: *default*, overridden by the environment variable *env* (a positive whole number)."""

    env: str
    default: int
    unit: str  # what is counted, for the message: "bytes", "frames", ...

    def value(self) -> int:
        """The bound in force; read once per file, so the hot loops compare plain ints."""
        text = os.environ.get(self.env, "").strip().replace("_", "")
        if not text:
            return self.default
        if not text.isdigit() or len(text) > 19 or int(text) <= 0:
            raise GpuflameError(f"{self.env}={os.environ[self.env]!r} is not a positive whole number")
        return int(text)

    def exceeded(self, what: str, limit: int | None = None) -> ProfileFormatError:
        """The error for *what* (``the decompressed data``) going past the bound."""
        bound = self.value() if limit is None else limit
        return ProfileFormatError(
            f"{what}: past gpuflame's limit of {bound:,} {self.unit} "
            f"(a damaged or hostile file? if it is genuine, raise the limit with {self.env}=N)"
        )


# gzip (and zlib) data is inflated in bounded steps and stops here; a profile file or standard input is read up to it
INFLATED_BYTES = Limit("GPUFLAME_MAX_INFLATED_BYTES", 1 << 30, "bytes")
# lists, dicts, sets and marks in a pickle: each costs 56+ bytes for one byte of file
PICKLE_CONTAINERS = Limit("GPUFLAME_MAX_PICKLE_CONTAINERS", 50_000_000, "containers")
# a pickle with many tuples (snapshots have a few dozen) is checked opcode by opcode in Python
# for tuples nested deeply enough to crash the interpreter: only up to this size (~2 s a MB)
PICKLE_TUPLE_CHECK_BYTES = Limit("GPUFLAME_MAX_PICKLE_TUPLE_CHECK_BYTES", 8 << 20, "bytes")
# frames in one stack (a sample's, or a snapshot block's)
STACK_DEPTH = Limit("GPUFLAME_MAX_STACK_DEPTH", 16_384, "frames")
# samples (pprof samples, folded lines, speedscope samples, snapshot blocks and events)
SAMPLES = Limit("GPUFLAME_MAX_SAMPLES", 20_000_000, "samples")
# locations, functions and frames of one table
FRAMES = Limit("GPUFLAME_MAX_FRAMES", 10_000_000, "entries")
# frames in all the stacks of one file together (a sample's stack costs 8 bytes a frame once read)
STACK_FRAMES = Limit("GPUFLAME_MAX_STACK_FRAMES", 100_000_000, "frames")
# cells of a view's stack table: stacks x the deepest stack (every row is padded to it), 2-4 bytes each
TABLE_CELLS = Limit("GPUFLAME_MAX_TABLE_CELLS", 300_000_000, "cells")
# distinct comments of one profile (repeats of one comment are read once)
COMMENTS = Limit("GPUFLAME_MAX_COMMENTS", 100_000, "comments")
# the JSON that all of one profile's data comments (timeline, history, ...) inflate to, together
COMMENT_DATA_BYTES = Limit("GPUFLAME_MAX_COMMENT_DATA_BYTES", 256 << 20, "bytes")
# ... and the values in it (a full event history has three per event): each costs 8-64 bytes once
# parsed, so "[]," repeated would otherwise make 256 MB of JSON several GB of lists
COMMENT_DATA_VALUES = Limit("GPUFLAME_MAX_COMMENT_DATA_VALUES", 32_000_000, "values")

ALL = (
    INFLATED_BYTES,
    PICKLE_CONTAINERS,
    PICKLE_TUPLE_CHECK_BYTES,
    STACK_DEPTH,
    SAMPLES,
    FRAMES,
    STACK_FRAMES,
    TABLE_CELLS,
    COMMENTS,
    COMMENT_DATA_BYTES,
    COMMENT_DATA_VALUES,
)
