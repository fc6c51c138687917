"""Reading through a mount the way the benchmark's readers do: reader threads taking file jobs
from one queue into the result buffer (optionally hinting their order to the mount), and a walk
of the whole tree."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from scenarios.plans import FileJob


def in_threads(
    name: str, threads: int, work: Callable[[threading.Event], None], timeout_s: float
) -> None:
    """Run `work(stop)` on `threads` threads; the first error sets `stop` for the others.

    Raises the first error, or TimeoutError (the caller then aborts the mount, which unblocks
    the threads).
    """
    errors: list[BaseException] = []
    stop = threading.Event()

    def guarded() -> None:
        try:
            work(stop)
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    pool = [
        threading.Thread(target=guarded, name=f"{name}-{i}", daemon=True) for i in range(threads)
    ]
    for thread in pool:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in pool:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            stop.set()
            raise TimeoutError(f"{name} threads still busy after {timeout_s:.0f}s")
    if errors:
        raise errors[0]


@dataclass(frozen=True, slots=True)
class HintSource:
    """Read-order hints for a mount run: how far ahead, and the daemon's environment (which
    says where its hint socket is)."""

    window: int
    environ: Mapping[str, str]

    def wrap(self, jobs: Iterator[FileJob], path_of: Callable[[FileJob], str]) -> Iterator[FileJob]:
        from blobmount.hints.client import hinted

        return hinted(jobs, window=self.window, path_of=path_of, environ=self.environ)


def read_through_mount(
    root: Path,
    jobs: Sequence[FileJob],
    threads: int,
    buf: bytearray,
    timeout_s: float,
    hints: HintSource | None = None,
) -> None:
    """Run `jobs` on `threads` reader threads; every read goes into `buf` at its dest. With
    `hints`, the jobs' paths are hinted to the mount a window ahead of the readers, in the order
    the readers take them (what `blobmount.hints.client.HintedSampler` does for a data loader)."""
    view = memoryview(buf)
    base = str(root)
    source: Iterator[FileJob] = iter(jobs)
    if hints is not None:
        source = hints.wrap(source, lambda job: f"{base}/{job.blob}")
    taking = threading.Lock()

    def reader(stop: threading.Event) -> None:
        while not stop.is_set():
            with taking:
                job = next(source, None)
            if job is None:
                return
            fd = os.open(f"{base}/{job.blob}", os.O_RDONLY)
            try:
                for r in job.reads:
                    done = 0
                    while done < r.length:
                        n = os.preadv(
                            fd, [view[r.dest + done : r.dest + r.length]], r.offset + done
                        )
                        if n <= 0:
                            raise OSError(f"{job.blob}: read ended at {r.offset + done}")
                        done += n
            finally:
                os.close(fd)

    in_threads("reader", threads, reader, timeout_s)


def walk_mount(root: Path, timeout_s: float) -> set[str]:
    """Every file under `root` (os.walk: a scandir of each folder, no stat of files), as paths
    relative to it: what a data loader indexing its dataset does."""
    found: set[str] = set()

    def walk(stop: threading.Event) -> None:
        for folder, _, files in os.walk(root):
            rel = os.path.relpath(folder, root)
            found.update(name if rel == "." else f"{rel}/{name}" for name in files)

    in_threads("walker", 1, walk, timeout_s)
    return found
