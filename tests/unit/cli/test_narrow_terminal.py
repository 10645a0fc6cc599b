"""On an 80-column terminal a path loses its start, never gets cut mid-word over several lines."""

from __future__ import annotations

import re

import pytest

from gpuflame.formats import save
from tests.helpers.cli import run
from tests.helpers.guide import guide_profile

LOCATION = re.compile(r"(\S+\.py):(\d+)")


@pytest.mark.parametrize(
    "command, extra",
    [("report", []), ("top", []), ("top", ["--by", "total"]), ("explain", ["_allocate_kv_cache_tensors"])],
)
def test_paths_stay_whole_or_keep_their_end(capsys, monkeypatch, tmp_path, command, extra):
    path = tmp_path / "guide.pb.gz"
    save(guide_profile(), path)
    monkeypatch.setenv("COLUMNS", "80")
    rc, out, err = run(capsys, command, path, *extra)
    assert rc == 0, err
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert any(line.rstrip().endswith("file:line") for line in lines), "the header is whole"
    found = LOCATION.findall(out)
    assert found
    for file, line in found:
        assert file.startswith(("…", "/", "vllm/", "torch/")), file
        assert int(line) in {1, 60, 80, 120, 150, 200, 300, 400, 500, 2010, 2100}
    # no fragment of a path on a line of its own (what folding mid-word leaves)
    assert not [line for line in lines if re.fullmatch(r"\s+[\w/.]*\.p?y?:?\d*\s*", line)]
