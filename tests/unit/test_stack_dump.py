"""`kill -USR1` makes a blobmount process write its threads' stacks and go on (cli)."""

import signal
import subprocess
import sys
import time

PROGRAM = """
import sys, time
from blobmount.cli import _stacks_on_sigusr1
if sys.argv[1] == "register":
    _stacks_on_sigusr1()
print("ready", flush=True)
time.sleep(2)
print("went on", flush=True)
"""


def _run(mode: str) -> subprocess.CompletedProcess[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        time.sleep(0.2)  # in the sleep
        child.send_signal(signal.SIGUSR1)
        out, err = child.communicate(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def test_sigusr1_writes_the_stacks_and_the_process_goes_on() -> None:
    done = _run("register")
    assert done.returncode == 0
    assert done.stdout == "went on\n"
    assert "Current thread" in done.stderr or "Thread 0x" in done.stderr
    assert "<string>" in done.stderr  # the program's own frame, in time.sleep


def test_without_it_the_signal_ends_the_process() -> None:
    # shows the test above can fail: SIGUSR1's default action ends the process
    done = _run("plain")
    assert done.returncode == -signal.SIGUSR1
    assert "went on" not in done.stdout
