"""Run the real `blobmount` daemon on a real FUSE mount point, and always clean it up.

Teardown order: `fusermount3 -u`, then `-u -z` if busy, then SIGTERM and SIGKILL by PID, so a
failing test never leaves a mount or a daemon behind. The daemon's log is attached to failures.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from blobmount.readiness import READY_FD_ENV, wait_for_ready_line


def fuse_unavailable_reason() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (run `make setup`)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "no permission to open /dev/fuse"
    return None


def is_mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/mounts") as mounts:
        return any(line.split()[1].replace("\\040", " ") == target for line in mounts)


class MountedDaemon:
    """`blobmount mount --foreground URI MOUNTPOINT` in a subprocess."""

    def __init__(
        self,
        uri: str,
        mountpoint: Path,
        env: dict[str, str],
        log_file: Path,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.uri = uri
        self.mountpoint = mountpoint
        self.env = env
        self.log_file = log_file
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60) -> MountedDaemon:
        """Start the daemon and return once it says it is ready on the pipe `blobmount mount`
        itself waits on: after the mount answers and its kernel settings are tuned, which the
        mount table alone does not show."""
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "blobmount",
            "mount",
            "--foreground",
            "--log-file",
            str(self.log_file),
            *self.extra_args,
            self.uri,
            str(self.mountpoint),
        ]
        read_fd, write_fd = os.pipe()
        try:
            self.proc = subprocess.Popen(
                cmd,
                env={**self.env, READY_FD_ENV: str(write_fd)},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
            )
            os.close(write_fd)
            write_fd = -1
            message = wait_for_ready_line(read_fd, self.proc, timeout_s)
        finally:
            os.close(read_fd)
            if write_fd >= 0:
                os.close(write_fd)
        if message.startswith("ready "):
            return self
        self.stop()
        raise RuntimeError(f"{message}:\n{self.log()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 30) -> int | None:
        if is_mounted(self.mountpoint):
            for args in (["-u"], ["-u", "-z"]):
                if (
                    subprocess.run(
                        ["fusermount3", *args, str(self.mountpoint)], capture_output=True
                    ).returncode
                    == 0
                ):
                    break
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def daemon_stats(daemon: MountedDaemon) -> dict:
    """The daemon's live stats. It may answer FUSE a moment before its stats socket listens
    (seen under load), so a refused connection is tried again for a few seconds."""
    from blobmount.runstate import stats_socket
    from blobmount.stats import fetch_stats

    deadline = time.monotonic() + 10
    while True:
        try:
            return fetch_stats(stats_socket(daemon.mountpoint))
        except (ConnectionRefusedError, FileNotFoundError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
