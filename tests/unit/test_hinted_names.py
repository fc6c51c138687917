"""The set of blob names the main process has hints for (multiproc/hinted_names.py): written by
one process, read without a lock by processes forked before the writes."""

from __future__ import annotations

import os

from blobmount.multiproc.hinted_names import SharedHintedNames, name_key
from blobmount.multiproc.key_set import WINDOW


def test_added_names_are_held_until_discarded(tmp_path):
    names = SharedHintedNames.create(tmp_path)
    try:
        assert not names.holds("d/a.jpg")
        names.add("d/a.jpg")
        names.add("d/b.jpg")
        names.add("d/a.jpg")  # twice: one entry
        assert names.holds("d/a.jpg")
        assert names.holds("d/b.jpg")
        assert len(names) == 2
        names.discard("d/a.jpg")
        names.discard("d/never.jpg")  # not there: nothing happens
        assert not names.holds("d/a.jpg")
        assert names.holds("d/b.jpg")  # past the removed slot, if they share a window
    finally:
        names.close()


def test_names_sharing_a_window_and_a_full_window(tmp_path):
    # a table of WINDOW slots: every name's window is the whole table
    names = SharedHintedNames.create(tmp_path, slots=WINDOW)
    try:
        many = [f"f{i}" for i in range(WINDOW + 5)]
        for name in many:
            names.add(name)
        # the first WINDOW fit; the rest are not recorded (their opens are served where they
        # land): a cost, never a wrong answer
        assert [names.holds(name) for name in many] == [True] * WINDOW + [False] * 5
        names.discard(many[0])
        names.add(many[-1])  # takes the removed slot
        assert names.holds(many[-1])
        assert not names.holds(many[0])
        assert all(names.holds(name) for name in many[1:WINDOW])
    finally:
        names.close()


def test_a_process_forked_before_the_writes_sees_them(tmp_path):
    names = SharedHintedNames.create(tmp_path)
    read_end, write_end = os.pipe()
    go_end, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.close(go_write)
        os.read(go_end, 1)  # wait for the parent's writes
        seen = names.holds("d/a.jpg"), names.holds("d/b.jpg")
        os.write(write_end, bytes(seen))
        os._exit(0)
    os.close(write_end)
    os.close(go_end)
    names.add("d/a.jpg")
    names.add("d/b.jpg")
    names.discard("d/b.jpg")
    os.write(go_write, b"x")
    assert os.read(read_end, 2) == bytes([True, False])
    os.waitpid(pid, 0)
    names.close()


def test_keys_are_never_the_empty_or_removed_marks():
    assert all(name_key(f"n{i}") >= 2 for i in range(1000))
