"""A FUSE daemon in a subprocess on a fresh mount point, always unmounted and stopped.

Used for every mount a benchmark reads (blobmount, rclone, the bare filesystem of floor.py):
the caller gives the command line and environment, `MountedDaemon` waits for the mount to
answer and takes it down again (fusermount3 -u, then -u -z; SIGTERM, then SIGKILL, by PID).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)

MOUNT_READY_TIMEOUT_S = 60.0
UNMOUNT_WAIT_S = 30.0


def is_mounted(path: Path) -> bool:
    target = os.path.abspath(path)
    try:
        with open("/proc/mounts") as mounts:
            return any(line.split()[1].replace("\\040", " ") == target for line in mounts)
    except OSError:
        return False


def fusermount_unmount(path: Path) -> bool:
    """`fusermount3 -u`, then `-u -z` (lazy) if that fails; True once it is not mounted."""
    for args in (["-u"], ["-u", "-z"]):
        if not is_mounted(path):
            return True
        subprocess.run(["fusermount3", *args, str(path)], capture_output=True, check=False)
    return not is_mounted(path)


class MountedDaemon:
    """A FUSE daemon in a subprocess (own session: a terminal's ^C reaches only the harness)
    on a fresh mount point, cache dir and runtime dir. Always unmounted and stopped on exit."""

    def __init__(self, cmd: list[str], env: dict[str, str], work: Path) -> None:
        self.cmd = cmd
        self.env = env
        self.work = work
        #: what shows the mount answers (a listing benchmark must not list the root before
        #: the clock starts, and sets os.stat)
        self.ready_check: Callable[[Path], object] = os.listdir
        self.mountpoint = work / "mnt"
        self.log_file = work / "daemon.log"
        #: where the daemon's log is kept after the work dir is removed
        self.log_copy: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.mount_s: float | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("daemon not started")
        return self.proc.pid

    def log_tail(self, limit: int = 3000) -> str:
        """The end of the daemon's log, or of its stderr when the log is empty."""
        for path in (self.log_file, self.work / "daemon.stderr"):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            if text.strip():
                return text[-limit:]
        return "(no log)"

    def start(self) -> MountedDaemon:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        # the daemon logs to log_file itself (and to stderr in the foreground): keep its
        # stdout/stderr apart, for what happens before logging starts
        with open(self.work / "daemon.stderr", "ab") as out:
            self.proc = subprocess.Popen(
                self.cmd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + MOUNT_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the daemon exited with status {self.proc.returncode} before the mount "
                    f"was ready:\n{self.log_tail()}"
                )
            if is_mounted(self.mountpoint):
                try:
                    self.ready_check(self.mountpoint)
                except OSError:
                    pass
                else:
                    self.mount_s = time.perf_counter() - started
                    return self
            time.sleep(0.05)
        raise RuntimeError(
            f"mount not ready after {MOUNT_READY_TIMEOUT_S:.0f}s:\n{self.log_tail()}"
        )

    def abort(self) -> None:
        """Kill the daemon now, then lazy-unmount (a stalled or interrupted run).

        The kill comes first: while a reader holds a file of a daemon that does not answer,
        starting any subprocess (fusermount3 included) hangs, because the child's exec closes
        the inherited FUSE descriptors and each close waits for the daemon's FLUSH reply. A dead
        daemon aborts the FUSE connection, so every waiting request fails at once.
        """
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        subprocess.run(
            ["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True, check=False
        )

    def stop(self) -> None:
        """fusermount3 -u, then -u -z; wait for the daemon; SIGTERM, then SIGKILL, by PID."""
        unmounted = fusermount_unmount(self.mountpoint)
        proc = self.proc
        if proc is not None:
            try:
                proc.wait(UNMOUNT_WAIT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
        if self.log_copy is not None:
            with contextlib.suppress(OSError):
                self.log_copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.log_file, self.log_copy)
        if unmounted or fusermount_unmount(self.mountpoint):
            shutil.rmtree(self.work, ignore_errors=True)
        else:
            log.error("%s is still mounted; left %s in place", self.mountpoint, self.work)

    def __enter__(self) -> MountedDaemon:
        try:
            return self.start()
        except BaseException:
            self.abort()
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self.abort()
        self.stop()
