"""A multi-process mount's shared folder: a new one per mount, and the folders of mounts whose
process is gone (a SIGKILLed daemon leaves its folder) removed when the next one is made."""

from __future__ import annotations

import os

from blobmount import daemon_processes
from tests.helpers.forked import fork, wait


def test_the_folders_of_dead_mounts_go_and_the_living_stay(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(daemon_processes, "SHARED_ROOT", tmp_path)
    dead = fork(lambda: None)
    assert wait(dead) == 0  # reaped: the pid names no process now
    stale = tmp_path / f"blobmount-{dead}-abc"
    (stale / "pages").mkdir(parents=True)
    living = tmp_path / f"blobmount-{os.getppid()}-def"
    living.mkdir()
    other = tmp_path / "blobmount-notapid"
    other.mkdir()

    made = daemon_processes._shared_folder()

    assert made.parent == tmp_path
    assert made.name.startswith(f"blobmount-{os.getpid()}-")
    assert not stale.exists()
    assert living.is_dir()
    assert other.is_dir()


def test_each_mount_gets_a_folder_of_its_own(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(daemon_processes, "SHARED_ROOT", tmp_path)
    first, second = daemon_processes._shared_folder(), daemon_processes._shared_folder()
    assert first != second
    assert first.is_dir()
    assert second.is_dir()
