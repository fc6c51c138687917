"""SharedNames and SharedHandles across real forked processes, as the workers of a mount use
them: any process resolves an inode number or a handle number another one handed out, writers
racing never corrupt the shared files, and a process SIGKILLed half-way leaves them usable.

Every child leaves through os._exit (its status says whether its own checks passed), and every
wait has a deadline, so a failure cannot hang the test run."""

from __future__ import annotations

import errno
import os
import random
import select
import signal
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from blobmount.multiproc import handles as handles_module
from blobmount.multiproc import lock_time
from blobmount.multiproc.handles import ETAG_MAX, HandleRecord, SharedHandles
from blobmount.multiproc.names import FILE_NAME, SharedNames
from tests.helpers.forked import WAIT_S, fork, read_line, wait

pytestmark = pytest.mark.timeout(120)


# -- processes ------------------------------------------------------------------------------


class Gate:
    """A pipe the parent opens to let waiting children start at the same moment."""

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()

    def wait(self) -> None:
        ready, _, _ = select.select([self.read_end], [], [], WAIT_S)
        assert ready, "the gate never opened"

    def open(self) -> None:
        os.write(self.write_end, b"go")

    def close(self) -> None:
        os.close(self.read_end)
        os.close(self.write_end)


# -- SharedNames ----------------------------------------------------------------------------


@pytest.fixture
def names(tmp_path: Path) -> Iterator[SharedNames]:
    shared = SharedNames.create(tmp_path)
    yield shared
    shared.close()


def path_for(inode: int) -> str:
    return f"data/part-{inode % 7}/file-{inode}.bin"


def log_records(folder: Path) -> list[tuple[int, str]]:
    """Every record below the log's end, parsed independently of SharedNames; fails on any
    record that is cut or not UTF-8."""
    data = (folder / FILE_NAME).read_bytes()
    (end,) = struct.unpack_from("<Q", data)
    records, offset = [], 8
    while offset < end:
        inode, length = struct.unpack_from("<QI", data, offset)
        offset += 12
        assert offset + length <= end, "a record crosses the log's end"
        records.append((inode, data[offset : offset + length].decode("utf-8", "surrogatepass")))
        offset += length
    assert offset == end
    return records


def test_a_published_inode_resolves_in_the_same_process(names):
    names.publish(1, "")
    names.publish(12345, "a/b/c.bin")
    names.publish(777, "odd/\udcff name \u00e9")  # a name that is not UTF-8 on the wire
    assert names.path_of(1) == ""
    assert names.path_of(12345) == "a/b/c.bin"
    assert names.path_of(777) == "odd/\udcff name \u00e9"
    assert names.path_of(2) is None
    names.publish(12345, "a/b/c.bin")  # known: no second record
    stats = names.statistics()
    assert (stats.known, stats.records_written) == (3, 3)
    assert stats.log_bytes > 8 + 3 * 12


def test_what_a_child_publishes_resolves_in_the_parent(names, tmp_path):
    names.publish(5, "before/the/fork")

    def child() -> None:
        assert names.path_of(5) == "before/the/fork"  # inherited: no read of the log
        assert names.statistics().records_read == 0
        for inode in range(100, 1100):
            names.publish(inode, path_for(inode))

    assert wait(fork(child)) == 0
    assert names.path_of(99) is None
    assert [names.path_of(inode) for inode in range(100, 1100)] == [
        path_for(inode) for inode in range(100, 1100)
    ]
    assert names.statistics().records_read == 1000
    # and the other way: a child forked before the parent publishes reads it from the log
    gate = Gate()
    read = names.statistics().records_read

    def reader() -> None:
        gate.wait()
        assert names.path_of(4000) == "after"
        assert names.statistics().records_read == read + 1

    pid = fork(reader)
    names.publish(4000, "after")
    gate.open()
    assert wait(pid) == 0
    gate.close()


def test_a_batch_is_published_in_one_append_and_known_ones_are_left_out(names):
    names.publish(10, "known")
    gate = Gate()

    def reader() -> None:  # forked before the batch: reads it from the log
        gate.wait()
        assert names.path_of(11) == "d/a"
        assert names.path_of(12) == "d/b"
        assert names.statistics().records_read == 2

    pid = fork(reader)
    before = names.statistics().log_bytes
    # a readdirplus reply's entries: one already known, one twice
    names.publish_all([(10, "known"), (11, "d/a"), (12, "d/b"), (11, "d/a")])
    stats = names.statistics()
    assert stats.records_written == 3
    assert stats.log_bytes == before + 2 * 12 + len("d/a") + len("d/b")
    names.publish_all([(11, "d/a")])  # nothing new: the log is not touched
    assert names.statistics().log_bytes == stats.log_bytes
    gate.open()
    assert wait(pid) == 0
    gate.close()


def test_processes_publishing_the_same_inodes_at_once_write_whole_records(names, tmp_path):
    gate = Gate()
    shared = list(range(1000, 3000))

    def child(seed: int) -> Callable[[], None]:
        def run() -> None:
            order = shared + list(range(seed * 10_000, seed * 10_000 + 500))
            random.Random(seed).shuffle(order)
            gate.wait()
            for inode in order:
                names.publish(inode, path_for(inode))
            for inode in order:
                assert names.path_of(inode) == path_for(inode)

        return run

    pids = [fork(child(seed)) for seed in (1, 2, 3)]
    gate.open()
    assert [wait(pid) for pid in pids] == [0, 0, 0]
    gate.close()
    expected = {*shared, *(s * 10_000 + i for s in (1, 2, 3) for i in range(500))}
    records = log_records(tmp_path)
    assert {inode for inode, _ in records} == expected
    assert all(path == path_for(inode) for inode, path in records)
    assert all(names.path_of(inode) == path_for(inode) for inode in expected)


def test_a_publisher_killed_half_way_leaves_a_log_others_read_and_extend(names, tmp_path):
    ready_read, ready_write = os.pipe()

    def child() -> None:
        for inode in range(10, 10**9):
            names.publish(inode, path_for(inode) * 3)
            if inode == 2000:
                os.write(ready_write, b"going\n")

    pid = fork(child)
    try:
        assert read_line(ready_read) == b"going\n"
        time.sleep(0.02)
    finally:
        os.kill(pid, signal.SIGKILL)
        assert wait(pid) == -signal.SIGKILL
        os.close(ready_read)
        os.close(ready_write)
    # whatever the child had written whole is readable (its lock went with it: no hang)
    records = log_records(tmp_path)
    last = records[-1][0]
    assert last >= 2000
    assert [inode for inode, _ in records] == list(range(10, last + 1))
    assert names.path_of(last) == path_for(last) * 3
    assert names.path_of(last + 1) is None or names.path_of(last + 1) == path_for(last + 1) * 3
    # bytes a writer left past the end (killed between its record and the header) are ignored
    # and overwritten by the next record
    with open(tmp_path / FILE_NAME, "r+b") as log:
        log.seek(0, os.SEEK_END)
        log.write(b"\xff" * 7)
    names.publish(5, "next")

    def reader() -> None:
        assert names.path_of(5) == "next"
        assert names.path_of(10) == path_for(10) * 3

    assert wait(fork(reader)) == 0
    assert log_records(tmp_path)[-1] == (5, "next")


# -- SharedHandles --------------------------------------------------------------------------

AZURE_ETAG = '"0x8DBEB8E3A4C7D2F"'


@pytest.fixture
def handles(tmp_path: Path) -> Iterator[SharedHandles]:
    shared = SharedHandles.create(tmp_path, 2, per_process=8192)
    yield shared
    shared.close()


def expected(index: int, phase: int, i: int) -> HandleRecord:
    """The record process `index` adds as its `i`th handle of `phase`."""
    if i % 5 == 0:
        return HandleRecord(index * 1_000_000 + phase * 100_000 + i, None, 0)
    etag = f'"0x{index:X}{phase:X}{i:013X}"'
    return HandleRecord(index * 1_000_000 + i, etag, i * 4096 + phase, direct_io=i % 3 == 0)


def add(shared: SharedHandles, record: HandleRecord) -> int:
    return shared.add(record.inode, record.etag, record.size, record.direct_io)


def test_a_handle_resolves_until_it_is_removed(handles):
    handles.bind(0)
    fh = handles.add(42, AZURE_ETAG, 1000)
    folder = handles.add(7, None, 0)
    assert 0 < fh < 2**64
    assert 0 < folder < 2**64
    assert fh != folder
    assert handles.get(fh) == HandleRecord(42, AZURE_ETAG, 1000, False)
    assert handles.get(folder) == HandleRecord(7, None, 0, False)
    assert handles.remove(fh) == HandleRecord(42, AZURE_ETAG, 1000, False)
    assert handles.get(fh) is None
    assert handles.remove(fh) is None
    # the freed slot is reused under another number; the old number stays dead
    again = handles.add(43, AZURE_ETAG, 5, direct_io=True)
    assert again != fh
    assert again & 0xFFFFFFFF == fh & 0xFFFFFFFF
    assert handles.get(fh) is None
    assert handles.remove(fh) is None
    assert handles.get(again) == HandleRecord(43, AZURE_ETAG, 5, True)
    for wrong in (0, -1, again + (1 << 40), again & 0xFFFFFFFF, 2**64 + again, 2 * 8192):
        assert handles.get(wrong) is None
        assert handles.remove(wrong) is None
    assert handles.get(again) == HandleRecord(43, AZURE_ETAG, 5, True)


def test_an_etag_longer_than_a_slot_holds_is_refused(handles):
    longest = '"' + "a" * (ETAG_MAX - 2) + '"'
    fh = handles.add(1, longest, 1)
    assert handles.get(fh) == HandleRecord(1, longest, 1)
    with pytest.raises(ValueError, match="ETag"):
        handles.add(1, longest + "x", 1)
    assert handles.get(handles.add(2, "e", 2)) == HandleRecord(2, "e", 2)


def test_a_handle_a_child_added_is_read_and_removed_in_the_parent(handles):
    words_read, words_write = os.pipe()

    def child() -> None:
        handles.bind(1)
        fhs = [add(handles, expected(1, 0, i)) for i in range(10)]
        os.write(words_write, (" ".join(map(str, fhs)) + "\n").encode())

    try:
        pid = fork(child)
        fhs = [int(word) for word in read_line(words_read).split()]
        assert wait(pid) == 0
        assert [handles.get(fh) for fh in fhs] == [expected(1, 0, i) for i in range(10)]
        for i in range(0, 10, 2):
            assert handles.remove(fhs[i]) == expected(1, 0, i)
        # a replacement for the (dead) child binds its index: the handles still open stay
        # valid, and the slots the parent freed are used again under new numbers

        def replacement() -> None:
            handles.bind(1)
            new = [add(handles, expected(1, 1, i)) for i in range(10)]
            os.write(words_write, (" ".join(map(str, new)) + "\n").encode())

        pid = fork(replacement)
        new = [int(word) for word in read_line(words_read).split()]
        assert wait(pid) == 0
    finally:
        os.close(words_read)
        os.close(words_write)
    assert not set(new) & set(fhs)
    for i in range(10):
        assert handles.get(fhs[i]) == (None if i % 2 == 0 else expected(1, 0, i))
        assert handles.get(new[i]) == expected(1, 1, i)
    freed = {fh & 0xFFFFFFFF for fh in fhs[0::2]}
    assert freed <= {fh & 0xFFFFFFFF for fh in new}


def test_a_forked_process_must_bind_before_it_adds(handles):
    handles.add(1, None, 0)  # the creating process alone: range 0 without bind

    def child() -> None:
        with pytest.raises(RuntimeError, match="bind"):
            handles.add(2, None, 0)

    assert wait(fork(child)) == 0


def test_two_processes_adding_and_removing_at_once_keep_every_record(handles, tmp_path):
    count = 2000
    gate = Gate()

    def lists(index: int, phase: int) -> Path:
        return tmp_path / f"fhs-{index}-{phase}"

    def child(index: int) -> Callable[[], None]:
        def run() -> None:
            handles.bind(index)
            first = [add(handles, expected(index, 0, i)) for i in range(count)]
            lists(index, 0).write_text(" ".join(map(str, first)))
            gate.wait()
            # both processes remove every phase-0 handle of both, in the same order (so they
            # race for each one), while adding their phase-1 ones
            victims = [
                (owner, i, int(fh))
                for owner in (0, 1)
                for i, fh in enumerate(lists(owner, 0).read_text().split())
            ]
            random.Random(7).shuffle(victims)
            second, removed = [], 0
            for n, (owner, i, fh) in enumerate(victims):
                record = handles.remove(fh)
                if record is not None:
                    assert record == expected(owner, 0, i), (owner, i, record)
                    removed += 1
                if n % 2 == 0:
                    j = len(second)
                    second.append(add(handles, expected(index, 1, j)))
                    assert handles.get(second[j]) == expected(index, 1, j)
            for j, fh in enumerate(second):
                assert handles.get(fh) == expected(index, 1, j)
            lists(index, 1).write_text(" ".join(map(str, second)) + f"\n{removed}")

        return run

    pids = [fork(child(index)) for index in (0, 1)]
    try:
        deadline = time.monotonic() + WAIT_S
        while not all(lists(index, 0).exists() for index in (0, 1)):
            assert time.monotonic() < deadline, "the children never added their handles"
            time.sleep(0.005)
        time.sleep(0.05)  # the lists are written whole
        gate.open()
    finally:
        assert [wait(pid) for pid in pids] == [0, 0]
        gate.close()
    removed = 0
    for index in (0, 1):
        first = [int(w) for w in lists(index, 0).read_text().split()]
        text, removed_here = lists(index, 1).read_text().split("\n")
        removed += int(removed_here)
        assert all(handles.get(fh) is None for fh in first)
        second = [int(w) for w in text.split()]
        assert len(second) == count
        assert [handles.get(fh) for fh in second] == [expected(index, 1, j) for j in range(count)]
    assert removed == 2 * count  # each handle was removed once, by one of the two


def test_a_full_range_refuses_until_a_handle_is_removed_anywhere(tmp_path):
    shared = SharedHandles.create(tmp_path, 2, per_process=4)
    try:
        shared.bind(1)
        fhs = [shared.add(i, None, 0) for i in range(4)]
        with pytest.raises(OSError) as info:
            shared.add(9, None, 0)
        assert info.value.errno == errno.ENFILE
        # a RELEASE in another process frees a slot the owner finds again
        assert wait(fork(lambda: shared.remove(fhs[2]))) == 0
        fh = shared.add(9, "e", 1)
        assert fh & 0xFFFFFFFF == fhs[2] & 0xFFFFFFFF
        assert fh != fhs[2]
        with pytest.raises(OSError):
            shared.add(10, None, 0)
        assert shared.remove(fhs[0]) is not None
        assert shared.get(shared.add(10, None, 0)) == HandleRecord(10, None, 0)
    finally:
        shared.close()


def test_a_writer_killed_inside_a_slot_leaves_it_free_for_everyone(handles):
    handles.bind(0)
    fh = handles.add(1, AZURE_ETAG, 10)
    offset = (fh & 0xFFFFFFFF) * handles_module.SLOT_SIZE

    def dies_mid_write() -> None:
        # what remove does, stopped after its first store: the slot's sequence is odd, and
        # the slot's lock is held when the process dies
        handles._lock(offset)
        (seq,) = struct.unpack_from("<I", handles._mm, offset)
        struct.pack_into("<I", handles._mm, offset, seq + 1)
        os.kill(os.getpid(), signal.SIGKILL)

    assert wait(fork(dies_mid_write)) == -signal.SIGKILL
    assert handles.get(fh) is None  # no hang: the lock went with the process; repaired
    assert handles.remove(fh) is None
    again = handles.add(2, None, 0)
    assert handles.get(again) == HandleRecord(2, None, 0)


def test_an_append_counts_its_time_under_the_lock_and_a_known_name_none(names, monkeypatch):
    readings = iter(range(0, 10_000, 7))
    monkeypatch.setattr(lock_time, "_clock", lambda: next(readings))
    before = lock_time.held_s()
    names.publish_all([(41, "a"), (42, "b")])  # one append, one section
    names.publish(41, "a")  # known here: no lock taken
    names.path_of(41)  # known here: no lock either
    assert lock_time.held_s() - before == pytest.approx(7e-9)
