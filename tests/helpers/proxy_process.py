"""A proxy that runs as a process of its own, and the fault proxy's admission limits run that way.

`ProxyProcess` is the handle on any such proxy (the benchmark's delay and throttle proxies build
on it too): start the script, wait for the ``port N`` line it prints once it listens, talk to it
over its stdin, stop it by its PID. Standard library only: proxy scripts import it when they run.

`AdmissionProxy` runs the fault proxy's admission limits (tests/helpers/fault_proxy.py
`Admission`), for tests that measure how a client adapts to them. In the test's process the
proxy's asyncio thread shares the GIL with the client under test: on a loaded machine it answers
late and lets go of a request it counts as "in flight" well after the client has its answer, so
a server admitting N at once looks like fewer to the client. In a process of its own it keeps up:

    with AdmissionProxy(azurite.port, Admission(max_in_flight=3, kinds=RANGE_ONLY)) as p:
        url = p.account_url
        p.counts("range")   # {'requests': n, 'forwarded': m, 'busy': k}, as FaultProxy.counts

Run as `python -m tests.helpers.proxy_process --upstream-port P [--max-in-flight N]
[--per-second N] [--retry-after S] [--kinds range,list]` it prints ``port N`` once it listens,
answers each ``counts`` line on stdin with a JSON line ({kind: counts}, plus "most_forwarding"),
and exits when stdin closes or on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import selectors
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.helpers.fault_proxy import ACCOUNT, HOST, KINDS, Admission, FaultProxy

#: the repository's root: the proxy's working directory, so `-m tests.helpers...` imports
REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 15.0
ANSWER_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0


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
        """The script (or `-m module`) and its arguments."""
        raise NotImplementedError

    def start(self) -> Self:
        self._proc = subprocess.Popen(
            [sys.executable, *self._command()],
            cwd=REPO,
            stdin=subprocess.PIPE if self.commands else None,
            stdout=subprocess.PIPE,
            text=True,
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

    def _ask(self, command: str, timeout_s: float = ANSWER_TIMEOUT_S) -> str:
        """Send one command line; its one-line answer (RuntimeError if none comes in time)."""
        if self._proc is None or self._proc.stdin is None:
            raise RuntimeError(f"{self.what} not started")
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()
        line = self._readline(timeout_s)
        if not line:
            raise RuntimeError(f"the {self.what} did not answer {command!r}")
        return line

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


# -- the admission proxy ------------------------------------------------------------------


def serve(upstream_port: int, admission: Admission) -> None:
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: done.set())
    with FaultProxy(upstream_port) as proxy:
        proxy.set_admission(admission)
        print(f"port {proxy.port}", flush=True)

        def answer() -> None:
            for line in sys.stdin:
                if line.strip() == "counts":
                    counts: dict[str, object] = {kind: proxy.counts(kind) for kind in KINDS}
                    counts["most_forwarding"] = proxy.most_forwarding
                    print(json.dumps(counts), flush=True)
            done.set()

        threading.Thread(target=answer, name="commands", daemon=True).start()
        done.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the fault proxy's admission limits")
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--max-in-flight", type=int)
    parser.add_argument("--per-second", type=int)
    parser.add_argument("--retry-after")
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args(argv)
    admission = Admission(
        max_in_flight=args.max_in_flight,
        per_second=args.per_second,
        retry_after=args.retry_after,
        kinds=frozenset(args.kinds.split(",")),
    )
    serve(args.upstream_port, admission)
    return 0


class AdmissionProxy(ProxyProcess):
    """A running admission proxy in front of `upstream_port` (see the module docstring)."""

    what = "admission proxy"
    commands = True

    def __init__(self, upstream_port: int, admission: Admission) -> None:
        super().__init__()
        self.upstream_port = upstream_port
        self.admission = admission

    @property
    def account_url(self) -> str:
        return f"http://{HOST}:{self.port}/{ACCOUNT}"

    def _command(self) -> list[str]:
        rule = self.admission
        cmd = ["-m", "tests.helpers.proxy_process"]
        cmd += ["--upstream-port", str(self.upstream_port), "--kinds", ",".join(rule.kinds)]
        if rule.max_in_flight is not None:
            cmd += ["--max-in-flight", str(rule.max_in_flight)]
        if rule.per_second is not None:
            cmd += ["--per-second", str(rule.per_second)]
        if rule.retry_after is not None:
            cmd += ["--retry-after", rule.retry_after]
        return cmd

    def _counts(self) -> dict[str, object]:
        answer: dict[str, object] = json.loads(self._ask("counts"))
        return answer

    def counts(self, kind: str) -> dict[str, int]:
        """As FaultProxy.counts(kind): {'requests': n, 'forwarded': n, 'busy': n}."""
        counts = self._counts()[kind]
        assert isinstance(counts, dict)
        return {str(k): int(v) for k, v in counts.items()}

    @property
    def most_forwarding(self) -> int:
        most = self._counts()["most_forwarding"]
        assert isinstance(most, int)
        return most


if __name__ == "__main__":
    sys.exit(main())
