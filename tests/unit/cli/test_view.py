"""``gpuflame view``: the HTML file itself, without a browser (tests/browser/ runs it)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
from pathlib import Path

import pytest

from gpuflame.cli.view import default_output
from gpuflame.formats import save
from gpuflame.render.html import decode_payload, render_html
from tests.helpers.cli import run
from tests.helpers.viewer_profiles import (
    DATA_ELEMENT,
    XSS_COMMENT_FILE,
    XSS_IMG,
    XSS_LABEL,
    XSS_SCRIPT,
    embedded,
    viewer_profile,
)


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    path = tmp_path / "run.pb.gz"
    save(viewer_profile(), path)
    return path


@pytest.fixture
def page(profile_file: Path, capsys) -> str:
    rc, _, err = run(capsys, "view", profile_file)
    assert rc == 0, err
    return profile_file.with_name("run.html").read_text(encoding="utf-8")


def test_writes_one_file_next_to_the_input_and_says_where(profile_file: Path, capsys) -> None:
    rc, out, err = run(capsys, "view", profile_file)
    assert rc == 0 and not err
    html = profile_file.with_name("run.html")
    assert sorted(p.name for p in profile_file.parent.iterdir()) == ["run.html", "run.pb.gz"]
    assert str(html) in out and html.resolve().as_uri() in out


def test_json_says_what_was_written(profile_file: Path, tmp_path: Path, capsys) -> None:
    """README: every command takes --json; view's is the written paths and the profile's summary."""
    picture = tmp_path / "flame.svg"
    rc, out, err = run(capsys, "view", profile_file, "--svg", picture, "--type", "inuse", "--json")
    assert rc == 0 and not err
    written = json.loads(out)
    html = profile_file.with_name("run.html")
    assert written["output"] == str(html) and written["uri"] == html.resolve().as_uri()
    assert written["bytes"] == html.stat().st_size and written["diff_base"] is None
    assert written["svg"] == {"output": str(picture), "bytes": picture.stat().st_size, "sample_type": "inuse_space"}
    profile = viewer_profile()
    assert {k: v["total"] for k, v in written["totals"].items()} == profile.totals()
    assert written["samples"] == len(profile.samples) and written["default_type"] == "inuse_space"
    rc, out, _ = run(capsys, "view", profile_file, profile_file, "-o", tmp_path / "d.html", "--json")
    assert rc == 0 and json.loads(out)["diff_base"] == str(profile_file)


def test_output_option(profile_file: Path, tmp_path: Path, capsys) -> None:
    out_path = tmp_path / "sub.html"
    rc, out, _ = run(capsys, "view", profile_file, "-o", out_path)
    assert rc == 0 and out_path.exists() and str(out_path) in out


def test_a_profile_whose_name_is_not_utf8_opens(profile_file: Path, tmp_path: Path, capsys) -> None:
    """The page's title is the file's name: b'run\\xff' (read as 'run\\udcff') was an internal error."""
    import os

    odd = tmp_path / os.fsdecode(b"run\xff.pb.gz")
    odd.write_bytes(profile_file.read_bytes())
    for argv in ([odd], [odd, profile_file]):  # the profile, and a diff with it as the base
        rc, out, err = run(capsys, "view", *argv, "-o", tmp_path / "page.html", "--force")
        assert rc == 0, err
        payload = DATA_ELEMENT.search((tmp_path / "page.html").read_text()).group(1)
        assert "run\ufffd.pb.gz" in json.dumps(decode_payload(payload), ensure_ascii=False)


@pytest.mark.parametrize(
    ("given", "expected"),
    [("run.pb.gz", "run.html"), ("a/b.folded", "a/b.html"), ("snap.pickle", "snap.html"), ("x", "x.html")],
)
def test_default_output_name(given: str, expected: str) -> None:
    assert default_output(given) == expected


def test_no_url_outside_comments(page: str) -> None:
    without_comments = re.sub(r"<!--.*?-->", "", page, flags=re.S)
    without_comments = re.sub(r"/\*.*?\*/", "", without_comments, flags=re.S)
    assert not re.search(r"https?://", without_comments)
    assert "src=" not in without_comments.replace("'none'", "")  # no external script, image or frame


def test_one_inline_script_allowed_by_its_hash(page: str) -> None:
    scripts = re.findall(r"<script>(.*?)</script>", page, flags=re.S)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in page
    assert "default-src 'none'" in page and "connect-src 'none'" in page


def test_embeds_every_sample_type_and_label(page: str) -> None:
    data = embedded(page)
    assert [t for t, _ in data["types"]] == [
        "peak_space",
        "peak_objects",
        "inuse_space",
        "inuse_objects",
        "alloc_space",
        "alloc_objects",
    ]
    assert len(data["samples"]["values"]) == 6
    assert all(len(col) == len(data["samples"]["stack"]) for col in data["samples"]["values"])
    labels = {tuple(pair) for s in data["labelSets"] for pair in s}
    assert ("device", XSS_LABEL) in labels and ("pid", "2") in labels
    assert "LlamaMLP > __init__" in data["frames"]["name"]
    assert data["types"][data["defaultType"]][0] == "peak_space"


def test_type_option_sets_the_first_shown(profile_file: Path, capsys) -> None:
    rc, _, err = run(capsys, "view", profile_file, "--type", "inuse")
    assert rc == 0, err
    data = embedded(profile_file.with_name("run.html").read_text())
    assert data["types"][data["defaultType"]][0] == "inuse_space"


def test_user_text_never_appears_raw(page: str) -> None:
    for text in (XSS_IMG, XSS_SCRIPT, XSS_LABEL, XSS_COMMENT_FILE, "alert("):
        assert text not in page
    assert page.count("</script>") == 2  # the data element and the viewer script
    data = embedded(page)
    assert XSS_IMG in data["frames"]["name"] and XSS_SCRIPT in data["frames"]["name"]


def test_filters_apply(profile_file: Path, capsys) -> None:
    rc, _, err = run(capsys, "view", profile_file, "--hide-trampolines", "--label", "pid=1")
    assert rc == 0, err
    data = embedded(profile_file.with_name("run.html").read_text())
    assert "<interpreter trampoline>" not in data["frames"]["name"]
    assert XSS_IMG not in data["frames"]["name"]


def test_same_input_same_output(profile_file: Path, capsys) -> None:
    run(capsys, "view", profile_file)
    first = profile_file.with_name("run.html").read_bytes()
    run(capsys, "view", profile_file)
    assert profile_file.with_name("run.html").read_bytes() == first


@pytest.mark.parametrize("content", [b"\x00\x01garbage\xff\xfe", b"not a profile at all\n"])
def test_bad_input_is_exit_2_and_one_line(tmp_path: Path, capsys, content: bytes) -> None:
    bad = tmp_path / "bad.pb.gz"
    bad.write_bytes(content)
    rc, out, err = run(capsys, "view", bad)
    assert rc == 2 and not out
    assert err.count("\n") == 1 and err.startswith("gpuflame view: error:")
    assert not (tmp_path / "bad.html").exists()


def test_missing_file_is_exit_2(tmp_path: Path, capsys) -> None:
    rc, _, err = run(capsys, "view", tmp_path / "nope.pb.gz")
    assert rc == 2 and err.count("\n") == 1


def test_unwritable_output_is_exit_2(profile_file: Path, tmp_path: Path, capsys) -> None:
    rc, _, err = run(capsys, "view", profile_file, "-o", tmp_path / "no" / "such" / "dir.html")
    assert rc == 2 and err.count("\n") == 1


def test_view_also_writes_the_svg_picture(tmp_path) -> None:
    import xml.etree.ElementTree as ET

    from gpuflame.cli.main import main as gpuflame_main
    from gpuflame.formats import save
    from gpuflame.model import Frame, Profile, SampleType

    p = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    p.add([Frame("LlamaMLP > __init__", "/m.py", 3), Frame("<module>", "/m.py", 1)], [4096])
    src = tmp_path / "p.pb.gz"
    save(p, src)
    assert gpuflame_main(["view", str(src), "-o", str(tmp_path / "p.html"), "--svg", str(tmp_path / "p.svg")]) == 0
    texts = [t.text for t in ET.parse(tmp_path / "p.svg").iter("{http://www.w3.org/2000/svg}title")]
    assert any(t and t.startswith("LlamaMLP > __init__") for t in texts)


def test_two_files_write_one_offline_diff_page_embedding_both(profile_file: Path, tmp_path: Path, capsys) -> None:
    from tests.helpers.viewer_profiles import WARMUP, base_profile

    base = tmp_path / "base.pb.gz"
    save(base_profile(), base)
    rc, out, err = run(capsys, "view", base, profile_file)
    assert rc == 0 and not err and "diff against" in out
    html = profile_file.with_name("run.html").read_text(encoding="utf-8")  # named after NEW
    data = embedded(html)
    names = data["frames"]["name"]
    assert WARMUP.name in names and XSS_IMG in names  # one frame table for both
    assert len(set(names)) == len(names)
    assert data["base"]["samples"]["values"] and len(data["base"]["samples"]["values"]) == len(data["types"])
    assert max(data["base"]["samples"]["stack"]) < len(data["stacks"]["parent"])  # one stack table too
    assert data["title"] == "base.pb.gz \u2192 run.pb.gz"
    test_no_url_outside_comments(html)
    test_user_text_never_appears_raw(html)


def test_bad_second_file_is_exit_2_and_one_line(profile_file: Path, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "new.pb.gz"
    bad.write_bytes(b"\x00\x01garbage\xff\xfe")
    rc, out, err = run(capsys, "view", profile_file, bad, "-o", tmp_path / "d.html")
    assert rc == 2 and not out
    assert err.count("\n") == 1 and err.startswith("gpuflame view: error:")
    assert not (tmp_path / "d.html").exists()


def test_three_files_are_exit_2(profile_file: Path, capsys) -> None:
    rc, _, err = run(capsys, "view", profile_file, profile_file, profile_file)
    assert rc == 2 and err.count("\n") == 1


def test_render_html_diff_signature_for_serve() -> None:

    from tests.helpers.viewer_profiles import base_profile

    page = render_html(viewer_profile(), "t", base=base_profile())
    assert embedded(page)["base"]["samples"]["stack"]
    assert "base" not in embedded(render_html(viewer_profile(), "t"))


def test_the_page_ships_each_stack_prefix_once_and_its_numbers_as_binary() -> None:
    from tests.helpers.large_profile import tree_profile

    profile = tree_profile(2000)  # 2,000 functions, stacks ~20 deep: ~40,000 frame ids as a list per stack
    payload = DATA_ELEMENT.search(render_html(profile, "t")).group(1)
    data = decode_payload(payload)
    assert len(data["stacks"]["parent"]) == len(data["stacks"]["frame"]) == 2001  # a node per function, the root
    assert sorted(data["samples"]["values"][0]) == sorted(s.values[0] for s in profile.samples)
    body = gzip.decompress(base64.b64decode(payload))
    head = body[4 : 4 + int.from_bytes(body[:4], "little")]
    strings = sum(len(json.dumps(n)) + 1 for n in data["frames"]["name"] + data["files"])
    assert len(head) < strings + 2000  # names and files, and no numbers written out as text


def test_frames_no_kept_sample_uses_are_not_shipped() -> None:
    """A frame only under all-zero samples, or in the table and under none, is not in the page's frame table."""
    from gpuflame.model import Frame, Profile, SampleType

    profile = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    profile.add([Frame("kept", "/a.py", 3), Frame("<module>", "/a.py", 9)], [100])
    profile.add([Frame("zero", "/a.py", 5), Frame("<module>", "/a.py", 9)], [0])
    profile.frame_id(Frame("unused", "/b.py", 1))
    data = decode_payload(DATA_ELEMENT.search(render_html(profile, "t")).group(1))
    assert sorted(data["frames"]["name"]) == ["<module>", "kept"]
    assert data["files"] == ["/a.py"]


def test_a_large_profile_goes_to_the_page_as_columns_and_gives_the_same_page(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading 5,000 samples keeps them as arrays (model/columns.py); the page never builds a Sample or stack tuple."""
    from gpuflame.formats import load, pprof_samples
    from gpuflame.model.columns import SampleColumns
    from tests.helpers.large_profile import tree_profile

    profile = tree_profile(5000)
    for s in profile.samples[::3]:  # zero samples and label sets only they use stay out of the page
        s.values = (0,) * len(s.values)
    for s in profile.samples[1::3]:
        s.labels = (("device", "cuda:1"),)
    profile.samples[0].labels = (("device", "only-in-a-zero-sample"),)
    path = tmp_path / "big.pb.gz"
    save(profile, path)
    with monkeypatch.context() as read_as_a_list:
        read_as_a_list.setattr(pprof_samples, "BULK_MIN", 1 << 62)
        assert run(capsys, "view", path, "-o", tmp_path / "listed.html")[0] == 0
    expected = (tmp_path / "listed.html").read_text(encoding="utf-8")
    read = load(path)
    assert "_columns" in read.__dict__  # the reader hands over columns...
    assert read.columns().frames.dtype.itemsize == 4  # ...frame ids in 4 bytes: 200 MB less at a million samples

    def refuse(self: SampleColumns) -> None:
        raise AssertionError("the page built the list of samples")

    monkeypatch.setattr(SampleColumns, "to_samples", refuse)
    rc, _, err = run(capsys, "view", path, "-o", tmp_path / "big.html")
    assert rc == 0, err
    page = (tmp_path / "big.html").read_text(encoding="utf-8")
    assert page == expected
    assert ["device", "only-in-a-zero-sample"] not in [
        pair for labels in embedded(page)["labelSets"] for pair in labels
    ]


def test_a_diff_page_reads_each_profiles_stacks_through_its_own_frame_table() -> None:
    """BASE and NEW number their frames differently: each side's stacks must come back as its own functions."""
    from gpuflame.model import Frame, Profile, SampleType

    a, b, c = Frame("alpha", "/m.py", 1), Frame("beta", "/m.py", 5), Frame("gamma", "/m.py", 9)
    new = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    new.add([a, c], [100])  # leaf first: alpha under gamma
    base = Profile(sample_types=[SampleType("inuse_space", "bytes")])
    base.add([b], [7])  # base's frame 0 is beta, new's is alpha
    base.add([c, a], [3])  # gamma under alpha
    data = decode_payload(DATA_ELEMENT.search(render_html(new, "t", base=base)).group(1))
    parent, code, names = data["stacks"]["parent"], data["stacks"]["frame"], data["frames"]["name"]

    def stacks(samples: dict) -> list[list[str]]:
        out = []
        for node in samples["stack"]:
            walked = []
            while node > 0:
                walked.append(names[code[node]])
                node = parent[node]
            out.append(walked[::-1])
        return sorted(out)

    assert stacks(data["samples"]) == [["gamma", "alpha"]]
    assert stacks(data["base"]["samples"]) == [["alpha", "gamma"], ["beta"]]
