"""Blob names → local paths: ordinary names pass, hostile ones are refused, nothing escapes.
The rule itself (shared with the mount) is tested in test_blob_names.py."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blobmount.download_mode.paths import RESERVED_PREFIX, local_path
from blobmount.namespace.names import UnsafeName


@pytest.mark.parametrize(
    ("name", "prefix", "rel"),
    [
        ("a.txt", "", "a.txt"),
        ("data/a.txt", "data/", "a.txt"),
        ("data/x/y/z.bin", "data/", "x/y/z.bin"),
        ("with space/ünï 文件.txt", "", "with space/ünï 文件.txt"),
        ("a\\b", "", "a\\b"),  # a backslash is an ordinary character on POSIX
        ("...", "", "..."),
        (".hidden", "", ".hidden"),
        ("x" * 255, "", "x" * 255),
        ("sub/.blobmount-download.db", "", "sub/.blobmount-download.db"),  # only top level
    ],
)
def test_ordinary_names_map_to_relative_paths(name, prefix, rel):
    assert local_path(name, prefix) == rel


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../escape", "'..'"),
        ("a/../../escape", "'..'"),
        ("a/./b", "'.'"),
        ("a//b", "empty path segment"),
        ("a/", "empty path segment"),
        ("/abs", "absolute"),
        ("//abs", "absolute"),
        ("a\0b", "NUL"),
        ("x" * 256, "longer than 255 bytes"),
        ("é" * 128, "longer than 255 bytes"),  # 256 bytes in UTF-8
        ("bad\udcffname", "not valid Unicode"),
        ("", "empty name"),
        (".blobmount-download.db", "reserved"),
        (".blobmount-download.tmp/0.part", "reserved"),
    ],
)
def test_hostile_names_are_refused_with_a_reason(name, why):
    with pytest.raises(UnsafeName, match=why):
        local_path(name, "")


def test_names_outside_the_prefix_are_refused():
    with pytest.raises(UnsafeName, match="not under the prefix"):
        local_path("other/a", "data/")


def test_folders_may_end_in_a_slash_and_may_be_the_root():
    assert local_path("data/sub/", "data/", is_dir=True) == "sub"
    assert local_path("data/sub", "data/", is_dir=True) == "sub"
    assert local_path("data/", "data/", is_dir=True) == ""
    with pytest.raises(UnsafeName, match="empty path segment"):
        local_path("data/a//", "data/", is_dir=True)
    with pytest.raises(UnsafeName, match="absolute"):  # a folder named '' below the prefix
        local_path("data//", "data/", is_dir=True)


@given(st.text(alphabet=st.sampled_from(["a", "b", ".", "/", "\0", "é"]), max_size=30))
def test_no_accepted_name_leaves_the_destination(name):
    dest = "/dest"
    try:
        rel = local_path(name, "")
    except UnsafeName:
        return
    joined = os.path.normpath(os.path.join(dest, rel))
    assert joined.startswith(dest + "/")
    assert joined == os.path.join(dest, rel)  # already normal: no '.', '..' or '//'
    assert not rel.split("/")[0].startswith(RESERVED_PREFIX)
