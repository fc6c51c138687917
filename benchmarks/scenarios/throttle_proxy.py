"""A proxy process that admits a fixed number of requests per second and answers the rest
503 ServerBusy, as a storage account over its request-rate target does (scenario `throttled`).

It is the tests' fault proxy (tests/helpers/fault_proxy.py) with its admission limit
(`Admission(per_second=N)`: the first N requests of each second go on to Azurite, the others get
a 503 at once, without a request upstream), run as a process of its own like the delay proxy
(scenarios/delay_proxy.py), so that its CPU is not taken from the harness' readers and is metered
apart ("proxy" in the run's CPU figures):

    python throttle_proxy.py --upstream-port P --per-second N [--retry-after S]

It prints ``port N`` once it listens, then answers each ``counts`` line on its stdin with one
JSON line: the requests it saw so far, by kind ("list", "properties", "range", "other") and
outcome ("forwarded", "busy"). It exits when its stdin closes or on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import TracebackType

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
#: how long the harness waits for an answer to `counts`
COUNTS_TIMEOUT_S = 10.0


# -- the proxy (runs in its own process) ----------------------------------------------------


def serve(upstream_port: int, per_second: int, retry_after: str | None) -> None:
    from tests.helpers.fault_proxy import KINDS, Admission, FaultProxy

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: done.set())
    with FaultProxy(upstream_port) as proxy:
        proxy.set_admission(Admission(per_second=per_second, retry_after=retry_after))
        print(f"port {proxy.port}", flush=True)

        def answer() -> None:
            for line in sys.stdin:
                if line.strip() == "counts":
                    counts = {kind: proxy.counts(kind) for kind in KINDS}
                    print(json.dumps(counts), flush=True)
            done.set()

        threading.Thread(target=answer, name="commands", daemon=True).start()
        done.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--per-second", type=int, required=True)
    parser.add_argument("--retry-after", help="the Retry-After header of a 503 (default: none)")
    args = parser.parse_args(argv)
    if args.per_second < 1:
        parser.error("--per-second must be at least 1")
    # run as a script: the fault proxy lives with the tests, under the repository's root
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    serve(args.upstream_port, args.per_second, args.retry_after)
    return 0


# -- the harness' handle on it --------------------------------------------------------------


class ThrottleProxy:
    """A running throttle proxy in front of `upstream_port`; a context manager that stops it
    (by its PID) on the way out."""

    def __init__(self, upstream_port: int, per_second: int, retry_after: str | None = None):
        self.upstream_port = upstream_port
        self.per_second = per_second
        self.retry_after = retry_after
        self._proc: subprocess.Popen[str] | None = None
        self.port = 0

    def start(self) -> ThrottleProxy:
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--upstream-port",
            str(self.upstream_port),
            "--per-second",
            str(self.per_second),
        ]
        if self.retry_after is not None:
            cmd += ["--retry-after", self.retry_after]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self._readline(START_TIMEOUT_S)
        if not line.startswith("port "):
            self.stop()
            raise RuntimeError(f"the throttle proxy did not start (it printed {line!r})")
        self.port = int(line.split()[1])
        return self

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("throttle proxy not started")
        return self._proc.pid

    def counts(self) -> dict[str, dict[str, int]]:
        """{kind: {"requests": n, "forwarded": n, "busy": n}} since the proxy started."""
        if self._proc is None or self._proc.stdin is None:
            raise RuntimeError("throttle proxy not started")
        self._proc.stdin.write("counts\n")
        self._proc.stdin.flush()
        line = self._readline(COUNTS_TIMEOUT_S)
        if not line:
            raise RuntimeError("the throttle proxy did not answer")
        counts: dict[str, dict[str, int]] = json.loads(line)
        return counts

    def _readline(self, timeout_s: float) -> str:
        import selectors

        assert self._proc is not None
        assert self._proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                return ""
        return self._proc.stdout.readline().strip()

    def stop(self) -> None:
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

    def __enter__(self) -> ThrottleProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


if __name__ == "__main__":
    sys.exit(main())
