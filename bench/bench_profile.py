"""Time load, report and export on a large profile (200k samples, 40 frames deep).

Side by side in one run, so the ratios mean something on a noisy machine:

* load: gpuflame's pure-Python pprof decoder against Google's protobuf
  runtime (C, upb) parsing the same bytes into message objects — a parse
  only, with no profile model built, so the ratio is an upper bound;
* ``gpuflame report`` / ``top`` / ``flame`` end to end as a user runs them
  (a new process: interpreter start, imports, load, analysis, printing);
* export to each format from a loaded profile.

    python bench/bench_profile.py            # makes bench/out/large.pb.gz once
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from gpuflame.formats import detect, load  # noqa: E402
from gpuflame.formats.pprof import decode  # noqa: E402
from gpuflame.render.writers import FORMATS  # noqa: E402


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def google_profile_class() -> Any:
    """profile.proto compiled with grpc_tools' protoc: the reference decoder."""
    out = Path(tempfile.mkdtemp())
    proto = ROOT / "tests" / "proto"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{proto}", f"--python_out={out}", str(proto / "profile.proto")],
        check=True,
        capture_output=True,
    )
    spec = importlib.util.spec_from_file_location("bench_profile_pb2", out / "profile_pb2.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module.Profile


def cli(*args: str) -> Callable[[], None]:
    def go() -> None:
        subprocess.run([sys.executable, "-m", "gpuflame", *args], check=True, stdout=subprocess.DEVNULL)

    return go


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", nargs="?", type=Path, default=ROOT / "bench/out/large.pb.gz")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if not args.profile.exists():
        from gpuflame.formats import save
        from make_profile import make_profile

        print(f"generating {args.profile} (200k samples, 40 deep) ...", flush=True)
        args.profile.parent.mkdir(parents=True, exist_ok=True)
        save(make_profile(), args.profile)

    data = args.profile.read_bytes()
    raw = gzip.decompress(data)
    profile = load(args.profile)
    print(
        f"profile: {args.profile} ({len(data) / 1e6:.1f} MB gzip, {len(raw) / 1e6:.1f} MB raw, "
        f"{len(profile.samples):,} samples, {len(profile.frames):,} frames, "
        f"max depth {max(len(s.stack) for s in profile.samples)})"
    )
    assert detect(data) == "pprof"

    t_ours, _ = best(lambda: decode(data), args.repeat)
    t_gunzip, _ = best(lambda: gzip.decompress(data), args.repeat)
    Profile = google_profile_class()
    t_google, _ = best(lambda: Profile.FromString(gzip.decompress(data)), args.repeat)
    print(f"load   gpuflame decode (pure Python)      {t_ours:7.3f} s")
    ratio = t_ours / t_google
    print(
        f"load   google protobuf parse (C upb)      {t_google:7.3f} s   ratio gpuflame/google {ratio:5.1f}x"
        f"   (gunzip alone {t_gunzip:.3f} s)"
    )

    for name, argv in (
        ("report", ("report", str(args.profile))),
        ("top", ("top", str(args.profile))),
        ("flame", ("flame", str(args.profile))),
        (
            "report --prune-framework --min-size 1MiB",
            ("report", str(args.profile), "--prune-framework", "--min-size", "1MiB"),
        ),
    ):
        t, _ = best(cli(*argv), args.repeat)
        print(f"cli    gpuflame {name:<40} {t:7.3f} s  (new process, end to end)")
    t_start, _ = best(cli("--version"), args.repeat)
    print(f"cli    gpuflame --version (start-up only)        {t_start:7.3f} s")

    from gpuflame.render.writers import dumps

    for fmt in FORMATS:
        t, out = best(lambda fmt=fmt: dumps(profile, fmt), args.repeat)
        print(f"export {fmt:<10} {t:7.3f} s  ({len(out) / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
