"""Source indexes kept on disk between runs: read back exactly, keyed by content, hostile entries ignored."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from gpuflame.symbols import index_cache, qualnames
from gpuflame.symbols.qualnames import Resolver
from gpuflame.symbols.source_index import index_source

SOURCE = textwrap.dedent(
    '''\
    import functools


    class Outer:
        """class and def at column 0 inside a string:
    class Fake:
        def forward(self):
    """

        class Inner:
            @functools.lru_cache(None)
            def forward(self, key=lambda v: v):
                return [x for x in range(3)]

        async def coro(self):
            return {z for z in ()}


    def forward():
        return 1
    '''
)


def fresh_process() -> None:
    """What a new process starts with: no index parsed in memory."""
    qualnames._FILES.clear()


def names(resolver: Resolver, path: Path) -> list[tuple[str, int]]:
    text = SOURCE.splitlines()
    return [resolver.lookup(str(path), i + 1, co) for i in range(len(text)) for co in ("forward", "coro", "<lambda>")]


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "model.py"
    path.write_text(SOURCE, encoding="utf-8")
    return path


def test_a_later_process_reads_the_index_back_without_parsing(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"
    fresh_process()
    first = names(Resolver(store=store), source)
    assert len(list(store.glob("*.json"))) == 1
    assert first == names(Resolver(), source)  # the same names as without a store
    fresh_process()

    def no_parse(_: object) -> None:
        raise AssertionError("parsed again")

    monkeypatch.setattr(qualnames, "index_source", no_parse)
    assert names(Resolver(store=store), source) == first
    loaded = index_cache.load(store, source.read_bytes())
    assert loaded is not None and loaded.spans == index_source(SOURCE).spans


def test_an_edited_file_of_the_same_size_and_time_is_parsed_again(source: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    fresh_process()
    line = 1 + next(i for i, text in enumerate(SOURCE.splitlines()) if "return [x for x" in text)
    assert Resolver(store=store).lookup(str(source), line, "forward")[0] == "Outer.Inner.forward"
    st = source.stat()
    source.write_text(SOURCE.replace("class Inner:", "class Other:"), encoding="utf-8")  # same length
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
    fresh_process()
    assert Resolver(store=store).lookup(str(source), line, "forward")[0] == "Outer.Other.forward"
    assert len(list(store.glob("*.json"))) == 2


def test_the_key_holds_the_python_version_and_the_format(monkeypatch: pytest.MonkeyPatch) -> None:
    key = index_cache.key_of(b"x = 1\n")
    monkeypatch.setattr(index_cache, "FORMAT", index_cache.FORMAT + 1)
    assert index_cache.key_of(b"x = 1\n") != key
    monkeypatch.undo()
    monkeypatch.setattr(index_cache.sys, "version_info", (3, 99, 0))
    assert index_cache.key_of(b"x = 1\n") != key


SPAN = [4, 17, 1, "Outer", "Outer", -1]


@pytest.mark.parametrize(
    "entry",
    [
        b"\x00not json",
        b"[" * 100_000,  # nesting the JSON reader refuses
        json.dumps({"format": 999, "spans": [SPAN]}).encode(),
        json.dumps({"format": 1, "spans": "no"}).encode(),
        json.dumps({"format": 1, "spans": [[4, 17, 1, "Outer", "Outer"]]}).encode(),
        json.dumps({"format": 1, "spans": [[4, 17, 1, 5, "Outer", -1]]}).encode(),
        json.dumps({"format": 1, "spans": [[4, 10**12, 1, "Outer", "Outer", -1]]}).encode(),  # past the source
        json.dumps({"format": 1, "spans": [[0, 3, 1, "Outer", "Outer", -1]]}).encode(),
        json.dumps({"format": 1, "spans": [SPAN, [5, 6, 2, "f", "Outer.f", 1]]}).encode(),  # its own parent
        json.dumps({"format": 1, "spans": [SPAN] * 200}).encode(),  # covers each line 200 times
        json.dumps({"format": 1, "spans": [[4, 17, True, "Outer", "Outer", -1]]}).encode(),
    ],
)
def test_damaged_or_hostile_entries_are_ignored_and_the_source_parsed(
    source: Path, tmp_path: Path, entry: bytes
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    data = source.read_bytes()
    (store / (index_cache.key_of(data) + ".json")).write_bytes(entry)
    assert index_cache.load(store, data) is None
    fresh_process()
    assert names(Resolver(store=store), source) == names(Resolver(), source)


def test_a_fifo_or_a_folder_where_an_entry_belongs_is_a_miss_without_blocking(source: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    data = source.read_bytes()
    entry = store / (index_cache.key_of(data) + ".json")
    os.mkfifo(entry)  # opened for reading the plain way, this waits for a writer forever
    assert index_cache.load(store, data) is None
    entry.unlink()
    entry.mkdir()
    assert index_cache.load(store, data) is None
    assert names(Resolver(store=store), source) == names(Resolver(), source)


def test_an_entry_too_large_is_not_read(source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    index_cache.save(store, source.read_bytes(), index_source(SOURCE))
    assert index_cache.load(store, source.read_bytes()) is not None
    monkeypatch.setattr(index_cache, "MAX_ENTRY_BYTES", 10)
    assert index_cache.load(store, source.read_bytes()) is None


def test_the_folder_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_cache, "MAX_ENTRIES", 3)
    store = tmp_path / "store"
    for n in range(10):
        text = f"def f{n}():\n    pass\n"
        index_cache.save(store, text.encode(), index_source(text))
        assert len(list(store.glob("*.json"))) <= 3
    assert not list(store.glob("*.tmp"))


def test_a_folder_that_cannot_be_written_is_a_miss(source: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    fresh_process()
    assert names(Resolver(store=blocker / "store"), source) == names(Resolver(), source)
    assert index_cache.load(blocker / "store", source.read_bytes()) is None


def test_a_source_with_old_mac_line_ends_is_read_back(tmp_path: Path) -> None:
    """ast ends lines at a lone carriage return too: spans past the count of newlines are still this file's."""
    source = SOURCE.replace("\n", "\r").encode()
    store = tmp_path / "store"
    index_cache.save(store, source, index_source(source))
    loaded = index_cache.load(store, source)
    assert loaded is not None and loaded.spans == index_source(source).spans
