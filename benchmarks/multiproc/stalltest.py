"""Does a multi-process multifs mount stall when its handlers await something?

    python benchmarks/multiproc/stalltest.py [--processes 2] [--delay-ms 5] [--files 400]
                                             [--readers 1]

Every read() awaits --delay-ms (a stand-in for a fetch). The /dev/fuse fd is blocking and every
process is woken for each request, so a process that loses the race blocks in read() inside
pyfuse3's loop and cannot send the replies of its own awaiting handlers until another request
arrives. This measures the per-file latency of readers going through the files one after another
(median, p99, max), with a watchdog that, when no file has finished for 2 s, counts a stall and
pokes the mount with a stat of a missing name (a new request). The mount is always unmounted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[1]
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

from multiproc.mounting import Mount, drop_caches, run_threads  # noqa: E402

STALL_S = 2.0
MAX_POKES = 50


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--delay-ms", type=float, default=5.0)
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--readers", type=int, default=1)
    args = parser.parse_args(argv)
    extra = ("--read-delay-ms", str(args.delay_ms))
    latencies: list[float] = []
    last_done = [time.monotonic()]
    finished = threading.Event()
    pokes = [0]
    queue = iter(range(args.files))
    lock = threading.Lock()
    with Mount(f"stall{args.processes}", args.processes, args.files, extra) as mount:

        def reader(_k: int) -> None:
            while True:
                with lock:
                    i = next(queue, None)
                if i is None:
                    return
                started = time.monotonic()
                fd = os.open(f"{mount.mnt}/f{i:05d}", os.O_RDONLY)
                try:
                    os.read(fd, 25_001)
                finally:
                    os.close(fd)
                now = time.monotonic()
                latencies.append(now - started)
                last_done[0] = now

        def watchdog() -> None:
            while not finished.wait(0.2) and pokes[0] < MAX_POKES:
                if time.monotonic() - last_done[0] > STALL_S:
                    pokes[0] += 1
                    print(f"stall after {len(latencies)} files; poking the mount", flush=True)
                    try:
                        os.stat(f"{mount.mnt}/nope{pokes[0]}")
                    except FileNotFoundError:
                        pass
                    last_done[0] = time.monotonic()

        drop_caches()
        dog = threading.Thread(target=watchdog, daemon=True)
        dog.start()
        started = time.monotonic()
        try:
            run_threads(args.readers, reader)
        finally:
            finished.set()
        wall = time.monotonic() - started
        counts = mount.count_rows()
    latencies.sort()
    print(
        f"processes={args.processes} delay={args.delay_ms} ms readers={args.readers}: "
        f"{len(latencies)} files in {wall:.2f} s; latency median "
        f"{1000 * statistics.median(latencies):.1f} ms, p99 "
        f"{1000 * latencies[int(0.99 * (len(latencies) - 1))]:.1f} ms, max "
        f"{1000 * latencies[-1]:.1f} ms; stalls (2 s without progress, then poked): {pokes[0]}; "
        f"requests per process {counts}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
