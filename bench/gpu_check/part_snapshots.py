"""Real allocator snapshots from small models on the GPU, bundled into one tar with the script that made them.

Four recordings, each workloads.py in a fresh process: a GPT-2 training
step, a Llama generate with a static KV cache, the GPT-2 step again under
``expandable_segments:True``, and the GPT-2 step capped by
``set_per_process_memory_fraction`` at 60% of its own reserved peak, so it
runs out of memory. snapshots.tar holds each ``NAME.pickle.gz`` (ready to
become a fixture in tests/data), results.json (what each run reported),
MANIFEST.md (the status, the checkout's version and the scripts' SHA-256,
each file's size) and the scripts themselves under script/. The simulate
part reads the snapshots and results from the scratch folder.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

from .common import HERE, Context, checkout_version, cuda_available, run_workloads, status_text, table

NAME = "snapshots"
FILE = "snapshots.tar"
TITLE = "Real snapshots recorded on the GPU"
LIMIT_S = 70.0
TAR_LIMIT = 15 << 20  # the device machine sends back files of 16 MiB at most
OOM_SHARE = 0.6  # the OOM run's cap, as a share of the default run's reserved peak
SCRIPTS = ("workloads.py", "models.py")
# (recording, workload, PYTORCH_CUDA_ALLOC_CONF)
RECORDINGS = (
    ("gpt2-train", "gpt2-train", ""),
    ("llama-generate", "llama-generate", ""),
    ("gpt2-train-expandable", "gpt2-train", "expandable_segments:True"),
    ("gpt2-train-oom", "gpt2-train", ""),
)


def folder(ctx: Context) -> Path:
    """Where the snapshots and results.json are kept for the later parts."""
    path = ctx.scratch / "snapshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


def load_results(ctx: Context) -> dict[str, dict[str, Any]]:
    """results.json by recording name, as the part left it (empty when it did not run)."""
    path = folder(ctx) / "results.json"
    return {r["recording"]: r for r in json.loads(path.read_text())} if path.exists() else {}


def provenance() -> str:
    lines = [f"checkout: {checkout_version()}"]
    for name in SCRIPTS:
        digest = hashlib.sha256((HERE / name).read_bytes()).hexdigest()
        lines.append(f"bench/gpu_check/{name} sha256 {digest}")
    return "\n".join(lines)


def pack(ctx: Context, status: str, body: str, limit: int = TAR_LIMIT) -> None:
    """Write snapshots.tar from the scratch folder: MANIFEST.md first, the scripts, results and snapshots.

    Snapshots that would take the tar past *limit* bytes (a file larger than the device machine sends back
    is lost whole) are left out, smallest kept first, and MANIFEST.md names them.
    """
    src = folder(ctx)
    others = [p for p in sorted(src.iterdir()) if not p.name.endswith(".pickle.gz")]
    room = limit - sum(p.stat().st_size for p in others) - sum((HERE / n).stat().st_size for n in SCRIPTS) - 64 * 1024
    kept, rows = [], []
    for path in sorted(src.glob("*.pickle.gz"), key=lambda p: p.stat().st_size):
        size = path.stat().st_size
        fits = size + 1024 <= room
        room -= size + 1024 if fits else 0
        kept += [path] if fits else []
        rows.append(
            [path.name, f"{size / 1024:.0f} KiB" + ("" if fits else " (left out: the tar would pass its limit)")]
        )
    listing = table(["file", "size"], rows) if rows else "no snapshots"
    manifest = status_text(TITLE, status, f"{provenance()}\n\n{listing}\n\n{body}").encode()
    tmp = ctx.out / (FILE + ".tmp")
    with tarfile.open(tmp, "w") as tar:
        info = tarfile.TarInfo("MANIFEST.md")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
        for name in SCRIPTS:
            tar.add(HERE / name, arcname=f"script/{name}")
        for path in others + sorted(kept):
            tar.add(path, arcname=path.name)
    tmp.replace(ctx.out / FILE)


def status_of(ctx: Context) -> str | None:
    try:
        with tarfile.open(ctx.out / FILE) as tar:
            member = tar.extractfile("MANIFEST.md")
            lines = member.read().decode().splitlines() if member else []
    except (OSError, KeyError, tarfile.TarError):
        return None
    return next((ln[len("status: ") :] for ln in lines[:3] if ln.startswith("status: ")), None)


def mark_failed(ctx: Context, status: str, body: str) -> None:
    pack(ctx, status, body)


def record(ctx: Context, name: str, workload: str, conf: str, limit: int) -> dict[str, Any]:
    """One recording on CUDA: its result, or what went wrong."""
    extra = ["--snapshot", str(folder(ctx) / f"{name}.pickle.gz")] + (["--memory-limit", str(limit)] if limit else [])
    env = {"PYTORCH_CUDA_ALLOC_CONF": conf} if conf else {}
    results, done = run_workloads(ctx, [workload], "cuda", 60, env, *extra)
    if not results:
        return {"recording": name, "error": done.why()}
    return {"recording": name, **results[0]}


def main(ctx: Context) -> None:
    if not cuda_available():
        if not ctx.dry_run:
            pack(ctx, "skipped: no CUDA", "")
            return
        results, done = run_workloads(ctx, ["gpt2-train", "llama-generate"], "cpu", 60)
        if not done.ok:
            raise RuntimeError(f"the workloads failed on the CPU: {done.why()}")
        (folder(ctx) / "results.json").write_text(json.dumps([{"recording": r["workload"], **r} for r in results]))
        ran = ", ".join(f"{r['workload']} ({r['impl']})" for r in results)
        pack(ctx, f"skipped: no CUDA (dry run: {ran} ran on the CPU, without snapshots)", "")
        return
    rows: list[list[str]] = []
    got: list[dict[str, Any]] = []
    for name, workload, conf in RECORDINGS:
        limit = 0
        if name.endswith("-oom"):
            base = next((r for r in got if r["recording"] == "gpt2-train" and "reserved_peak" in r), None)
            limit = int(OOM_SHARE * base["reserved_peak"]) if base else 256 << 20
        result = record(ctx, name, workload, conf, limit)
        got.append(result)
        (folder(ctx) / "results.json").write_text(json.dumps(got, indent=1))
        rows.append(row(result))
    errors = [r["recording"] for r in got if "error" in r]
    missing_oom = [r["recording"] for r in got if r["recording"].endswith("-oom") and "error" not in r and not r["oom"]]
    impl = sorted({r.get("impl", "?") for r in got if "error" not in r})
    status = (
        "ok"
        if not errors and not missing_oom
        else "failed: "
        + ", ".join(
            [f"{e}: {next(r['error'] for r in got if r['recording'] == e)}" for e in errors]
            + [f"{m} did not run out of memory" for m in missing_oom]
        )
    )
    header = [
        "recording",
        "PYTORCH_CUDA_ALLOC_CONF",
        "reserved peak",
        "allocated peak",
        "segment events",
        "OOM",
        "snapshot",
    ]
    pack(ctx, status, f"models: {', '.join(impl)}, size {ctx.size}\n\n" + table(header, rows))


def row(r: dict[str, Any]) -> list[str]:
    if "error" in r:
        return [r["recording"], "", "", "", "", "", r["error"]]
    events = ", ".join(f"{k.removeprefix('segment_')} {v}" for k, v in r.get("segment_events", {}).items() if v)
    return [
        r["recording"],
        r["alloc_conf"] or "(default)",
        f"{r['reserved_peak'] / (1 << 20):.1f} MiB",
        f"{r['allocated_peak'] / (1 << 20):.1f} MiB",
        events,
        "yes" if r["oom"] else "no",
        f"{r['snapshot_bytes'] / 1024:.0f} KiB",
    ]
