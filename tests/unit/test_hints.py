"""Hints without FUSE: the coordinator on a real block manager and filesystem over the in-memory
store: fetched ahead within the window and the hinted store's bytes, used by reads, late hints
dropped, stale ones given up, blocks of closed files let go; the hint line parser; the client
helper's mount table parsing."""

from __future__ import annotations

import os

import pytest
import trio

from blobmount.blocks.manager import BlockManager, BlockManagerConfig
from blobmount.fs.filesystem import BlobFilesystem, FsConfig
from blobmount.hints.client import HintChannel, hinted
from blobmount.hints.coordinator import (
    GRACE_S,
    REORDER_SLACK,
    HintConfig,
    HintCoordinator,
    HintStream,
)
from blobmount.hints.server import mount_relative
from blobmount.namespace.inodes import ROOT_INODE
from blobmount.storage.counting import CountingStorageClient
from blobmount.storage.memory import InMemoryStorageClient

B = 64 * 1024


def build(
    nursery,
    files: int,
    *,
    window: int = 8,
    hint_bytes: int = 64 * B,
    queued: int = 0,
    ram_bytes: int = 0,
):
    mem = InMemoryStorageClient()
    for i in range(files):
        mem.put(f"d/{i:04d}", bytes([i % 251]) * (1000 + i))
    mem.put("big", b"x" * (10 * B))
    storage = CountingStorageClient(mem)
    config = BlockManagerConfig(B, 4, 4, ram_bytes, 16 * B, hint_bytes=hint_bytes, hint_slots=4)
    blocks = BlockManager(storage, config, nursery)
    fs = BlobFilesystem(storage, blocks, FsConfig("", None, 0, 0, 0o444, 0o555, 1.7e9, B))
    hints = HintCoordinator(HintConfig(window=window, max_queued=queued), blocks, fs.version_of, "")
    blocks.hinted.on_free = hints.room_freed
    fs.open_listener = hints
    return fs, blocks, hints, storage, mem


async def read_file(fs, path: str) -> bytes:
    node = fs.inodes.root
    for name in path.split("/"):
        node = await fs.lookup(node.inode, name)
    opened = await fs.open(node.inode, os.O_RDONLY)
    data = bytes(await fs.read(opened.fh, 0, node.size + 1))
    fs.release(opened.fh)
    return data


async def settle() -> None:
    for _ in range(50):
        await trio.sleep(0.001)


def files(numbers: range) -> list[str]:
    return [f"d/{i:04d}" for i in numbers]


async def hint_files(nursery, hints: HintCoordinator, paths) -> HintStream:
    """A new stream, its task running, with `paths` hinted in order and acted on."""
    stream = hints.open_stream()
    nursery.start_soon(hints.run_stream, stream)
    for path in paths:
        await hints.add(stream, path)
    await settle()
    return stream


async def test_hinted_files_are_fetched_ahead_and_used(nursery):
    fs, blocks, hints, storage, mem = build(nursery, 40, window=8)
    await hint_files(nursery, hints, files(range(40)))
    s = hints.statistics()
    assert s.ahead == 8  # the window, no more
    assert s.fetched == 8
    before = storage.statistics().range_requests
    for i in range(40):
        assert await read_file(fs, f"d/{i:04d}") == mem._data[f"d/{i:04d}"]
        await settle()
    s = hints.statistics()
    assert s.used == 40
    assert blocks.statistics().hinted_hits == 40
    assert blocks.statistics().storage_waits == 0
    # each file fetched once, by its hint
    assert storage.statistics().range_requests == 40
    assert before == 8
    assert blocks.hinted.statistics().held_bytes == 0


async def test_reads_wake_the_stream_task_only_when_the_window_moves(nursery):
    # every read gives room back to the hinted store; with the window (not room) the limit, that
    # must not wake the stream's task: one step starts the next hint, one finds the window full
    fs, _, hints, _, _ = build(nursery, 30, window=4, queued=100)
    steps = 0
    step = hints._step

    async def counted(stream):
        nonlocal steps
        steps += 1
        await step(stream)

    hints._step = counted
    stream = await hint_files(nursery, hints, files(range(30)))
    steps = 0
    for i in range(10):
        await read_file(fs, f"d/{i:04d}")
        await settle()
    assert hints.statistics().used == 10
    assert steps == 2 * 10
    hints.room_freed()
    await settle()
    assert steps == 2 * 10
    assert stream.waiting_for == "window"


async def test_a_closed_stream_is_kept_while_its_files_are_being_opened(nursery, autojump_clock):
    # everything sent is ahead and the queue is empty: the task waits for nothing but opens,
    # and each open starts the grace period again
    fs, _, hints, _, _ = build(nursery, 4, window=4)
    stream = await hint_files(nursery, hints, files(range(4)))
    hints.close_stream(stream)
    for i in range(4):
        await trio.sleep(GRACE_S * 0.6)
        await read_file(fs, f"d/{i:04d}")
    s = hints.statistics()
    assert (s.used, s.wasted) == (4, 0)


async def test_the_hinted_store_bounds_what_is_fetched(nursery):
    # room for 3 one-block files (~1 KB each): reservations are by block length
    fs, blocks, hints, _, _ = build(nursery, 20, window=100, hint_bytes=3100)
    await hint_files(nursery, hints, files(range(20)))
    assert hints.statistics().ahead == 3
    held = blocks.hinted.statistics()
    assert held.held_bytes + held.reserved_bytes <= 3100
    await read_file(fs, "d/0000")
    await settle()
    assert hints.statistics().ahead == 3  # one used, one more fetched


async def test_a_reader_ahead_of_the_hints_makes_them_late(nursery):
    fs, _, hints, storage, _ = build(nursery, 50, window=4, queued=100)
    stream = hints.open_stream()
    for i in range(50):
        await hints.add(stream, f"d/{i:04d}")
    # the stream's task has not run: the reader gets to file 30 first
    await read_file(fs, "d/0030")
    s = hints.statistics()
    assert s.late == 31  # hints 0..30 dropped, none fetched
    assert s.queued == 19
    nursery.start_soon(hints.run_stream, stream)
    await settle()
    assert hints.statistics().ahead == 4
    assert storage.statistics().range_requests == 1 + 4


async def _every_file_hinted_and_fetched(nursery, n):
    """A mount of n small files whose hints, in order, have all been fetched."""
    fs, blocks, hints, _, _ = build(nursery, n, window=10_000, hint_bytes=10_000 * B)
    await hint_files(nursery, hints, files(range(n)))
    assert hints.statistics().ahead == n
    return fs, blocks, hints


async def test_fetched_files_far_behind_the_reader_are_given_up(nursery):
    n = REORDER_SLACK + 20
    fs, blocks, hints = await _every_file_hinted_and_fetched(nursery, n)
    await read_file(fs, f"d/{n - 1:04d}")  # the reader skipped almost everything
    s = hints.statistics()
    assert s.wasted == n - 1 - REORDER_SLACK
    assert s.ahead == REORDER_SLACK
    assert blocks.hinted.statistics().held_blocks == REORDER_SLACK


async def test_only_files_far_behind_the_newest_open_are_given_up(nursery):
    n = REORDER_SLACK + 40
    fs, _, hints = await _every_file_hinted_and_fetched(nursery, n)
    # a data loader's reordering: a few files read out of order, nothing given up
    for i in (5, 2, 30, 0):
        await read_file(fs, f"d/{i:04d}")
    assert hints.statistics().wasted == 0
    # then a jump: unopened files more than REORDER_SLACK behind it go, the rest stay
    newest = n - 5
    await read_file(fs, f"d/{newest:04d}")
    behind = [i for i in range(newest - REORDER_SLACK) if i not in (5, 2, 30, 0)]
    s = hints.statistics()
    assert s.wasted == len(behind)
    assert s.ahead == n - 5 - len(behind)  # five opened


async def test_a_large_file_gets_its_first_blocks_and_keeps_nothing_after_close(nursery):
    fs, blocks, hints, storage, mem = build(nursery, 1, window=4)
    await hint_files(nursery, hints, ["big"])
    assert storage.statistics().range_requests == 4  # blocks_per_file
    assert blocks.hinted.statistics().held_blocks == 4
    node = await fs.lookup(ROOT_INODE, "big")
    opened = await fs.open(node.inode, os.O_RDONLY)
    assert bytes(await fs.read(opened.fh, 0, B)) == mem._data["big"][:B]
    fs.release(opened.fh)
    assert blocks.hinted.statistics().held_bytes == 0  # the unread three went with the close


async def test_hints_never_push_blocks_out_of_the_ram_tier(nursery):
    # the RAM tier holds two small blocks; the job reads two files, then hints 30 others
    fs, blocks, hints, storage, _ = build(nursery, 32, window=30, ram_bytes=2100)
    await read_file(fs, "d/0000")
    await read_file(fs, "d/0001")
    assert blocks.ram.statistics().entries == 2
    await hint_files(nursery, hints, files(range(2, 32)))
    assert hints.statistics().fetched == 30
    ram = blocks.ram.statistics()
    assert (ram.entries, ram.evictions) == (2, 0)
    # what the job read before is still served from RAM, without a request
    before = storage.statistics().range_requests
    await read_file(fs, "d/0000")
    assert storage.statistics().range_requests == before
    assert blocks.statistics().ram_hits == 1


async def test_invalid_and_missing_paths_are_counted_not_fetched(nursery):
    _, _, hints, storage, _ = build(nursery, 2)
    await hint_files(nursery, hints, ("d/9999", "d", "nope/x", "d/0001"))
    s = hints.statistics()
    assert (s.invalid, s.ahead) == (3, 1)
    assert storage.statistics().range_requests == 1


async def test_a_closed_stream_lets_go_of_what_was_never_read(nursery, autojump_clock):
    fs, blocks, hints, _, _ = build(nursery, 10, window=4)
    stream = hints.open_stream()
    done = trio.Event()

    async def run() -> None:
        await hints.run_stream(stream)
        done.set()

    nursery.start_soon(run)
    for i in range(10):
        await hints.add(stream, f"d/{i:04d}")
    await settle()
    hints.close_stream(stream)
    await settle()
    # what was sent before the close is still acted on while the job reads it
    for i in range(4):
        await read_file(fs, f"d/{i:04d}")
        await settle()
    assert hints.statistics().used == 4
    assert hints.statistics().ahead == 4
    await done.wait()  # nothing opened for the grace period: the rest is given up
    s = hints.statistics()
    assert (s.streams, s.ahead, s.queued, s.wasted) == (0, 0, 0, 4)
    assert s.fetched == 8
    assert blocks.hinted.statistics().held_bytes == 0


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"/mnt/data/a/b.jpg", "a/b.jpg"),
        (b"a/b.jpg", "a/b.jpg"),
        (b"a//b.jpg\r", "a/b.jpg"),
        (b"/mnt/other/a.jpg", None),
        (b"/mnt/database/a.jpg", None),
        (b"a/../b", None),
        (b"./a", None),
        (b"\xff", None),
        (b"/mnt/data", None),
    ],
)
def test_hint_lines(line, expected):
    assert mount_relative(line, "/mnt/data") == expected


def test_hinted_yields_everything_without_a_mount(tmp_path, caplog):
    items = [tmp_path / f"{i}" for i in range(10)]
    assert list(hinted(items, window=3)) == items
    assert "not on a blobmount mount" in caplog.text
    with pytest.raises(ValueError, match="window"):
        list(hinted(items, window=0))


def test_hinted_tops_the_window_up_in_batches(monkeypatch):
    sent: list[int] = []
    monkeypatch.setattr(HintChannel, "send", lambda self, paths: sent.append(len(list(paths))))
    window, items = 64, list(range(1000))
    out = []
    for item in hinted(items, window=window, path_of=str):
        out.append(item)
        told = sum(sent)
        assert told - len(out) >= min(window - window // 8, len(items) - len(out))
    assert out == items
    assert sum(sent) == len(items)
    assert sent[0] == window
    assert set(sent[1:-1]) == {window // 8}


class Published:
    def __init__(self) -> None:
        self.names: set[str] = set()
        self.added: list[str] = []

    def add(self, name: str) -> None:
        self.names.add(name)
        self.added.append(name)

    def discard(self, name: str) -> None:
        self.names.discard(name)


async def test_the_names_with_hints_queued_or_ahead_are_published(nursery):
    """What the other processes of a mount read to pass their opens of hinted files on."""
    fs, blocks, _, storage, mem = build(nursery, 40, window=4)
    published = Published()
    hints = HintCoordinator(HintConfig(window=4), blocks, fs.version_of, "", published)
    blocks.hinted.on_free = hints.room_freed
    fs.open_listener = hints
    await hint_files(nursery, hints, files(range(10)))
    # 4 ahead, 6 queued: all published
    assert published.names == set(files(range(10)))
    await read_file(fs, "d/0000")  # used: no longer waiting for an open
    assert "d/0000" not in published.names
    await read_file(fs, "d/0007")  # 1-6 behind it... still within the reorder slack
    assert "d/0007" not in published.names
    await settle()
    for i in range(8, 10):  # read the rest, in order: nothing is left
        await read_file(fs, f"d/{i:04d}")
    for i in range(1, 7):
        await read_file(fs, f"d/{i:04d}")
    await settle()
    assert published.names == set()
    assert sorted(published.added) == files(range(10))
