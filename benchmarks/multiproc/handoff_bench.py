"""The CPU a trio process pays to receive a 25 KB payload from a worker process through shared
memory and a socketpair notification (route 2's handoff), without FUSE.

    python benchmarks/multiproc/handoff_bench.py [--n 20000] [--tasks 1,16] [--rounds 5]
                                                 [--workers 1]

Uses `handoff.Handoff`, the code multifs uses with --handoff-workers: a task sends a request,
awaits its slot's event, and copies the payload once into `bytes` (standing in for
fuse_reply_buf's copy into the kernel). The baseline makes the same payload in-process (one
slice, one copy, one trio checkpoint). Reported: CPU of this process only (time.process_time,
which leaves the workers out) per payload, for 1 task (strict ping-pong) and many in flight, and
the paired difference. Every payload of a first warm-up pass is verified. The workers are always
stopped.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[1]
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import trio  # noqa: E402

from multiproc.content import FIRST_INODE, PATTERN, small_bytes, small_start  # noqa: E402
from multiproc.handoff import Handoff  # noqa: E402

FILES = 5000
SIZE = 25_000


async def run_handoff(handoff: Handoff, n: int, tasks: int, check: bool) -> None:
    items = iter(range(n))

    async def task() -> None:
        for k in items:
            index = k % FILES
            data = bytes(await handoff.fetch(index + FIRST_INODE, 0, SIZE, SIZE))
            if check and data != small_bytes(index, 0, SIZE, SIZE):
                raise RuntimeError(f"wrong payload for file {index}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(handoff.run_receivers)
        async with trio.open_nursery() as workers:
            for _ in range(tasks):
                workers.start_soon(task)
        nursery.cancel_scope.cancel()


async def run_local(n: int, tasks: int) -> None:
    """The same payloads made in this process, with a checkpoint each."""
    items = iter(range(n))
    pattern = memoryview(PATTERN)

    async def task() -> None:
        for k in items:
            start = small_start(k % FILES)
            data = bytes(pattern[start : start + SIZE])
            await trio.lowlevel.checkpoint()
            del data

    async with trio.open_nursery() as nursery:
        for _ in range(tasks):
            nursery.start_soon(task)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--tasks", default="1,16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    handoff = Handoff(args.workers, FILES, SIZE)
    try:
        trio.run(run_handoff, handoff, 2000, 4, True)  # warm-up, every byte checked
        for tasks in (int(x) for x in args.tasks.split(",")):
            cpu: dict[str, list[float]] = {"handoff": [], "local": []}
            rate: dict[str, list[float]] = {"handoff": [], "local": []}
            for _ in range(args.rounds):
                for tag in ("handoff", "local"):
                    cpu0, wall0 = time.process_time(), time.perf_counter()
                    if tag == "handoff":
                        trio.run(run_handoff, handoff, args.n, tasks, False)
                    else:
                        trio.run(run_local, args.n, tasks)
                    cpu[tag].append(1000 * (time.process_time() - cpu0) / args.n)
                    rate[tag].append(args.n / (time.perf_counter() - wall0))
            for tag, values in cpu.items():
                print(
                    f"tasks={tasks} {tag}: this process's CPU {statistics.median(values):.4f} "
                    f"ms/payload [{min(values):.4f}..{max(values):.4f}] n={len(values)}, "
                    f"{statistics.median(rate[tag]):.0f} payloads/s",
                    flush=True,
                )
            extra = [a - b for a, b in zip(cpu["handoff"], cpu["local"], strict=True)]
            print(
                f"tasks={tasks} handoff minus local: median {statistics.median(extra):.4f} "
                f"ms/payload [{min(extra):.4f}..{max(extra):.4f}]",
                flush=True,
            )
    finally:
        handoff.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
