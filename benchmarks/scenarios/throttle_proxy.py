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
import sys
import threading
from pathlib import Path

if __name__ == "__main__":  # run as a script: tests.helpers is under the repository's root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.helpers.proxy_process import ProxyProcess

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
    serve(args.upstream_port, args.per_second, args.retry_after)
    return 0


# -- the harness' handle on it --------------------------------------------------------------


class ThrottleProxy(ProxyProcess):
    """A running throttle proxy in front of `upstream_port`; a context manager that stops it
    (by its PID) on the way out."""

    what = "throttle proxy"
    commands = True

    def __init__(self, upstream_port: int, per_second: int, retry_after: str | None = None):
        super().__init__()
        self.upstream_port = upstream_port
        self.per_second = per_second
        self.retry_after = retry_after

    def _command(self) -> list[str]:
        cmd = [
            str(Path(__file__).resolve()),
            "--upstream-port",
            str(self.upstream_port),
            "--per-second",
            str(self.per_second),
        ]
        if self.retry_after is not None:
            cmd += ["--retry-after", self.retry_after]
        return cmd

    def counts(self) -> dict[str, dict[str, int]]:
        """{kind: {"requests": n, "forwarded": n, "busy": n}} since the proxy started."""
        line = self._ask("counts", COUNTS_TIMEOUT_S)
        counts: dict[str, dict[str, int]] = json.loads(line)
        return counts


if __name__ == "__main__":
    sys.exit(main())
