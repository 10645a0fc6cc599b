"""A JAX device-memory profile names no default sample type: it opens on space, as pprof opens it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuflame.formats.load_save import load
from gpuflame.model import Profile
from gpuflame.model.profile import SampleType
from tests.helpers.paths import DATA

FIXTURE = str(DATA / "jax-0.10.2-cpu-device-memory.prof")


def test_a_profile_without_default_type_opens_on_its_last_type_as_pprof_does() -> None:
    profile = Profile(sample_types=[SampleType("allocations", "count"), SampleType("space", "bytes")])
    assert profile.default_type is None
    assert profile.pick_type() == 1


def test_the_real_jax_file_is_ranked_by_space_not_by_allocation_count() -> None:
    profile = load(FIXTURE)
    assert [t.type for t in profile.sample_types] == ["allocations", "space"]
    assert profile.default_type is None
    assert profile.sample_types[profile.pick_type()].type == "space"


@pytest.mark.subprocess
def test_report_headlines_space_on_the_real_jax_file() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpuflame", "report", FIXTURE, "--json"], capture_output=True, text=True, check=True
    )
    doc = json.loads(out.stdout)
    assert doc["sample_type"] == "space", doc.get("sample_type")
    total = sum(s.values[1] for s in load(FIXTURE).samples)
    assert doc["total"] == total
