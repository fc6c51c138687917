"""The harness' handle on a proxy that runs as a process of its own (the delay and throttle
proxies): start the script, wait for the ``port N`` line it prints once it listens, stop it by
its PID. Standard library only: the proxy scripts import this module when they run, too.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Self

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
#: benchmarks/: on the proxy process' path, so that its script can import `scenarios.*`
BENCH = Path(__file__).resolve().parents[1]


class ProxyProcess:
    """A proxy script run as a process; a context manager that stops it on the way out.

    A subclass names its script and arguments (`_command`) and what it is (`what`, for errors);
    with `commands` its stdin is a pipe the harness writes commands to (`_ask`), and closing it
    ends the proxy.
    """

    what = "proxy"
    commands = False

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self.port = 0

    def _command(self) -> list[str]:
        """The script and its arguments."""
        raise NotImplementedError

    def start(self) -> Self:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH), env.get("PYTHONPATH")) if p)
        self._proc = subprocess.Popen(
            [sys.executable, *self._command()],
            stdin=subprocess.PIPE if self.commands else None,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        # the first line says where it listens; a proxy that dies first gives an empty line
        line = self._readline(START_TIMEOUT_S)
        if not line.startswith("port "):
            self.stop()
            raise RuntimeError(f"the {self.what} did not start (it printed {line!r})")
        self.port = int(line.split()[1])
        return self

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError(f"{self.what} not started")
        return self._proc.pid

    def _ask(self, command: str, timeout_s: float) -> str:
        """Send one command line; its one-line answer, or "" if none comes in time."""
        if self._proc is None or self._proc.stdin is None:
            raise RuntimeError(f"{self.what} not started")
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()
        return self._readline(timeout_s)

    def _readline(self, timeout_s: float) -> str:
        assert self._proc is not None
        assert self._proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                return ""
        return self._proc.stdout.readline().strip()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not ended in STOP_TIMEOUT_S. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
