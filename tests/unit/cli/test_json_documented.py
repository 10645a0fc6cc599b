"""Every key ``report --json`` and ``top --json`` print is documented in docs/formats.md.

A script reads these keys; a key that is not on the page (``widest_roots``' ``trunk``,
``devices_together``, ``at_joint_peak_by_category``) was a key the user had to guess at.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuflame.formats import save
from gpuflame.model import Frame, Profile, memory_sample_types
from gpuflame.model.peak import PeakUnit
from gpuflame.model.phases import PhaseStat
from gpuflame.model.processes import ProcessInfo
from gpuflame.model.timeline import Timeline
from tests.helpers.cli import run_json
from tests.helpers.paths import REPO

T0 = 1_767_225_600_000_000_000
SNAPSHOT = REPO / "tests" / "data" / "torch-snapshot-silmont2000-mem_snapshot.pickle.gz"  # fragmented, traced
DATA_KEYED = ("_by_category",)  # objects whose keys are data (category names), not fields


def two_ranks_two_devices() -> Profile:
    """Two ranks, each on its own device, with categories, phases and a timeline: the report's every section."""
    p = Profile(sample_types=memory_sample_types())
    for rank in (0, 1):
        pid, device = str(700 + rank), f"cuda:{rank}"
        step = [Frame("Model > step", "train.py", 9, start_line=7), Frame("<module>", "train.py", 20, start_line=1)]
        p.add(
            step,
            [(rank + 1) * 4096, 1, 1024, 1, 8192, 2],
            {"pid": pid, "rank": rank, "device": device, "phase": "train"},
        )
        p.add(step[1:], [512, 1, 512, 1, 512, 1], {"pid": pid, "rank": rank, "device": device, "category": "parameter"})
        p.processes.append(ProcessInfo(pid, rank=str(rank), argv=("python3", "train.py"), peak=(rank + 1) * 4096))
        p.phases.append(PhaseStat("train", device, pid, T0, T0 + 10**9, 4096, T0 + 5, 1024, "Model > step", 4096, 1))
    p.timeline = Timeline(
        {
            (("device", "cuda:0"), ("pid", "700")): [(T0, 4608), (T0 + 10**9, 1536)],
            (("device", "cuda:1"), ("pid", "701")): [(T0, 1024), (T0 + 10**9, 8704)],
        }
    )
    p.peaks = [PeakUnit(f"cuda:{r}", "process", T0, T0 + 10**9, pid=str(700 + r)) for r in (0, 1)]
    return p


def keys_of(value: object) -> set[str]:
    """Every key of every object in *value*, except inside objects keyed by data."""
    if isinstance(value, list):
        return set().union(*map(keys_of, value)) if value else set()
    if not isinstance(value, dict):
        return set()
    found = set(value)
    for key, inner in value.items():
        if not key.endswith(DATA_KEYED):
            found |= keys_of(inner)
    return found


def documented() -> set[str]:
    """The code spans of the formats page's section on these two commands."""
    page = (REPO / "docs" / "formats.md").read_text()
    section = page[page.index("## `report --json` and `top --json`") :]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    return set(re.findall(r"`([a-z_]+)`", section))


def test_every_key_the_json_outputs_print_is_on_the_formats_page(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    save(two_ranks_two_devices(), tmp_path / "ranks.pb.gz")
    ranks, snapshot = tmp_path / "ranks.pb.gz", SNAPSHOT
    outputs = [
        run_json(capsys, "report", path, *more) for path in (ranks, snapshot) for more in ([], ["--type", "inuse"])
    ]
    outputs += [run_json(capsys, "top", path, "--by", by) for path in (ranks, snapshot) for by in ("self", "total")]
    outputs += [run_json(capsys, "top", ranks, "--by", by) for by in ("category", "phase")]
    outputs.append(run_json(capsys, "report", snapshot, "--at", "peak"))
    first = outputs[0]
    assert first["uneven"] and first["processes"] and first["by_phase"] and first["by_category"]
    assert first["peak"]["devices_together"] and first["widest_roots"][0]["trunk"]
    assert outputs[2]["fragmentation_hint"] and outputs[2]["reserved_peak"] and outputs[-1]["moment"]
    printed = set().union(*map(keys_of, outputs))
    assert printed - documented() == set()


def test_each_field_of_a_peak_unit_is_on_the_formats_page() -> None:
    """``peak.devices`` entries carry the PeakUnit's fields that differ from the default: any of them."""
    from dataclasses import fields

    assert {f.name for f in fields(PeakUnit)} - documented() == set()


def test_each_field_of_run_json_is_on_the_formats_page() -> None:
    """``gpuflame run --json`` prints the run's RunMeta (the store's meta.json): every field is named."""
    from dataclasses import fields

    from gpuflame.launch.store import RunMeta

    assert {f.name for f in fields(RunMeta)} - documented() == set()
    assert {"pid", "why", "missing_s"} - documented() == set()
