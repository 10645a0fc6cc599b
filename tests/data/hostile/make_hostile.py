"""Write the small hostile files of this folder (README.md says what each is and what it must give).

Run from the repository root: ``python tests/data/hostile/make_hostile.py``.
Every file is a few KB at most; the ones that would be large are made in
the tests instead (tests/unit/formats/test_hostile_files.py).
"""

from __future__ import annotations

import base64
import gzip
import pickle
import zlib
from pathlib import Path

from gpuflame.formats import pprof
from gpuflame.formats import protobuf_encode as wire
from gpuflame.formats.pprof_proto.profile_pb2 import Profile as ProfileMessage
from gpuflame.model import Frame, Profile, SampleType, timeline

HERE = Path(__file__).parent
SNAPSHOT = HERE.parents[1] / "fixtures" / "handwritten_oom.pickle"


def small_profile(comments: list[str] = ()) -> Profile:
    p = Profile(sample_types=[SampleType("inuse_space", "bytes")], comments=list(comments))
    p.add([Frame("leaf", "a.py", 2), Frame("<module>", "a.py", 1)], [4096])
    return p


def packed(prefix: str, json_text: bytes) -> str:
    """A data comment as gpuflame writes one, around any JSON text (zlib in steps: it may be large)."""
    z = zlib.compressobj(9)
    out = [z.compress(json_text), z.flush()]
    return prefix + base64.b64encode(b"".join(out)).decode("ascii")


def with_repeated_comment(profile: Profile, times: int) -> bytes:
    """*profile*'s raw pprof with its first comment named *times* times (one string, many references)."""
    raw = pprof.encode_raw(profile)
    index = ProfileMessage.FromString(raw).comment[0]
    return raw + (wire.tag(13, wire.VARINT) + wire.encode_varint(index)) * (times - 1)


def series_json(points: int) -> bytes:
    ones = b",".join([b"1"] * points)
    return b'{"series":[{"labels":[],"t":[' + ones + b'],"b":[' + ones + b"]}]}"


def main() -> None:
    files: dict[str, bytes] = {}
    # issue 18: a count of 5,000 leading zeros was "internal error: ValueError"
    files["leading-zeros.folded"] = b"<module>;main " + b"0" * 5000 + b"7\n"
    # issue 18: protocol 0/1 pickles were sniffed as folded text or "not a profile"
    snapshot = pickle.loads(SNAPSHOT.read_bytes())
    files["protocol-0.pickle"] = pickle.dumps(snapshot, protocol=0)
    files["protocol-1.pickle"] = pickle.dumps(snapshot, protocol=1)
    # issue 18: a 1M-deep stack took over 300 s
    deep = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    deep.add([Frame("recurse", "a.py", 3)] * 1_000_000, [1])
    files["deep-stack.pb.gz"] = gzip.compress(pprof.encode_raw(deep), 9, mtime=0)
    # issue 18: one timeline comment named 20 times took 155 s and 441 MB
    comment = packed(timeline.PREFIX, series_json(500_000))
    files["repeated-timeline.pb.gz"] = gzip.compress(with_repeated_comment(small_profile([comment]), 20), 9, mtime=0)
    # a timeline comment that inflates past the comment-data limit (300 MB of JSON)
    bomb = packed(timeline.PREFIX, series_json(75_000_000))
    files["comment-bomb.pb.gz"] = gzip.compress(pprof.encode_raw(small_profile([bomb])), 9, mtime=0)
    # a gzip bomb in little: 5 MB of EMPTY_LIST opcodes (the tests lower the limits to hit them)
    files["list-bomb.pickle.gz"] = gzip.compress(b"\x80\x04" + b"]" * 5_000_000 + b".", 9, mtime=0)
    for name, data in files.items():
        (HERE / name).write_bytes(data)


if __name__ == "__main__":
    main()
