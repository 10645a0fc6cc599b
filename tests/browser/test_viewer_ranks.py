"""The viewer of a 2-rank DDP run (docs/examples/ddp.pb.gz): rank=0 and rank=1 in the label menu, each one's bytes.

The expected totals are read from the profile's samples by their ``rank``
label, apart from the viewer. With ``GPUFLAME_UPDATE_DOCS=1`` the test
writes its screenshot to docs/images/ddp-viewer.png (docs/distributed.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuflame.cli.main import main
from gpuflame.formats import load
from tests.browser.chrome_pipe import Chrome
from tests.browser.viewer_page import choose, open_viewer, settle
from tests.helpers.paths import REPO

DDP = REPO / "docs" / "examples" / "ddp.pb.gz"
DOCS_PICTURE = REPO / "docs" / "images" / "ddp-viewer.png"


@pytest.fixture(scope="module")
def html_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ranks") / "ddp.html"
    assert main(["view", str(DDP), "-o", str(out)]) == 0
    return out


def peak_of_rank(rank: str) -> int:
    profile = load(DDP)
    index = profile.type_index("peak_space")
    return sum(s.values[index] for s in profile.samples if s.label("rank") == rank)


def test_the_label_menu_offers_each_rank_and_keeps_its_bytes(chrome: Chrome, html_file: Path, tmp_path: Path) -> None:
    state = open_viewer(chrome, html_file)
    assert state["error"] is None, state["error"]
    options = chrome.evaluate(
        "[...document.querySelectorAll('#label-select option')].map(o => [o.value, o.textContent])"
    )
    texts = [text for _, text in options]
    assert {"rank=0", "rank=1", "world_size=2"} <= set(texts)
    for rank in ("1", "0"):  # rank 0 last: the picture shows the rank with the checkpoint copy
        value = next(v for v, text in options if text == f"rank={rank}")
        choose(chrome, "label-select", value)
        assert settle(chrome)["total"] == peak_of_rank(rank) > 0
    picture = chrome.screenshot()
    (tmp_path / "ddp-viewer.png").write_bytes(picture)
    assert picture[:8] == b"\x89PNG\r\n\x1a\n" and len(picture) > 10_000
    if os.environ.get("GPUFLAME_UPDATE_DOCS"):
        DOCS_PICTURE.write_bytes(picture)
