"""Download writes around the page cache (O_DIRECT): right bytes, bounded buffers, fallbacks."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
from pathlib import Path

import pytest
import trio

from blobmount.download_mode import direct_io
from blobmount.download_mode.direct_io import ALIGN, DirectWrites, aligned_middle
from blobmount.download_mode.downloader import DownloadConfig, Downloader
from blobmount.download_mode.staging import PartFile
from blobmount.storage.memory import InMemoryStorageClient
from blobmount.testing.pattern import pattern_bytes
from blobmount.units import MiB
from tests.helpers.direct_io import direct_io_supported

PART = 1 * MiB
SIZE = 3 * PART + 12345  # three whole parts and an unaligned tail


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    if not direct_io_supported(tmp_path):
        pytest.skip(f"the file system of {tmp_path} refuses O_DIRECT")
    return tmp_path


def write_file(path: Path, data: bytes, offsets: list[int], part: int, direct) -> None:
    """`data` written as parts of `part` bytes starting at `offsets`, then committed."""
    f = PartFile(path.with_suffix(".part"), len(data), preallocate=True, direct=direct)
    for start in offsets:
        f.write_at(start, data[start : start + part])
    f.commit(path, 1_700_000_000.0)


def resident_pages(path: Path) -> int:
    """How many of the file's pages are in the page cache (mincore(2))."""
    size = path.stat().st_size
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        address = ctypes.addressof(ctypes.c_char.from_buffer(m))
        if libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return sum(v & 1 for v in vec)


@pytest.mark.parametrize(
    ("offset", "length", "expected"),
    [
        (0, 3 * ALIGN, (0, 3 * ALIGN)),
        (0, 3 * ALIGN + 5, (0, 3 * ALIGN)),
        (7, 3 * ALIGN, (ALIGN - 7, 2 * ALIGN)),
        (ALIGN - 1, ALIGN, (0, 0)),  # spans two blocks, covers neither
        (5, 10, (0, 0)),
        (ALIGN, 0, (0, 0)),
    ],
)
def test_aligned_middle(offset, length, expected):
    assert aligned_middle(offset, length) == expected
    skip, size = expected
    if size:
        assert (offset + skip) % ALIGN == 0
        assert size % ALIGN == 0
        assert skip + size <= length


@pytest.mark.parametrize("part", [PART, PART + 1000])  # aligned parts, and unaligned ones
def test_parts_written_around_the_page_cache_are_the_right_bytes(folder, part):
    data = pattern_bytes("direct", 0, SIZE)
    direct = DirectWrites(part)
    offsets = list(range(0, SIZE, part))
    write_file(folder / "f", data, offsets[::-1], part, direct)  # out of order, as parts land
    assert (folder / "f").read_bytes() == data
    expected = sum(aligned_middle(o, min(part, SIZE - o))[1] for o in offsets)
    assert direct.statistics().direct_bytes == expected > 0.9 * SIZE


def test_direct_writes_leave_the_file_out_of_the_page_cache(folder):
    data = pattern_bytes("cold", 0, SIZE)
    write_file(folder / "direct", data, list(range(0, SIZE, PART)), PART, DirectWrites(PART))
    write_file(folder / "cached", data, list(range(0, SIZE, PART)), PART, None)
    pages = (SIZE + ALIGN - 1) // ALIGN
    assert resident_pages(folder / "cached") == pages
    assert resident_pages(folder / "direct") <= 1  # the unaligned tail only


def test_small_files_go_through_the_page_cache(folder):
    direct = DirectWrites(PART)
    data = pattern_bytes("small", 0, direct_io.MIN_DIRECT_FILE_BYTES - 1)
    write_file(folder / "small", data, [0], len(data), direct)
    assert (folder / "small").read_bytes() == data
    assert direct.statistics().direct_bytes == 0
    assert direct.buffers_made == 0


def test_a_file_system_that_refuses_o_direct_at_open_gets_buffered_writes(folder, monkeypatch):
    real_open = os.open

    def refusing(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(direct_io.os, "open", refusing)
    direct = DirectWrites(PART)
    data = pattern_bytes("refused", 0, SIZE)
    write_file(folder / "f", data, list(range(0, SIZE, PART)), PART, direct)
    write_file(folder / "g", data, list(range(0, SIZE, PART)), PART, direct)
    assert (folder / "f").read_bytes() == data == (folder / "g").read_bytes()
    assert direct.statistics() == direct_io.DirectWriteStats(0, 0, 2)


def test_a_refused_direct_write_is_written_through_the_page_cache(folder, monkeypatch):
    calls = []
    real = direct_io._pwrite_all

    def refuse_second(fd, view, offset):
        calls.append(offset)
        if len(calls) == 2:
            os.pwrite(fd, view[: ALIGN // 2], offset)  # half done, then refused
            raise OSError(errno.EINVAL, "Invalid argument")
        real(fd, view, offset)

    monkeypatch.setattr(direct_io, "_pwrite_all", refuse_second)
    direct = DirectWrites(PART)
    data = pattern_bytes("half", 0, SIZE)
    write_file(folder / "f", data, list(range(0, SIZE, PART)), PART, direct)
    assert (folder / "f").read_bytes() == data
    assert len(calls) == 2  # the file's later parts no longer tried O_DIRECT
    stats = direct.statistics()
    assert stats.direct_bytes == PART
    assert stats.refused_files == 1


def test_buffers_are_bounded_and_a_part_without_one_is_written_through_the_page_cache(
    folder, monkeypatch
):
    release = threading.Event()
    entered = threading.Semaphore(0)
    real = direct_io._pwrite_all

    def held(fd, view, offset):
        entered.release()
        release.wait(10)
        real(fd, view, offset)

    monkeypatch.setattr(direct_io, "_pwrite_all", held)
    direct = DirectWrites(PART, buffers=2)
    data = pattern_bytes("busy", 0, SIZE)
    f = PartFile(folder / "f.part", SIZE, preallocate=True, direct=direct)
    writers = [
        threading.Thread(target=f.write_at, args=(start, data[start : start + PART]))
        for start in (0, PART)
    ]
    for w in writers:
        w.start()
    for _ in writers:
        assert entered.acquire(timeout=10)
    f.write_at(2 * PART, data[2 * PART : 3 * PART])  # both buffers are held
    f.write_at(3 * PART, data[3 * PART :])
    assert direct.statistics().buffer_busy_parts == 2
    release.set()
    for w in writers:
        w.join(10)
    f.commit(folder / "f", 1_700_000_000.0)
    assert (folder / "f").read_bytes() == data
    assert direct.buffers_made == 2
    assert direct.statistics().direct_bytes == 2 * PART


def test_a_download_writes_large_files_around_the_page_cache_unless_told_not_to(folder):
    store = InMemoryStorageClient()
    big = pattern_bytes("big", 0, SIZE)
    store.put("data/big.bin", big)
    store.put("data/small.txt", b"small\n")

    def run(dest: Path, **kw) -> tuple[int, int]:
        """(bytes written with O_DIRECT, pages of big.bin in the page cache afterwards)"""
        config = DownloadConfig(dest=dest, prefix="data/", transfers=4, part_size=PART, **kw)
        result = trio.run(Downloader(store, config).run)
        assert result.ok
        cached = resident_pages(dest / "big.bin")  # before reading it back fills the cache
        assert (dest / "big.bin").read_bytes() == big
        assert (dest / "small.txt").read_bytes() == b"small\n"
        return result.stats.bytes_direct, cached

    pages = (SIZE + ALIGN - 1) // ALIGN
    assert run(folder / "direct") == (SIZE // ALIGN * ALIGN, 1)  # all but the last partial page
    assert run(folder / "cached", direct_io=False) == (0, pages)
