"""A bare in-memory read-only pyfuse3 filesystem, served by one or several processes.

    python benchmarks/multiproc/multifs.py MOUNTPOINT [--files N] [--size B] [--big-bytes B]
        [--processes N] [--clone] [--pdeathsig] [--counts FILE] [--read-delay-ms MS]
        [--handoff-workers W] [--direct-io]

What it measures: nothing by itself; `drive.py`, `killtest.py` and `stalltest.py` mount it.
It is `benchmarks/bare_fs.py` with deterministic content (`content.py`): every process computes
the same bytes from a file's index, so any process can answer any request. Root inode 1, small
file i (named f00000...) inode i + 2, one big file "big" after them.

Route 1 (`--processes N`), the steps the spike found to work with pyfuse3 3.5 / libfuse 3.14:
 1. `pyfuse3.init()` mounts (the libfuse session and the /dev/fuse fd).
 2. A helper *thread* runs `trio.run(pyfuse3.main)` until `Operations.init()` has run (libfuse
    sends the INIT reply in the same synchronous call), then cancels it; no
    `pyfuse3.terminate()`, so the session is not marked exited. The thread ends, and with it
    libfuse's per-thread splice pipe (a pthread key destructor closes it): no process inherits
    a pipe another one also splices requests through.
 3. With no other thread left, fork N-1 children; every process, the parent too, runs
    `trio.run(pyfuse3.main)` on the session it inherited. `--clone`: each child first swaps its
    fd for its own FUSE_DEV_IOC_CLONE of the connection (so a killed child's unanswered
    requests are aborted instead of hanging); `--pdeathsig`: children die with the parent.
`fusermount3 -u` ends every process's loop (ENODEV); the parent reaps its children.

Route 2 (`--handoff-workers W`, one FUSE process): read payloads are made by W worker
processes into shared memory (`handoff.py`). `--read-delay-ms` makes every read await that long
first (a stand-in for a network fetch). `--counts FILE` keeps per-process request counters
(`counters.py`), also dumped to FILE.<pid>.json at exit and on SIGUSR1.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import stat
import struct
import sys
import threading
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parents[1]
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import pyfuse3  # noqa: E402
import trio  # noqa: E402

from multiproc.content import (  # noqa: E402
    FIRST_INODE,
    ROOT_INODE,
    big_bytes,
    big_inode,
    small_bytes,
)
from multiproc.counters import MAX_PROCESSES, Counters  # noqa: E402
from multiproc.handoff import Handoff  # noqa: E402

IDLE_WORKERS = 16
KERNEL_TIMEOUT_S = 3600.0
DIR_MODE = stat.S_IFDIR | 0o555
FILE_MODE = stat.S_IFREG | 0o444
#: _IOR(229, 0, uint32_t): give a new /dev/fuse fd its own queue on an existing connection
FUSE_DEV_IOC_CLONE = (2 << 30) | (4 << 16) | (229 << 8) | 0
PR_SET_PDEATHSIG = 1


def name_of(index: int) -> bytes:
    return b"f%05d" % index


class MultiFS(pyfuse3.Operations):  # type: ignore[misc]
    """Every name and byte computed from the file index; the same in every process."""

    def __init__(self, files: int, size: int, big: int, direct_io: bool, delay_s: float) -> None:
        super().__init__()
        self.files = files
        self.size = size
        self.big_bytes = big
        self.big_inode = big_inode(files)
        self.direct_io = direct_io
        self.delay_s = delay_s
        self.init_done = False
        self.counters: Counters | None = None
        self.handoff: Handoff | None = None

    def count(self, op: str) -> None:
        if self.counters is not None:
            self.counters.count(op)

    def file_size(self, inode: int) -> int:
        return self.big_bytes if inode == self.big_inode else self.size

    def entry(self, inode: int) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = inode
        entry.entry_timeout = KERNEL_TIMEOUT_S
        entry.attr_timeout = KERNEL_TIMEOUT_S
        directory = inode == ROOT_INODE
        entry.st_mode = DIR_MODE if directory else FILE_MODE
        entry.st_size = 0 if directory else self.file_size(inode)
        entry.st_nlink = 1
        entry.st_blksize = 4096
        entry.st_blocks = -(-entry.st_size // 512)
        return entry

    def inode_of(self, name: bytes) -> int | None:
        if name == b"big":
            return self.big_inode
        if len(name) == 6 and name[:1] == b"f" and name[1:].isdigit():
            index = int(name[1:])
            if index < self.files:
                return index + FIRST_INODE
        return None

    def init(self) -> None:
        self.init_done = True

    async def lookup(self, parent: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        self.count("lookup")
        inode = self.inode_of(name) if parent == ROOT_INODE else None
        if inode is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.entry(inode)

    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        self.count("getattr")
        return self.entry(inode)

    async def opendir(self, inode: int, ctx: Any) -> int:
        self.count("opendir")
        return int(inode)

    async def readdir(self, fh: int, start: int, token: Any) -> None:
        self.count("readdir")
        for i in range(start, self.files + 1):
            inode = i + FIRST_INODE
            name = b"big" if inode == self.big_inode else name_of(i)
            if not pyfuse3.readdir_reply(token, name, self.entry(inode), i + 1):
                return

    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        self.count("open")
        if self.direct_io:
            return pyfuse3.FileInfo(fh=inode, direct_io=True, keep_cache=False)
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    async def read(self, fh: int, offset: int, size: int) -> bytes | memoryview:
        self.count("read")
        if self.delay_s:
            await trio.sleep(self.delay_s)
        if self.handoff is not None:
            return await self.handoff.fetch(fh, offset, size, self.file_size(fh))
        if fh == self.big_inode:
            return big_bytes(offset, size, self.big_bytes)
        return small_bytes(fh - FIRST_INODE, offset, size, self.size)

    async def release(self, fh: int) -> None:
        self.count("release")

    async def flush(self, fh: int) -> None:
        self.count("flush")
        raise pyfuse3.FUSEError(errno.ENOSYS)

    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        self.count("other")
        return pyfuse3.StatvfsData()


# -- route 1: the INIT phase in a thread, then fork ------------------------------------------


def wait_for_init(fs: MultiFS) -> None:
    """Run in a helper thread: serve until the kernel's INIT has been answered, then stop."""

    async def phase1() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pyfuse3.main, IDLE_WORKERS)
            while not fs.init_done:  # a flag set by a libfuse callback: poll it
                await trio.sleep(0.002)
            # libfuse's do_init() calls Operations.init() and sends the reply inside the same
            # synchronous fuse_session_process_buf(): the reply is out by now
            nursery.cancel_scope.cancel()

    trio.run(phase1)


def set_pdeathsig(sig: int) -> None:
    """Have the kernel send `sig` to this process when the thread that forked it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def fuse_fd() -> int:
    """The session's /dev/fuse fd (pyfuse3 does not expose it; it is the only one open)."""
    fds = [
        int(fd)
        for fd in os.listdir("/proc/self/fd")
        if os.path.realpath(f"/proc/self/fd/{fd}") == "/dev/fuse"
    ]
    if len(fds) != 1:
        raise RuntimeError(f"expected one /dev/fuse fd, found {fds}")
    return fds[0]


def clone_session_fd() -> None:
    """Give this process its own clone of the connection's device fd, under the fd number the
    libfuse session (and pyfuse3) already use."""
    old = fuse_fd()
    new = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    fcntl.ioctl(new, FUSE_DEV_IOC_CLONE, struct.pack("I", old))
    os.dup2(new, old, inheritable=False)
    os.close(new)


def fork_children(processes: int, pdeathsig: bool, clone: bool) -> tuple[int, list[int]]:
    """Fork `processes - 1` children; returns (this process's row, the children's pids)."""
    children: list[int] = []
    for row in range(1, processes):
        pid = os.fork()
        if pid == 0:
            if pdeathsig:
                set_pdeathsig(signal.SIGKILL)
                if os.getppid() == 1:  # the parent died before prctl
                    os._exit(1)
            if clone:
                clone_session_fd()
            return row, []
        children.append(pid)
    return 0, children


def serve(fs: MultiFS, row: int, counts_path: str | None) -> int:
    """This process's FUSE loop until the mount goes away; returns its exit status."""
    if counts_path:
        fs.counters = Counters(counts_path, create=False, row=row)
        counters = fs.counters
        signal.signal(signal.SIGUSR1, lambda *_: counters.dump())
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    handoff = fs.handoff

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            if handoff is not None:
                nursery.start_soon(handoff.run_receivers)
            await pyfuse3.main(IDLE_WORKERS)
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    except BaseException as exc:
        print(f"multifs[{os.getpid()} row {row}]: {exc!r}", file=sys.stderr, flush=True)
        return 1
    finally:
        if fs.counters is not None:
            fs.counters.dump()
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mountpoint")
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--size", type=int, default=25_000)
    parser.add_argument("--big-bytes", type=int, default=1 << 30)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--counts", help="shared counters file (in /dev/shm)")
    parser.add_argument("--direct-io", action="store_true")
    parser.add_argument("--pdeathsig", action="store_true", help="children die with the parent")
    parser.add_argument(
        "--clone", action="store_true", help="children serve through a FUSE_DEV_IOC_CLONE fd"
    )
    parser.add_argument("--read-delay-ms", type=float, default=0.0)
    parser.add_argument("--handoff-workers", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not 1 <= args.processes <= MAX_PROCESSES:
        parser.error(f"--processes must be 1..{MAX_PROCESSES}")
    if args.handoff_workers and args.processes != 1:
        parser.error("--handoff-workers needs --processes 1")
    if args.counts:
        Counters(args.counts, create=True).close()
    fs = MultiFS(args.files, args.size, args.big_bytes, args.direct_io, args.read_delay_ms / 1000)
    if args.handoff_workers:  # forked before the mount, with no thread running
        fs.handoff = Handoff(args.handoff_workers, args.files, args.size)
    options = {"fsname=multifs", "ro", "default_permissions", "noatime"}
    pyfuse3.init(fs, args.mountpoint, options)
    row, children = 0, []
    try:
        if args.processes > 1:
            helper = threading.Thread(target=wait_for_init, args=(fs,), name="fuse-init")
            helper.start()
            helper.join()
            if threading.active_count() != 1:
                raise RuntimeError(f"threads alive before fork: {threading.enumerate()}")
            row, children = fork_children(args.processes, args.pdeathsig, args.clone)
        if row == 0:
            print(f"multifs: serving with {args.processes} process(es)", file=sys.stderr)
        status = serve(fs, row, args.counts)
    except BaseException:
        if row != 0:
            os._exit(1)  # a child never unwinds into the parent's cleanup
        raise
    if row != 0:
        os._exit(status)
    for pid in children:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    if fs.handoff is not None:
        fs.handoff.close()
    pyfuse3.close(unmount=False)
    return status


if __name__ == "__main__":
    sys.exit(main())
