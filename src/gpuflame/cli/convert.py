"""``gpuflame convert``: ``gpuflame export`` under the name a snapshot user looks for.

The usual input is a PyTorch memory snapshot (``torch.cuda.memory._dump_snapshot``),
which becomes a gzip pprof with peak, in-use and allocated views that
``go tool pprof``, Pyroscope and Grafana read unchanged. The options, the
suffix rules, the filters and the output are export's (one implementation);
only the help text speaks of snapshots.
"""

from __future__ import annotations

from gpuflame.cli.common import FILTER_ORDER
from gpuflame.cli.export import add_arguments, run

__all__ = ["DESCRIPTION", "EPILOG", "HELP", "add_arguments", "run"]

HELP = "convert a PyTorch memory snapshot or a profile to pprof, folded, speedscope, JSON or SVG (= export)"

DESCRIPTION = """\
Read a GPU-memory profile in any format gpuflame reads (a PyTorch CUDA memory
snapshot pickle, gzip pprof, folded stacks) and write it as pprof (all sample
types in one file), folded stacks, speedscope JSON, a JSON flame tree or an
SVG flame graph (one sample type each). This is `gpuflame export` under
another name: the same options, filters and output.

A snapshot gives three views per device: peak_* (what was live at the moment
of the highest total, from replaying the allocator trace), inuse_* (what was
live when the snapshot was taken) and alloc_* (everything the trace
allocated). Snapshots are read without running any code from the pickle.

Units: every view counts the bytes each allocation asked for (the trace
records those), so peak >= in use always. What the allocator holds beyond
that is shown as synthetic frames: <allocator rounding> (block size minus
the bytes asked for, where the block is known) and <cached free blocks>
(reserved, not allocated); in use + rounding + cached = reserved.

Stacks (stacks="all", PyTorch's default): the Python frames, root <module>,
with the op that allocated as one frame above the Python caller
(aten::zeros_like); the recorder's, the caching allocator's and CPython's
own frames are cut. Allocations on autograd's threads (no Python frame) are
under <backward pass> > the graph node (MulBackward0) > the op. --native
keeps the C++ chain. Python frames are named with their class
(AdamW > step) by reading the source: where it is not on this machine,
--source-root maps the recording machine's paths, and the output says how
many frames stay unqualified.
"""

EPILOG = f"""\
examples:
  gpuflame convert snapshot.pickle -o memory.pb.gz
  gpuflame convert snapshot.pickle -o memory.folded --type inuse
  gpuflame convert snapshot.pickle -o memory.svg --type peak --hide-trampolines
  gpuflame convert memory.pb.gz -o memory.speedscope.json
  gpuflame convert snapshot.pickle -o memory.pb.gz --json
  gpuflame convert snapshot.pickle -o memory.pb.gz --native --source-root /home/me/proj=.

The format follows the output name (.pb.gz, .folded, .speedscope.json,
.json) unless --format says otherwise; pprof when the name says nothing.
"-o -" writes to standard output (and prints no summary). OUTPUT may
replace a file gpuflame wrote; the input, a folder or any other existing
file is refused (--force replaces another file).

{FILTER_ORDER}
"""
