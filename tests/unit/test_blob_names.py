"""The one blob-name-to-path rule (namespace/names.py): its edge cases, and that listing (paged
and flat), the filesystem's lookups and download all follow it, with the same reasons."""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blobmount.blocks.manager import BlockManager, BlockManagerConfig
from blobmount.download_mode.downloader import DownloadConfig, Downloader
from blobmount.fs.errno_map import FsError
from blobmount.fs.filesystem import BlobFilesystem, FsConfig
from blobmount.namespace import names
from blobmount.namespace.inodes import ROOT_INODE
from blobmount.namespace.names import (
    ABSOLUTE,
    EMPTY_NAME,
    EMPTY_SEGMENT,
    NOT_UNICODE,
    NUL,
    SLASH,
    TOO_LONG,
    UnsafeName,
    is_folder_blob,
    path_problem,
    path_segments,
    segment_problem,
    valid_segment,
)
from blobmount.storage.counting import CountingStorageClient
from blobmount.storage.memory import InMemoryStorageClient
from tests.helpers.readdir import read_entries

NFC = unicodedata.normalize("NFC", "café")
NFD = unicodedata.normalize("NFD", "café")

# -- the rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rel", "segments"),
    [
        ("a.txt", ["a.txt"]),
        ("x/y/z.bin", ["x", "y", "z.bin"]),
        ("with space/ünï 文件.txt", ["with space", "ünï 文件.txt"]),
        ("a\\b", ["a\\b"]),  # a backslash is an ordinary character on POSIX
        ("...", ["..."]),
        (".hidden/..x", [".hidden", "..x"]),
        ("x" * 255, ["x" * 255]),
        ("é" * 127 + "x", ["é" * 127 + "x"]),  # 255 bytes in UTF-8
        ("😀" * 63 + "abc", ["😀" * 63 + "abc"]),  # 4-byte characters: 255 bytes
        (NFC, [NFC]),  # kept as it is: no normalization either way
        (NFD, [NFD]),
        ("\ufffd", ["\ufffd"]),  # the replacement character is ordinary text
    ],
)
def test_names_that_are_paths(rel, segments):
    assert path_segments(rel) == segments
    assert path_problem(rel) is None
    assert all(valid_segment(s) for s in segments)


def test_nfc_and_nfd_spellings_stay_two_names():
    assert NFC != NFD
    assert path_segments(f"d/{NFC}") != path_segments(f"d/{NFD}")


@pytest.mark.parametrize(
    ("rel", "why"),
    [
        ("", EMPTY_NAME),
        ("/abs", ABSOLUTE),
        ("//abs", ABSOLUTE),
        ("a//b", EMPTY_SEGMENT),
        ("a/", EMPTY_SEGMENT),  # a trailing '/' on a file
        ("a/b/", EMPTY_SEGMENT),
        (".", "a '.' path segment"),
        ("a/./b", "a '.' path segment"),
        ("..", "a '..' path segment"),
        ("a/../../escape", "a '..' path segment"),
        ("a\0b", NUL),
        ("d/\0", NUL),
        ("bad\udcffname", NOT_UNICODE),  # a lone low surrogate (how undecodable bytes look)
        ("d/\ud800", NOT_UNICODE),  # a lone high surrogate
        ("x" * 256, TOO_LONG),
        ("é" * 128, TOO_LONG),  # 128 characters, 256 bytes
        ("😀" * 64, TOO_LONG),  # 64 characters, 256 bytes
        ("ok/" + "é" * 128 + "/ok", TOO_LONG),
    ],
)
def test_names_that_are_not_paths(rel, why):
    with pytest.raises(UnsafeName) as info:
        path_segments(rel)
    assert str(info.value) == why
    assert path_problem(rel) == why


@pytest.mark.parametrize(
    ("rel", "segments"),
    [("", []), ("a/", ["a"]), ("a", ["a"]), ("a/b/", ["a", "b"])],
)
def test_a_folder_may_end_in_one_slash_and_be_the_root(rel, segments):
    assert path_segments(rel, is_dir=True) == segments


@pytest.mark.parametrize(
    ("rel", "why"), [("/", ABSOLUTE), ("//", ABSOLUTE), ("a//", EMPTY_SEGMENT), ("../", "'..'")]
)
def test_a_folder_name_still_follows_the_rule(rel, why):
    with pytest.raises(UnsafeName, match=re.escape(why)):
        path_segments(rel, is_dir=True)


@pytest.mark.parametrize(
    ("segment", "why"),
    [
        ("ok", None),
        ("a/b", SLASH),  # one segment cannot hold the separator
        ("", EMPTY_SEGMENT),
        ("..", "a '..' path segment"),
        ("\0", NUL),
        ("\udc80", NOT_UNICODE),
        ("é" * 128, TOO_LONG),
    ],
)
def test_one_segment(segment, why):
    assert segment_problem(segment) == why
    assert valid_segment(segment) == (why is None)


@pytest.mark.parametrize(
    ("name", "size", "marker", "folder"),
    [("a", 0, True, True), ("a/", 0, False, True), ("a/", 3, False, False), ("a", 0, False, False)],
)
def test_folder_blobs(name, size, marker, folder):
    assert is_folder_blob(name, size, marker) == folder


@given(st.text(alphabet=st.sampled_from(["a", "é", ".", "/", "\0", "\udcff", "😀"]), max_size=20))
def test_a_path_is_exactly_segments_that_pass_one_by_one(rel):
    """path_segments accepts a name iff it is non-empty, has no leading '/', and every segment
    passes segment_problem; what it accepts joins back to the same text."""
    parts = rel.split("/")
    accepted = rel != "" and not rel.startswith("/") and all(valid_segment(p) for p in parts)
    try:
        segments = path_segments(rel)
    except UnsafeName:
        assert not accepted
        return
    assert accepted
    assert "/".join(segments) == rel
    assert all(len(s.encode("utf-8")) <= names.NAME_MAX for s in segments)


# -- the mount and download follow it ------------------------------------------------------

B = 64 * 1024

#: blob name (under "data/") → the reason the rule gives for it
ODD = {
    "data/a//b": EMPTY_SEGMENT,
    "data//abs": ABSOLUTE,
    "data/a/../x": "a '..' path segment",
    "data/sub/./x": "a '.' path segment",
    "data/nul\0x": NUL,
    "data/bad\udcffname": NOT_UNICODE,
    "data/sub/high\ud800": NOT_UNICODE,
    "data/" + "é" * 128: TOO_LONG,
    "data/trailing/": EMPTY_SEGMENT,  # not empty, so a file whose name ends in '/'
}
GOOD_FILES = {
    "ok.txt": b"ok",
    f"sub/{NFC}": b"nfc",
    f"sub/{NFD}": b"nfd",
    "sub/" + "é" * 127 + "x": b"255 bytes",
}


def odd_store() -> InMemoryStorageClient:
    mem = InMemoryStorageClient()
    for name in ODD:
        mem.put(name, b"odd")
    for rel, data in GOOD_FILES.items():
        mem.put("data/" + rel, data)
    mem.put("data/folder/", b"")  # a zero-length "folder/" blob: a folder, not an odd name
    mem.put("data/", b"", dir_marker=True)  # the mount root's own marker
    return mem


def make_fs(nursery, mem, mode):
    storage = CountingStorageClient(mem)
    blocks = BlockManager(storage, BlockManagerConfig(B, 4, 4, 0, 16 * B), nursery)
    cfg = FsConfig("data/", None, 0, 0, 0o444, 0o555, 1.7e9, B, listing_mode=mode)
    return BlobFilesystem(storage, blocks, cfg), storage


async def walk(fs, inode=ROOT_INODE, path=""):
    """Every (path, is_folder) the mount shows, through opendir/readdir."""
    fh = await fs.opendir(inode)
    entries = await read_entries(fs, fh)
    fs.releasedir(fh)
    found = []
    for name, attr in entries:
        child = f"{path}/{name}" if path else name
        found.append((child, stat.S_ISDIR(attr.mode)))
        if stat.S_ISDIR(attr.mode):
            found += await walk(fs, attr.inode, child)
    return found


def skipped(caplog) -> dict[str, str]:
    """blob name (or prefix) → reason, from the 'skipping blob' log lines."""
    out = {}
    for record in caplog.records:
        if record.name == names.__name__ and record.msg.startswith("skipping blob"):
            blob, why = record.args
            out[blob] = why
    return out


@pytest.mark.parametrize("mode", ["hierarchical", "flat"])
async def test_listings_leave_out_exactly_the_odd_names_with_the_rules_reason(
    nursery, caplog, monkeypatch, mode
):
    monkeypatch.setattr(names, "_logged", set())  # "logged once" is per process
    fs, _ = make_fs(nursery, odd_store(), mode)
    with caplog.at_level(logging.WARNING, logger=names.__name__):
        found = await walk(fs)

    files = sorted(path for path, is_dir in found if not is_dir)
    folders = sorted(path for path, is_dir in found if is_dir)
    assert files == sorted(GOOD_FILES)
    # a folder whose own name is fine is shown even if every name in it is odd, in both
    # modes: it is a prefix blob names share
    assert folders == ["a", "folder", "sub", "trailing"]
    logged = skipped(caplog)
    # a hierarchical listing meets some odd names as a folder prefix ("data/a/../"), a flat
    # walk as the whole blob name: either way the reason is the one the rule gives the blob
    for blob, why in ODD.items():
        hits = {name: reason for name, reason in logged.items() if blob.startswith(name)}
        assert list(hits.values()) == [why], (blob, logged)
    assert len(logged) == len(ODD)


async def test_lookups_answer_absent_for_odd_names_without_asking_storage(nursery):
    fs, storage = make_fs(nursery, odd_store(), "hierarchical")
    sub = await fs.lookup(ROOT_INODE, "sub")
    a = await fs.lookup(ROOT_INODE, "a")
    before = storage.statistics().requests
    # each of these is (part of) a blob that exists: storage would have an answer
    for parent, name in [
        (ROOT_INODE, "nul\0x"),
        (ROOT_INODE, "bad\udcffname"),
        (sub.inode, "high\ud800"),
        (sub.inode, "."),
        (a.inode, ".."),
        (ROOT_INODE, ""),
    ]:
        assert await fs.lookup(parent, name) is None, name
    assert storage.statistics().requests == before
    # the kernel's own contract for a name over NAME_MAX bytes stays ENAMETOOLONG
    escaped = (b"\xff" * 255).decode("utf-8", "surrogateescape")  # not UTF-8, 255 bytes
    assert await fs.lookup(ROOT_INODE, escaped) is None
    for name in ("é" * 128, escaped + "\udcff"):
        with pytest.raises(FsError) as info:
            await fs.lookup(ROOT_INODE, name)
        assert info.value.errno == errno.ENAMETOOLONG
    # NFC and NFD spellings are two files, each with its own bytes
    for name, data in [(NFC, b"nfc"), (NFD, b"nfd")]:
        node = await fs.lookup(sub.inode, name)
        opened = await fs.open(node.inode, os.O_RDONLY)
        assert await fs.read(opened.fh, 0, 100) == data
        fs.release(opened.fh)
    # version_of (hints, warm) takes mount paths through the same rule
    assert await fs.version_of("sub/" + NFC) is not None
    for path in ("sub/high\ud800", "a/../ok.txt", "/ok.txt", "sub//x", ""):
        assert await fs.version_of(path) is None, path


async def test_download_refuses_exactly_the_odd_names_with_the_same_reasons(tmp_path):
    dest = tmp_path / "dest"
    config = DownloadConfig(dest=dest, prefix="data/", transfers=2, part_size=B)
    result = await Downloader(odd_store(), config).run()

    assert {f.blob: f.reason for f in result.failures} == {
        blob: f"refused: {why}" for blob, why in ODD.items()
    }
    got = {}
    for root, _, filenames in os.walk(dest):
        for f in filenames:
            rel = os.path.relpath(os.path.join(root, f), dest)
            if not rel.startswith(".blobmount-download"):
                got[rel] = open(os.path.join(root, f), "rb").read()
    assert got == GOOD_FILES
    assert (dest / "folder").is_dir()  # the zero-length "folder/" blob
    assert not (dest / "a").exists()  # only odd names under it: nothing to copy
