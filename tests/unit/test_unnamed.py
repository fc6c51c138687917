"""Cache files published with no name until whole (`cachedir.unnamed`), and the fallback to a
named temporary where the file system has no O_TMPFILE."""

from __future__ import annotations

import errno
import os

import pytest

from blobmount.cachedir import unnamed
from blobmount.cachedir.layout import TEMP_PREFIX
from blobmount.wholefile import entries


def names(folder) -> list[str]:
    return sorted(os.listdir(folder))


def test_an_unnamed_file_appears_only_when_linked_whole(tmp_path):
    folder = tmp_path / "ab"
    fd = unnamed.open_unnamed(os.fspath(folder))  # the folder is made on first use
    assert fd is not None
    try:
        os.write(fd, b"x" * 5000)
        assert names(folder) == []  # nothing to see while it is written
        unnamed.link_into_place(fd, os.fspath(folder / "entry"))
    finally:
        os.close(fd)
    assert names(folder) == ["entry"]
    assert (folder / "entry").read_bytes() == b"x" * 5000


def test_linking_replaces_a_file_of_the_same_name_and_leaves_no_temporary(tmp_path):
    final = tmp_path / "entry"
    final.write_bytes(b"old")
    fd = unnamed.open_unnamed(os.fspath(tmp_path))
    assert fd is not None
    try:
        os.write(fd, b"new bytes")
        unnamed.link_into_place(fd, os.fspath(final))
    finally:
        os.close(fd)
    assert final.read_bytes() == b"new bytes"
    assert names(tmp_path) == ["entry"]


def test_a_file_system_without_o_tmpfile_is_asked_once(tmp_path, monkeypatch):
    calls = []
    real_open = os.open

    def refusing_open(path, flags, *args, **kwargs):
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            calls.append(path)
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(unnamed, "_usable", True)
    monkeypatch.setattr(unnamed.os, "open", refusing_open)
    assert unnamed.open_unnamed(os.fspath(tmp_path)) is None
    assert unnamed.open_unnamed(os.fspath(tmp_path)) is None
    assert len(calls) == 1
    assert not unnamed.usable()
    # entries are then written through a named temporary, renamed into place
    path = os.fspath(tmp_path / "cd" / "entry")
    entries.put_entry(path, b"payload")
    fd, occupied, _ = entries.write_entry(os.fspath(tmp_path / "cd" / "other"), b"more")
    try:
        assert os.pread(fd, 10, 0) == b"more"
    finally:
        os.close(fd)
    assert occupied > 0
    assert names(tmp_path / "cd") == ["entry", "other"]
    assert not any(n.startswith(TEMP_PREFIX) for n in names(tmp_path / "cd"))


def test_other_open_errors_are_raised_and_do_not_turn_unnamed_files_off(tmp_path, monkeypatch):
    real_open = os.open

    def full_open(path, flags, *args, **kwargs):
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(unnamed, "_usable", True)
    monkeypatch.setattr(unnamed.os, "open", full_open)
    with pytest.raises(OSError) as raised:
        unnamed.open_unnamed(os.fspath(tmp_path))
    assert raised.value.errno == errno.ENOSPC
    assert unnamed.usable()


def test_write_entry_gives_an_fd_of_the_named_entry(tmp_path):
    assert unnamed.usable()
    path = os.fspath(tmp_path / "ef" / "entry")
    fd, occupied, free = entries.write_entry(path, b"z" * 10_000)
    try:
        assert os.fstat(fd).st_ino == os.stat(path).st_ino
        assert os.pread(fd, 20_000, 0) == b"z" * 10_000
    finally:
        os.close(fd)
    assert occupied >= 10_000
    assert free is None or free > 0
    assert names(tmp_path / "ef") == ["entry"]
