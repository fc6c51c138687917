"""The ready line a daemon sends its starter through a pipe, and how the starter reads it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from blobmount.readiness import READY_FD_ENV, ReadyNotifier, wait_for_ready_line


def start(code: str) -> tuple[subprocess.Popen[bytes], int]:
    """A child running `code` with the pipe's write end as READY_FD_ENV; returns (child, read
    end)."""
    read_fd, write_fd = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, READY_FD_ENV: str(write_fd)},
        pass_fds=(write_fd,),
    )
    os.close(write_fd)
    return child, read_fd


@pytest.fixture
def run():
    started: list[tuple[subprocess.Popen[bytes], int]] = []

    def go(code: str, timeout_s: float = 30) -> str:
        child, read_fd = start(code)
        started.append((child, read_fd))
        return wait_for_ready_line(read_fd, child, timeout_s)

    yield go
    for child, read_fd in started:
        os.close(read_fd)
        if child.poll() is None:
            child.kill()
        child.wait()


NOTIFY = "from blobmount.readiness import ReadyNotifier; n = ReadyNotifier(); "


def test_the_ready_line_is_read_and_the_pipe_closed_after_it(run):
    code = NOTIFY + "n.ready('mounted x at /m'); import time; time.sleep(30)"
    assert run(code) == "ready mounted x at /m"  # returns while the daemon keeps running


def test_an_error_line_is_read(run):
    assert run(NOTIFY + "n.error('no such container\\nreally'); raise SystemExit(1)") == (
        "error no such container really"
    )


def test_a_daemon_that_exits_without_a_word_is_reported_with_its_status(run):
    assert run("raise SystemExit(3)") == "the daemon exited (status 3) before the mount was ready"


def test_a_silent_daemon_is_given_up_on_after_the_timeout(run):
    assert run("import time; time.sleep(30)", timeout_s=0.5) == "the mount was not ready after 0.5s"


def test_without_a_pipe_the_notifier_says_nothing_and_does_not_fail():
    notifier = ReadyNotifier(env={})
    notifier.ready("mounted")
    assert notifier.state == "ready"
