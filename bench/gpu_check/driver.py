"""The GPU check's driver: each part in a process of its own, with its own time limit, then a summary.

A part that raises, exits non-zero or runs past its limit (its whole process
group is killed) is marked failed in its file, with the end of its output,
and the next part runs; the driver itself exits 0 whatever the parts did
(exit 2 only for bad input). ``--inject PART=raise|hang`` makes a part fail
on purpose, to prove that.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import NoReturn

from . import common, part_agent, part_env, part_overhead, part_simulate, part_snapshots, part_tests
from .common import Context, read_status, table, write_status

PARTS: dict[str, ModuleType] = {
    m.NAME: m for m in (part_env, part_tests, part_overhead, part_snapshots, part_simulate, part_agent)
}
BUDGET_S = 470.0  # under 8 minutes on the GPU machine, the driver's own seconds included
SUMMARY = "summary.md"
SCRIPT = Path(__file__).resolve().parents[1] / "gpu_check.py"


def files_of(part: ModuleType) -> list[str]:
    return list(getattr(part, "FILES", [part.FILE]))


def all_files() -> set[str]:
    return {SUMMARY} | {f for p in PARTS.values() for f in files_of(p)}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpu_check.py", description=(__package__ and sys.modules[__package__].__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT") or common.ROOT / "bench" / "out" / "gpu-check")
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="tiny sizes; on a machine without CUDA the CUDA parts say so"
    )
    parser.add_argument("--only", help="comma-separated parts to run (default all): " + ",".join(PARTS))
    parser.add_argument("--impl", choices=("auto", "transformers", "pure-torch"), default="auto")
    parser.add_argument("--inject", action="append", default=[], metavar="PART=raise|hang")
    parser.add_argument("--limit", action="append", default=[], metavar="PART=SECONDS", help="a part's time limit")
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=float("inf"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def bad(message: str) -> NoReturn:
    """Bad input: one line on stderr, exit 2."""
    print(f"gpu_check.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def pairs(items: list[str], what: str) -> dict[str, str]:
    """PART=VALUE options; an unknown part or a missing '=' ends the program with exit 2."""
    found = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in PARTS:
            bad(f"{what} takes PART=VALUE with PART one of {', '.join(PARTS)}: {item!r}")
        found[name] = value
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.part:
        return run_part(args)
    selected = args.only.split(",") if args.only else list(PARTS)
    unknown = [p for p in selected if p not in PARTS]
    if unknown:
        bad(f"unknown part {unknown[0]!r} (parts: {', '.join(PARTS)})")
    inject, limits = pairs(args.inject, "--inject"), pairs(args.limit, "--limit")
    if any(v not in ("raise", "hang") for v in inject.values()):
        bad("--inject takes PART=raise or PART=hang")
    try:
        limits_s = {k: float(v) for k, v in limits.items()}
    except ValueError:
        bad("--limit takes PART=SECONDS")
    out: Path = args.out
    if out.exists() and not out.is_dir():
        bad(f"--out {out} is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    strangers = sorted(p.name for p in out.iterdir() if p.name not in all_files())
    if strangers:
        bad(f"--out {out} holds files this check did not write ({strangers[0]}, ...): use an empty folder")
    for name in all_files():
        (out / name).unlink(missing_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="gpuflame-gpu-check-"))
    started = time.monotonic()
    try:
        rows = drive(args, selected, inject, limits_s, out, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    write_summary(out, rows, args.dry_run, time.monotonic() - started)
    print((out / SUMMARY).read_text())
    return 0


def drive(
    args: argparse.Namespace,
    selected: list[str],
    inject: dict[str, str],
    limits: dict[str, float],
    out: Path,
    scratch: Path,
) -> list[list[str]]:
    """Run each selected part in order; a row per part for the summary."""
    deadline = time.monotonic() + BUDGET_S
    rows = []
    for name in selected:
        part = PARTS[name]
        left = deadline - time.monotonic()
        limit = min(limits.get(name, part.LIMIT_S), left)
        ctx = Context(out, scratch, args.dry_run, args.impl, time.monotonic() + limit)
        if left < 5:
            mark_failed(part, ctx, "skipped: no time left of the check's budget", "")
            rows.append([name, "skipped: no time left", "0", ", ".join(files_of(part))])
            continue
        argv = [
            sys.executable,
            str(SCRIPT),
            "--part",
            name,
            "--out",
            str(out),
            "--scratch",
            str(scratch),
            "--impl",
            args.impl,
            "--deadline",
            repr(ctx.deadline),
        ]
        extra = {common.INJECT_ENV: f"{name}={inject[name]}"} if name in inject else {}
        env = common.part_env()
        env.update(extra)
        done = common.run(argv + (["--dry-run"] if args.dry_run else []), limit, env=env)
        if not done.ok:
            reason = (
                f"timed out after {limit:.0f} s (its time limit)" if done.rc is None else f"the part exited {done.rc}"
            )
            mark_failed(part, ctx, f"failed: {reason}", done.stdout + done.stderr)
        rows.append(
            [name, part_status(part, ctx) or "no status written", f"{done.seconds:.1f}", ", ".join(files_of(part))]
        )
    return rows


def part_status(part: ModuleType, ctx: Context) -> str | None:
    if hasattr(part, "status_of"):
        return part.status_of(ctx)
    return read_status(ctx.out / part.FILE)


def mark_failed(part: ModuleType, ctx: Context, status: str, log: str) -> None:
    """Say in the part's own file that it failed and why, keeping what it wrote before it stopped."""
    tail = "\n".join(log.strip().splitlines()[-40:])
    body = f"## the part's last output\n\n```\n{tail}\n```\n" if tail else ""
    if hasattr(part, "mark_failed"):
        part.mark_failed(ctx, status, body)
        return
    path = ctx.out / part.FILE
    before = path.read_text(errors="replace").split("\n", 3)[-1] if path.exists() else ""
    write_status(
        path, part.TITLE, status, (f"## written before it stopped\n\n{before}\n" if before.strip() else "") + body
    )


def write_summary(out: Path, rows: list[list[str]], dry_run: bool, seconds: float) -> None:
    failed = [r[0] for r in rows if r[1].startswith("failed")]
    status = f"failed: {', '.join(failed)}" if failed else "ok"
    lines = ("dry run (tiny sizes)" if dry_run else "full run") + f", {seconds:.0f} s of the {BUDGET_S:.0f} s budget"
    write_status(
        out / SUMMARY,
        "gpuflame GPU check",
        status,
        f"{lines}; each part's outcome and time:\n\n" + table(["part", "status", "seconds", "files"], rows),
    )


def run_part(args: argparse.Namespace) -> int:
    """One part, in this process (the driver started it): an injected failure first, then its work."""
    part = PARTS[args.part]
    ctx = Context(args.out, args.scratch, args.dry_run, args.impl, args.deadline)
    action = dict(i.partition("=")[::2] for i in os.environ.get(common.INJECT_ENV, "").split(",") if i).get(args.part)
    if action == "raise":
        raise RuntimeError(f"injected failure in part {args.part} ({common.INJECT_ENV})")
    if action == "hang":
        while True:
            time.sleep(3600)
    try:
        part.main(ctx)
    except Exception:
        traceback.print_exc()
        return 1
    return 0
