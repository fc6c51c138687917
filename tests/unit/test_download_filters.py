"""--include / --exclude semantics."""

from __future__ import annotations

import pytest

from blobmount.download_mode.filters import NameFilter


def test_no_patterns_keep_everything():
    f = NameFilter()
    assert not f.active
    assert f.keeps("a/b/c.txt")


@pytest.mark.parametrize(
    ("includes", "excludes", "kept", "dropped"),
    [
        (["*.jpg"], [], ["a.jpg", "x/y/b.jpg"], ["a.png", "x/y.jpg/z.txt"]),
        (["train/*"], [], ["train/a", "train/x/y"], ["val/a", "train"]),
        (["train/"], [], ["train/a", "train/x/y"], ["val/a"]),
        (["/train/*"], [], ["train/a"], ["x/train/a"]),
        (["train/*", "val/*"], [], ["train/a", "val/b"], ["test/c"]),
        ([], ["*.tmp"], ["a.txt", "d/b.txt"], ["a.tmp", "d/e/b.tmp"]),
        (["*.jpg"], ["bad/*"], ["ok/a.jpg"], ["bad/a.jpg", "ok/a.png"]),
        (["img_?.png"], [], ["img_1.png"], ["img_10.png"]),
        (["[ab]*"], [], ["a1", "b/x"], ["c1"]),
        (["*.JPG"], [], ["a.JPG"], ["a.jpg"]),  # case-sensitive, like the blob names
    ],
)
def test_patterns(includes, excludes, kept, dropped):
    f = NameFilter(includes, excludes)
    assert f.active
    for rel in kept:
        assert f.keeps(rel), rel
    for rel in dropped:
        assert not f.keeps(rel), rel


def test_empty_pattern_is_an_error():
    with pytest.raises(ValueError, match="empty filter pattern"):
        NameFilter([" "])
