"""Hostile names never reach the terminal raw: every command's text output escapes control characters.

A profile is untrusted input: its frame names, file names, comments, labels
and sample-type names can hold ESC sequences (screen clear, a fake prompt, an
OSC title), carriage returns and newlines (fake lines), C1 controls, bidi
overrides, and rich markup. Each command's stdout and stderr is checked for
any of those characters, raw.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuflame.formats import save
from gpuflame.model import Frame, Profile, SampleType, memory_sample_types
from gpuflame.model.phases import PhaseStat
from gpuflame.printable import printable
from tests.helpers.cli import run
from tests.helpers.escapes import RAW

ESC_NAME = "evil\x1b[2J\x1b[Hfn"  # clear the screen, home the cursor
OSC_FILE = "/srv/\x1b]0;owned\x07/site-packages/pkg/m\u202egnp.py"  # window title, a bidi override
MARKUP_NAME = "[bold red]loud[/bold red] [/] :smile:"  # rich markup and an emoji code, shown as written
CR_NAME = "ok\rFAKE LINE\nfake: prompt$ \x9b31m\x7f"  # carriage return, newline, a C1 CSI, DEL
COMMENT = "note\x1b[31m in red\r\nfake: line\x85next"
LABEL = "cuda\x1b[8m:0"


def hostile_profile() -> Profile:
    profile = Profile(sample_types=memory_sample_types())
    profile.default_type = "peak_space"
    entry = Frame("<module>", "/app/main.py", 1, start_line=1)
    stacks = [
        [entry, Frame(ESC_NAME, OSC_FILE, 7, start_line=5), Frame(CR_NAME, "/app/x\x1b[1m.py", 3)],
        [entry, Frame(MARKUP_NAME, "/app/[red]m.py", 9)],
        [entry, Frame(ESC_NAME, OSC_FILE, 8, start_line=5)],
    ]
    for i, root_first in enumerate(stacks):
        size = (i + 1) << 20
        labels = {"device": LABEL, "pid": "7\x1b[K", "category": "kv\x1b[5m", "phase": "load\x07"}
        profile.add(root_first[::-1], [size, 1, size, 1, size, 1], labels)
    profile.comments.append(COMMENT)
    profile.phases.append(
        PhaseStat("load\x1b[2J", device=LABEL, pid="7", start=1, end=2, peak=5, top=ESC_NAME, top_bytes=5)
    )
    return profile


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    path = tmp_path / "hostile.pb.gz"
    save(hostile_profile(), path)
    return path


def assert_clean(rc: int, out: str, err: str) -> None:
    assert rc == 0, err
    leaked = sorted({hex(ord(c)) for c in RAW.findall(out + err)})
    assert leaked == [], f"raw controls reached the terminal: {leaked}\n{out}{err}"


@pytest.mark.parametrize(
    "argv",
    [
        ["report"],
        ["report", "--lines"],
        ["top"],
        ["top", "--by", "total"],
        ["top", "--by", "category"],
        ["top", "--by", "phase"],
        ["flame"],
        ["flame", "--expand"],
        ["explain", "evil"],
        ["explain", "loud"],
        ["report", "--ignore", "nothing\x1b[2Jmatches"],
        ["report", "--hide", "nothing\x1b[2J"],
    ],
)
def test_every_analysis_command_escapes_hostile_names(capsys, hostile, argv):
    command, *rest = argv
    rc, out, err = run(capsys, command, hostile, *rest)
    assert_clean(rc, out, err)
    assert "\\x1b" in out + err, "the escape is shown, as text"


@pytest.mark.parametrize("command", ["report", "top", "flame", "diff"])
def test_hostile_sample_type_names_are_escaped(capsys, tmp_path, command):
    profile = Profile(sample_types=[SampleType("evil\x1b[2J_space", "bytes"), SampleType("n\x9b2J", "count")])
    profile.add([Frame("f", "/a.py", 1)], [1 << 20, 1])
    path = tmp_path / "types.pb.gz"
    save(profile, path)
    rc, out, err = run(capsys, command, path, *([path] if command == "diff" else []))
    assert_clean(rc, out, err)
    assert "n\\x9b2J" in out  # the type shown: no default named, so the last, as pprof opens it
    if command == "report":  # its totals table lists every type
        assert "evil\\x1b[2J_space" in out


def test_rich_markup_in_a_name_is_shown_as_written(capsys, hostile):
    rc, out, err = run(capsys, "top", hostile, "-n", "50")
    assert_clean(rc, out, err)
    assert "[bold red]loud[/bold red] [/] :smile:" in out


def test_the_profile_comment_is_one_escaped_line(capsys, hostile):
    rc, out, err = run(capsys, "report", hostile)
    assert_clean(rc, out, err)
    assert "note: note\\x1b[31m in red\\r\\nfake: line\\x85next" in out


def test_diff_and_export_and_view_escape(capsys, hostile, tmp_path):
    other = tmp_path / "base\x1b[2J.pb.gz"
    profile = hostile_profile()
    profile.add([Frame("grown\x1b]8;;http://x\x07", "/a\x1b.py", 1)], [1 << 20] * 6, {"device": LABEL})
    save(profile, other)
    assert_clean(*run(capsys, "diff", other, hostile))
    assert_clean(*run(capsys, "export", hostile, "-o", tmp_path / "out\x1b[2J.folded"))
    assert_clean(*run(capsys, "view", other, "-o", tmp_path / "v\x07.html"))


def test_an_error_that_quotes_the_file_is_escaped(capsys, tmp_path):
    bad = tmp_path / "bad\x1b[2J.folded"
    bad.write_text("a;b\x1b[2J;c notacount\n")
    rc, out, err = run(capsys, "report", bad)
    assert rc == 2
    assert RAW.findall(out + err) == []
    assert err.count("\n") == 1 and "\\x1b[2J" in err


def test_a_label_filter_that_matches_nothing_escapes_the_values(capsys, hostile):
    rc, out, err = run(capsys, "report", hostile, "--label", "device=none")
    assert rc == 2 and RAW.findall(out + err) == []
    assert "cuda\\x1b[8m:0" in err


# -- the function itself ------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, shown",
    [
        ("plain text, ünïcode, 日本, emoji 🔥", "plain text, ünïcode, 日本, emoji 🔥"),
        ("a\x1b[2Jb", "a\\x1b[2Jb"),
        ("\r\n\t\x00\x7f", "\\r\\n\\t\\x00\\x7f"),
        ("c1 \x9b \x85", "c1 \\x9b \\x85"),
        ("bidi \u202e \u2066 \u200f", "bidi \\u202e \\u2066 \\u200f"),
        ("lines \u2028 \u2029", "lines \\u2028 \\u2029"),
        ("lone \udc80 surrogate", "lone \\udc80 surrogate"),  # a file name read with surrogateescape
        ("C:\\Users\\me", "C:\\Users\\me"),  # backslashes stay as they are
    ],
)
def test_printable(raw, shown):
    assert printable(raw) == shown


def test_printable_bounds_an_excerpt():
    assert printable("x" * 500, limit=200) == "x" * 200 + "…"
    assert printable("\x1b" * 500, limit=3) == "\\x1b" * 3 + "…"
    assert printable("short", limit=200) == "short"


# -- path shortening is linear ----------------------------------------------------------------

SHORT_PATH_UNDER_CPU_LIMIT = textwrap.dedent("""
    import math, resource, sys
    from gpuflame.render.terminal import short_path
    used = resource.getrusage(resource.RUSAGE_SELF)
    limit = math.ceil(used.ru_utime + used.ru_stime) + int(sys.argv[1])  # the imports do not count
    resource.setrlimit(resource.RLIMIT_CPU, (limit, limit))
    path = "/a" * 200_000 + "/site-packages" + "x" * 50_000  # 450 KB, no separator after site-packages
    assert short_path(path) == path
    assert short_path(path + "/dist-packages/torch/nn.py") == "torch/nn.py"
    print("done")
""")


@pytest.mark.subprocess
def test_short_path_is_linear_on_a_hostile_path():
    """The old ``.*[/\\\\](?:site|dist)-packages`` regex backtracked: 67 s on a 40 KB path, hours on this one.

    A resource bound, not a timing: the child may spend 5 CPU-seconds on a
    450 KB path. The linear scan takes milliseconds (over 1000x less); the
    regex took 0.37 s on 8 KB and grows with the square of the length (about
    20 minutes here), so it is killed by SIGXCPU.
    """
    proc = subprocess.run(
        [sys.executable, "-c", SHORT_PATH_UNDER_CPU_LIMIT, "5"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr[-500:]


@pytest.mark.parametrize(
    "path, short",
    [
        ("/usr/lib/python3/site-packages/vllm/v1/core.py", "vllm/v1/core.py"),
        ("C:\\py\\Lib\\site-packages\\torch\\nn.py", "torch\\nn.py"),
        ("/venv/lib/site-packages/a/dist-packages/b.py", "b.py"),  # the last one, as before
        ("/app/my-site-packages/x.py", "/app/my-site-packages/x.py"),
        ("/app/site-packages", "/app/site-packages"),
        ("site-packages/x.py", "site-packages/x.py"),
        ("/app/main.py", "/app/main.py"),
    ],
)
def test_short_path_keeps_its_meaning(path, short):
    from gpuflame.render.terminal import short_path

    assert short_path(path) == short


def test_the_agents_notes_are_escaped(capsys, tmp_path):
    """The node agent's notes can name a container's files: its summary escapes them like everything else."""
    import argparse

    from gpuflame.cli.agent import _say

    comments = ["recorded by gpuflame agent", "lost: /proc/7/root/opt/lib\x1b]0;x\x07cuda.so.1 unreadable"]
    totals = {"peak_space": 1, "inuse_space": 1}
    _say(argparse.Namespace(json=False), tmp_path / "p.pb.gz", comments, totals, [7], stop={}, losses={}, holds={})
    err = capsys.readouterr().err
    assert RAW.findall(err) == [] and "lib\\x1b]0;x\\x07cuda" in err


# -- a name or a note as long as a file is shown cut ---------------------------------------------------------

LONG = 200_000  # characters: a 4 MB name once took 110 s in report's tables (rich folds it over thousands of lines)


@pytest.fixture
def long_names(tmp_path: Path) -> Path:
    profile = Profile(sample_types=[SampleType("inuse_space", "bytes")], comments=["c" * LONG + "NOTE_END"])
    leaf = Frame("f" + "x" * LONG + "NAME_END", "/app/a.py", 2)
    profile.add([leaf, Frame("<module>", "/app/a.py", 1)], [4096], {"pid": "7" * LONG + "LABEL_END"})
    profile.add([Frame("g", "/app/a.py", 3), Frame("<module>", "/app/a.py", 1)], [1024], {"pid": "8"})
    path = tmp_path / "long.pb.gz"
    save(profile, path)
    return path


@pytest.mark.parametrize(
    "argv",
    [["report"], ["top"], ["top", "--by", "total"], ["flame"], ["explain", "f"], ["flame", "--group-by", "pid"]],
)
def test_a_long_name_note_or_label_is_cut_on_the_terminal(capsys, long_names, argv):
    command, *rest = argv
    rc, out, err = run(capsys, command, long_names, *rest)
    assert rc == 0, err[-500:]
    assert [end for end in ("NAME_END", "NOTE_END", "LABEL_END") if end in out] == []
    assert "…" in out and len(out) < LONG // 4, len(out)
