"""Regenerate ``profile_pb2.py`` and ``split_profile_pb2.py`` (and their ``.pyi``) from the ``.proto`` files here.

``make proto`` runs it; it needs ``grpcio-tools`` (pinned in the test extra),
whose protoc writes its own version in each file's header. The generated
files are checked in: installing gpuflame needs the ``protobuf`` runtime
only. ``tests/unit/formats/test_pprof_proto.py`` checks that they are what
this generates.

    python -m gpuflame.formats.pprof_proto.generate [OUT_DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[2]  # the folder that holds the gpuflame package: the generated imports start there
PROTOS = ("profile.proto", "split_profile.proto")


def protoc_args(out: Path) -> list[str]:
    """protoc's command line: Python classes and type stubs of :data:`PROTOS`, written under *out*."""
    names = [str((HERE / name).relative_to(SRC)) for name in PROTOS]
    return ["protoc", f"-I{SRC}", f"--python_out={out}", f"--pyi_out={out}", *names]


def generate(out: Path = SRC) -> None:
    """Write the generated files under *out* (``gpuflame/formats/pprof_proto/*_pb2.py*``)."""
    from grpc_tools import protoc  # the pinned generator: a test dependency, not the package's

    out.mkdir(parents=True, exist_ok=True)
    if protoc.main(protoc_args(out)) != 0:
        raise SystemExit("protoc failed on " + ", ".join(PROTOS))


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else SRC)
