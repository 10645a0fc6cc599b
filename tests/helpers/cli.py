"""Run ``gpuflame`` in this process, as a user runs it, and read its exit code, stdout and stderr."""

from __future__ import annotations

import json

from gpuflame.cli.main import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """``gpuflame argv...`` in this process: (exit code, stdout, stderr)."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's own exits (--help, a wrong flag)
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys, *argv: str) -> dict:
    rc, out, err = run(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)
