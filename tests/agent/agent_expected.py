"""The profile a target's own log says the agent must produce, computed independently of the agent."""

from __future__ import annotations

from gpuflame.model import Profile
from gpuflame.symbols.names import display_name
from gpuflame.symbols.qualnames import display

Row = tuple[int, int, int, int, int, int]  # peak, peak_n, inuse, inuse_n, alloc, alloc_n
Key = tuple[str, str, tuple[tuple[str, str, int], ...]]  # pid, device, frames (name, file, line), leaf first

HANDLE_APIS = {"cuMemCreate", "cuMemRelease"}


def frames(stack: list[list]) -> tuple[tuple[str, str, int], ...]:
    """Names as in-process capture gives them: co_qualname, or recovered from the source (3.10)."""
    out = []
    for qualname, co_name, file, firstlineno, line in stack:
        name = display_name(qualname) if qualname else display(file, firstlineno, co_name)
        out.append((name, file, line))
    return tuple(out)


def replay(records: list[dict], pid_of: dict[int, str] | None = None) -> dict[Key, Row]:
    """Peak (a full copy at each new high, per pid and device), in use and allocated per stack."""
    live: dict[tuple[int, bool, int], tuple[Key, int]] = {}
    inuse: dict[Key, list[int]] = {}
    alloc: dict[Key, list[int]] = {}
    totals: dict[tuple[str, str], int] = {}
    highs: dict[tuple[str, str], int] = {}
    at_peak: dict[tuple[str, str], dict[Key, tuple[int, int]]] = {}
    for r in records:
        if r["op"] not in ("alloc", "free"):
            continue
        handle = r["api"] in HANDLE_APIS
        pid = (pid_of or {}).get(r["pid"], str(r["pid"]))
        if r["op"] == "alloc":
            key = (pid, r["device"], frames(r["stack"]))
            live[(r["pid"], handle, r["addr"])] = (key, r["size"])
            row = inuse.setdefault(key, [0, 0])
            row[0] += r["size"]
            row[1] += 1
            a = alloc.setdefault(key, [0, 0])
            a[0] += r["size"]
            a[1] += 1
            delta = r["size"]
        else:
            found = live.pop((r["pid"], handle, r["addr"]), None)
            if found is None:
                continue
            key, size = found
            inuse[key][0] -= size
            inuse[key][1] -= 1
            delta = -size
        group = (key[0], key[1])
        totals[group] = totals.get(group, 0) + delta
        if totals[group] > highs.get(group, 0):
            highs[group] = totals[group]
            at_peak[group] = {k: (v[0], v[1]) for k, v in inuse.items() if (k[0], k[1]) == group}
    out = {}
    for key, (b, n) in inuse.items():
        pb, pn = at_peak.get((key[0], key[1]), {}).get(key, (0, 0))
        out[key] = (pb, pn, b, n, alloc[key][0], alloc[key][1])
    return {k: v for k, v in out.items() if any(v)}


def rows(profile: Profile) -> dict[Key, Row]:
    """The agent's profile in the same shape."""
    out: dict[Key, Row] = {}
    compact = profile.compact()
    for s in compact.samples:
        key = (
            s.label("pid") or "",
            s.label("device") or "",
            tuple((f.name, f.file, f.line) for f in compact.stack_frames(s)),
        )
        out[key] = tuple(s.values)  # type: ignore[assignment]
    return out
