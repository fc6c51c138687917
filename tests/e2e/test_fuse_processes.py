"""One FUSE connection served by several processes (blobmount.fuse_processes), through a real
mount of a tiny stateless filesystem (tests/helpers/multiproc_fs.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import multiproc_fs

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 10.0


@dataclass
class Served:
    process: subprocess.Popen[str]
    mountpoint: Path
    log: Path
    zygote: int
    lines: list[str] = field(default_factory=list)

    def pids_that_served(self) -> set[int]:
        return {int(line) for line in self.log.read_text().split()}

    def workers(self) -> dict[int, int]:
        """index -> pid of the live workers, from the zygote's events seen so far."""
        live: dict[int, int] = {}
        for line in list(self.lines):
            kind, index, pid, _ = line.split()
            if kind == "started":
                live[int(index)] = int(pid)
            elif live.get(int(index)) == int(pid):
                del live[int(index)]
        return live


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return False


def _wait_for(check, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {WAIT_S}s: {what}")


@pytest.fixture
def served(fuse_ok, tmp_path) -> Iterator[Served]:
    mountpoint, log = tmp_path / "mnt", tmp_path / "served"
    mountpoint.mkdir()
    log.touch()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.multiproc_fs", str(mountpoint), "3", str(log)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    first = process.stdout.readline().split()
    mount = Served(process, mountpoint, log, int(first[1]) if first[:1] == ["ready"] else 0)

    def collect() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            mount.lines.append(line.strip())

    threading.Thread(target=collect, daemon=True).start()
    every = {process.pid}
    try:
        assert mount.zygote, f"the helper did not start: {first}"
        _wait_for(lambda: len(mount.workers()) == 2, "two workers started")
        every |= {mount.zygote, *mount.workers().values()}
        yield mount
    finally:
        every |= set(mount.workers().values())
        subprocess.run(["fusermount3", "-u", str(mountpoint)], capture_output=True)
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=WAIT_S)
        for pid in every:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait()


def _read_all(mountpoint: Path, threads: int = 6) -> list[BaseException]:
    """Read every file with `threads` readers; the errors met (a read that hangs fails the test
    through the join timeout)."""
    errors: list[BaseException] = []

    def reader(part: int) -> None:
        for index in range(part, multiproc_fs.FILES, threads):
            try:
                data = (mountpoint / f"f{index:03d}").read_bytes()
                assert data == multiproc_fs.content(index), f"f{index:03d}: wrong bytes"
            except (OSError, AssertionError) as exc:
                errors.append(exc)

    workers = [threading.Thread(target=reader, args=(n,), daemon=True) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert not worker.is_alive(), "a read hung"
    return errors


def test_every_process_serves_and_the_bytes_are_right(served):
    for _ in range(3):
        assert _read_all(served.mountpoint) == []
    servers = served.pids_that_served()
    assert served.process.pid in servers
    assert servers & set(served.workers().values()), "no worker answered a read"
    assert servers <= {served.process.pid, *served.workers().values()}


def test_a_killed_worker_is_replaced_and_the_mount_keeps_serving(served):
    index, victim = sorted(served.workers().items())[0]
    stop = threading.Event()
    errors: list[BaseException] = []

    def keep_reading() -> None:
        while not stop.is_set():
            errors.extend(_read_all(served.mountpoint, threads=3))

    load = threading.Thread(target=keep_reading, daemon=True)
    load.start()
    time.sleep(0.3)
    os.kill(victim, signal.SIGKILL)
    _wait_for(lambda: served.workers().get(index, victim) != victim, "the worker replaced")
    time.sleep(0.3)
    stop.set()
    load.join(timeout=60)
    assert not load.is_alive(), "reads hung after a worker was killed"
    # a read the dead worker had taken may fail; none returns wrong bytes
    assert all(isinstance(e, OSError) for e in errors), errors
    served.log.write_text("")
    for _ in range(3):
        assert _read_all(served.mountpoint) == []
    assert served.workers()[index] in served.pids_that_served(), "the new worker never served"
    assert f"ended {index} {victim} -9" in served.lines


def test_killing_the_main_process_leaves_no_worker_behind(served):
    others = [served.zygote, *served.workers().values()]
    os.kill(served.process.pid, signal.SIGKILL)
    served.process.wait(timeout=WAIT_S)
    _wait_for(lambda: not any(_alive(pid) for pid in others), "zygote and workers gone")


def test_unmounting_ends_every_process(served):
    others = [served.zygote, *served.workers().values()]
    subprocess.run(["fusermount3", "-u", str(served.mountpoint)], check=True)
    assert served.process.wait(timeout=WAIT_S) == 0
    _wait_for(lambda: not any(_alive(pid) for pid in others), "zygote and workers gone")
