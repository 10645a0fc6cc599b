"""Put what each documented command prints into the pages, from a real run of it.

A page shows a command's output under a marker that names the command:

    <!-- gpuflame-output: report docs/examples/demo.pb.gz -->
    ```text
    $ gpuflame report docs/examples/demo.pb.gz
    ...what it printed...
    ```

and ``lines=N`` after ``gpuflame-output`` keeps only the first N lines (the start of a long
report). This script runs each command with this checkout's gpuflame, at a fixed width and
without colour, and rewrites the block under its marker; ``make docs`` runs it before
building the site, so the pages cannot drift from the program, and ``--check`` (the test
suite) fails on a page whose block no longer matches. The inputs are files of the
repository (``docs/examples/``: real runs of the demo; ``tests/data/``), so anyone can
run the same command from a clone.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/*.md")
WIDTH = 100
MARKER = re.compile(
    r"^<!-- gpuflame-output(?: lines=(?P<lines>\d+))?: (?P<args>[^\n]*?) -->\n"
    r"```text\n(?P<body>.*?)^```$",
    re.M | re.S,
)


def run(args: str, lines: int | None) -> str:
    """What ``gpuflame ARGS`` prints here (stdout then stderr), as the block's text."""
    env = {**os.environ, "COLUMNS": str(WIDTH), "NO_COLOR": "1", "TERM": "dumb"}
    env.pop("FORCE_COLOR", None)
    done = subprocess.run(
        [sys.executable, "-m", "gpuflame", *shlex.split(args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode not in (0, 1):
        raise SystemExit(f"gpuflame {args}: exit {done.returncode}: {done.stderr.strip()}")
    out = [line.rstrip() for line in (done.stdout + done.stderr).splitlines()]
    if lines is not None and len(out) > lines:
        out = [*out[:lines], "..."]
    command = f"gpuflame {args}"
    if not out or out[0] != command:  # report heads its screen with its own command line
        out.insert(0, f"$ {command}")
    return "\n".join(out) + "\n"


def refresh(text: str) -> str:
    """The page with every marked block replaced by its command's output now."""

    def block(match: re.Match[str]) -> str:
        lines = int(match["lines"]) if match["lines"] else None
        head = match.group(0).split("\n", 1)[0]
        return f"{head}\n```text\n{run(match['args'], lines)}```"

    return MARKER.sub(block, text)


def pages() -> list[Path]:
    return sorted(p for pattern in PAGES for p in ROOT.glob(pattern))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    options = parser.parse_args(argv)
    stale = []
    for page in pages():
        text = page.read_text()
        if not MARKER.search(text):
            continue
        new = refresh(text)
        if new != text:
            stale.append(page.relative_to(ROOT))
            if not options.check:
                page.write_text(new)
    for page in stale:
        print(f"{'stale' if options.check else 'rewrote'}: {page}")
    return 1 if options.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
