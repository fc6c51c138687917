"""The temp files of a download: written in place, their writeback started as they fill."""

from __future__ import annotations

import os

import pytest

from blobmount.download_mode import staging
from blobmount.download_mode.staging import PartFile, start_writeback


def test_parts_land_in_place_and_commit_to_the_final_name(tmp_path):
    part = PartFile(tmp_path / "0.part", 10, preallocate=True)
    part.write_at(5, b"world")
    part.write_at(0, b"hello")
    part.commit(tmp_path / "sub" / "final", 1_700_000_000.0)
    final = tmp_path / "sub" / "final"
    assert final.read_bytes() == b"helloworld"
    assert final.stat().st_mtime == 1_700_000_000.0
    assert not (tmp_path / "0.part").exists()


def test_writeback_is_started_for_each_part_written(tmp_path, monkeypatch):
    started: list[tuple[int, int]] = []
    real = staging.start_writeback

    def record(fd: int, offset: int, length: int) -> bool:
        started.append((offset, length))
        return real(fd, offset, length)

    monkeypatch.setattr(staging, "start_writeback", record)
    part = PartFile(tmp_path / "0.part", 12, preallocate=True)
    part.write_at(8, b"3333")
    part.write_at(0, b"11112222")
    part.discard()
    assert started == [(8, 4), (0, 8)]
    quiet = PartFile(tmp_path / "1.part", 4, preallocate=False, writeback=False)
    quiet.write_at(0, b"abcd")
    quiet.discard()
    assert started == [(8, 4), (0, 8)]  # the whole-file cache's files: none started


def test_the_kernel_takes_a_writeback_request_for_a_regular_file(tmp_path):
    with open(tmp_path / "f", "wb") as f:
        f.write(b"x" * 65536)
        f.flush()
        assert start_writeback(f.fileno(), 0, 65536)


def test_a_refused_writeback_request_is_not_an_error(tmp_path):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    os.close(fd)
    assert not start_writeback(fd, 0, 4096)  # EBADF: syncfs will do the work


def test_without_sync_file_range_writes_still_work(tmp_path, monkeypatch):
    class NoRange:
        pass

    monkeypatch.setattr(staging, "libc", NoRange)
    part = PartFile(tmp_path / "0.part", 3, preallocate=False)
    part.write_at(0, b"abc")
    part.commit(tmp_path / "final", 0.0)
    assert (tmp_path / "final").read_bytes() == b"abc"


@pytest.mark.parametrize("preallocate", [True, False])
def test_a_discarded_part_leaves_nothing(tmp_path, preallocate):
    part = PartFile(tmp_path / "0.part", 4, preallocate=preallocate)
    part.write_at(0, b"abcd")
    part.discard()
    assert list(tmp_path.iterdir()) == []
