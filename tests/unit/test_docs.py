"""The documentation holds together without MkDocs: pages in nav exist, relative links resolve.

`make docs` (mkdocs build --strict) checks the same and more, but needs the
docs extra installed; this runs with the test suite, offline, in well under a
second, so a page moved or renamed without its links breaks a test at once.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.paths import REPO

ROOT = REPO
DOCS = ROOT / "docs"
README = ROOT / "README.md"

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def nav_pages() -> list[str]:
    """Every page named in mkdocs.yml's nav, as paths under docs/."""
    pages: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, str):
            pages.append(node)
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)

    walk(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    return [p for p in pages if not re.match(r"[a-z]+://", p)]


def doc_files() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def prose(text: str) -> str:
    """The text outside code blocks and code spans, where links are links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc (MkDocs) gives a heading."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCE.sub("", page.read_text()))}


def relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text())) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_every_page_in_nav_exists_and_every_page_is_in_nav() -> None:
    named = nav_pages()
    assert named, "mkdocs.yml has no nav"
    assert [p for p in named if not (DOCS / p).is_file()] == []
    assert sorted({p.relative_to(DOCS).as_posix() for p in doc_files()} - set(named)) == []


@pytest.mark.parametrize("page", [README, *doc_files()], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif page.is_relative_to(DOCS) and not dest.is_relative_to(DOCS):
            broken.append(f"{target}: outside docs/, not on the site (name it as code instead)")
        elif anchor and dest.suffix == ".md" and dest.is_relative_to(DOCS) and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
    assert broken == []


def test_the_checker_sees_a_broken_link_and_a_broken_anchor(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A `code` title\n\n[ok](#a-code-title) [gone](missing.md) `[not a](link.md)`\n```\n[nor](this.md)\n```\n"
    )
    assert relative_links(page) == ["#a-code-title", "missing.md"]
    assert anchors(page) == {"a-code-title"}


def test_readme_starts_with_the_two_make_commands_and_stays_short() -> None:
    """A fresh machine needs two commands (CI's .ci/run calls the second); the manual lives in docs/."""
    text = README.read_text()
    first_block = FENCE.search(text)
    assert first_block and text[: first_block.start()].strip() == "# gpuflame"
    commands = [line.split("#")[0].strip() for line in first_block.group(0).splitlines()[1:-1]]
    assert commands == ["make demo", "make test"]
    assert len(text.splitlines()) <= 250
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "make test" in ci and ci.index("make test") < ci.index("make docs")


def test_the_api_page_reads_sphinx_roles_as_code() -> None:
    """docs/hooks/sphinx_roles.py (griffe: pinned in the test extra too) turns :func:`x` into `x`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sphinx_roles", DOCS / "hooks" / "sphinx_roles.py")
    assert spec and spec.loader
    roles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roles)
    text = "Returns a :class:`Recording`; see :func:`~gpuflame.stop` and ``store=True``."
    assert roles.plain(text) == "Returns a `Recording`; see `gpuflame.stop` and `store=True`."


def command_outputs() -> Any:
    """docs/hooks/command_outputs.py, the script that runs each documented command into its page."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("command_outputs", DOCS / "hooks" / "command_outputs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.subprocess
def test_every_shown_output_is_what_the_command_prints_now(capsys: pytest.CaptureFixture[str]) -> None:
    """A page's output block is rerun and compared: a change to what a command prints fails here
    until `make docs` (or `python docs/hooks/command_outputs.py`) writes the pages again."""
    script = command_outputs()
    shown = [p for p in script.pages() if script.MARKER.search(p.read_text())]
    names = {p.name for p in shown}
    assert {"README.md", "reading-flame-graphs.md", "simulate.md"} <= names
    assert script.main(["--check"]) == 0, capsys.readouterr().out


def test_the_readme_quick_start_shows_the_start_of_the_report() -> None:
    text = README.read_text()
    quick = text[text.index("## Quick start") :]
    marker = command_outputs().MARKER.search(quick)
    assert marker and marker["args"].startswith("report ") and marker["lines"]
    assert "Totals by sample type" in marker["body"]


@pytest.mark.subprocess
def test_a_stale_block_is_rewritten_with_the_real_output(tmp_path: Path) -> None:
    script = command_outputs()
    page = "intro\n<!-- gpuflame-output: --version -->\n```text\nold words\n```\nafter\n"
    new = script.refresh(page)
    import gpuflame

    assert new == "intro\n<!-- gpuflame-output: --version -->\n```text\n$ gpuflame --version\n" + (
        f"gpuflame {gpuflame.__version__}\n```\nafter\n"
    )


def test_every_limit_variable_is_in_the_formats_page_with_its_default() -> None:
    """docs/formats.md lists each GPUFLAME_MAX_* of gpuflame.limits, and no variable that is not one."""
    from gpuflame import limits

    page = (REPO / "docs" / "formats.md").read_text()
    rows = dict(re.findall(r"^\| `(GPUFLAME_MAX_[A-Z_]+)` \| ([^|]+) \|", page, re.MULTILINE))
    assert set(rows) == {limit.env for limit in limits.ALL}
    for limit in limits.ALL:
        shown = rows[limit.env].strip()
        value = int(shown.replace(",", "")) if shown[0].isdigit() and " " not in shown else None
        if value is None:  # 1 GiB, 8 MiB, 256 MiB
            number, unit = shown.split()
            value = int(number) << {"KiB": 10, "MiB": 20, "GiB": 30}[unit]
        assert value == limit.default, limit.env
