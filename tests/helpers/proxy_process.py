"""The fault proxy's admission limits (tests/helpers/fault_proxy.py `Admission`) in a process of
its own, for tests that measure how a client adapts to them.

In the test's process the proxy's asyncio thread shares the GIL with the client under test: on a
loaded machine it answers late and lets go of a request it counts as "in flight" well after the
client has its answer, so a server admitting N at once looks like fewer to the client. In a
process of its own it keeps up (the benchmark's throttle proxy runs the same way):

    with ProxyProcess(azurite.port, Admission(max_in_flight=3, kinds=RANGE_ONLY)) as p:
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

from tests.helpers.fault_proxy import ACCOUNT, HOST, KINDS, Admission, FaultProxy

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 15.0
ANSWER_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
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


class ProxyProcess:
    """A running admission proxy in front of `upstream_port`; a context manager that stops it
    (by its PID) on the way out, even when the test fails."""

    def __init__(self, upstream_port: int, admission: Admission) -> None:
        self.upstream_port = upstream_port
        self.admission = admission
        self.port = 0
        self._proc: subprocess.Popen[str] | None = None

    @property
    def account_url(self) -> str:
        return f"http://{HOST}:{self.port}/{ACCOUNT}"

    def start(self) -> ProxyProcess:
        rule = self.admission
        cmd = [sys.executable, "-m", "tests.helpers.proxy_process"]
        cmd += ["--upstream-port", str(self.upstream_port), "--kinds", ",".join(rule.kinds)]
        if rule.max_in_flight is not None:
            cmd += ["--max-in-flight", str(rule.max_in_flight)]
        if rule.per_second is not None:
            cmd += ["--per-second", str(rule.per_second)]
        if rule.retry_after is not None:
            cmd += ["--retry-after", rule.retry_after]
        self._proc = subprocess.Popen(
            cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        line = self._readline(START_TIMEOUT_S)
        if not line.startswith("port "):
            self.stop()
            raise RuntimeError(f"the proxy process did not start (it printed {line!r})")
        self.port = int(line.split()[1])
        return self

    def _ask(self) -> dict[str, object]:
        if self._proc is None or self._proc.stdin is None:
            raise RuntimeError("proxy process not started")
        self._proc.stdin.write("counts\n")
        self._proc.stdin.flush()
        line = self._readline(ANSWER_TIMEOUT_S)
        if not line:
            raise RuntimeError("the proxy process did not answer")
        answer: dict[str, object] = json.loads(line)
        return answer

    def counts(self, kind: str) -> dict[str, int]:
        """As FaultProxy.counts(kind): {'requests': n, 'forwarded': n, 'busy': n}."""
        counts = self._ask()[kind]
        assert isinstance(counts, dict)
        return {str(k): int(v) for k, v in counts.items()}

    @property
    def most_forwarding(self) -> int:
        most = self._ask()["most_forwarding"]
        assert isinstance(most, int)
        return most

    def _readline(self, timeout_s: float) -> str:
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

    def __enter__(self) -> ProxyProcess:
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
