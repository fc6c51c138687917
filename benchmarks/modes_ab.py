"""Block mode against whole-file mode on cold small files, rounds alternated (issue #29).

    python benchmarks/modes_ab.py [--files N] [--rounds R] [--readers T] [--old-src SRC]
                                  [--old-block] [--cache-root DIR] [--rclone] [--only TAGS]

The benchmark's small-file dataset (N files, 20-30 KB) sits in one Azurite. Each round mounts
it afresh once per system, with an empty cache: `block` (scenario 3's settings: no disk cache,
RAM tier 0), `whole` (the same in whole-file mode), and with `--old-src` also `whole-old`, the
whole-file mode of another `src` folder (a before/after of a change; `--old-block` adds
`block-old`, its block mode), and with `--rclone` also
`rclone-off` (the peer, `rclone mount --vfs-cache-mode off`, as run.py sets it up: issue #25's
"few readers at least rclone-off's rate", measured in alternated rounds). The systems take turns in
alternating order (a, b, c, c, b, a, ...); each round reads 100 files to settle the mount, drops
the kernel's caches, then reads the rest once in a shuffled order with T threads, every byte
checked. Reported per round and as medians: files/s and the daemon tree's user and system CPU
per file.

Why not `run.py`: a few percent is smaller than this VM's drift between two runs (a pair of
runs once put whole-file mode with one reader at 0.97 of block mode, the next run at 0.81);
alternated rounds on one Azurite see the same machine. `--cache-root` puts the cache folders on
another file system (docs/BENCHMARKING.md: on ext4 without a journal, file creation after mass
deletions is slow).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import psutil

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
for _path in (str(REPO), str(BENCH_DIR)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from ab import RUN_TIMEOUT_S, plan  # noqa: E402
from scenarios.blobmount_system import BlobmountSystem  # noqa: E402
from scenarios.datasets import Datasets, ManyFiles  # noqa: E402
from scenarios.measure import drop_kernel_caches  # noqa: E402
from scenarios.mounted import MountedDaemon  # noqa: E402
from scenarios.plans import QUICK  # noqa: E402
from scenarios.process_tree import tree_processes  # noqa: E402
from scenarios.rclone import RcloneSystem  # noqa: E402
from scenarios.readers import read_through_mount  # noqa: E402
from scenarios.small_files import SmallFiles  # noqa: E402
from scenarios.verify import new_buffer, verify_mount_reads  # noqa: E402

#: files read before the timed part of a round (the folder listings, the first connections)
SETTLE_FILES = 100


def tree_cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process and its descendants."""
    times = [proc.cpu_times() for proc in tree_processes(psutil.Process(pid)).values()]
    return sum(t.user for t in times), sum(t.system for t in times)


def one_round(
    daemon: MountedDaemon, files: ManyFiles, order: list[int], readers: int
) -> tuple[float, float, float]:
    """Read `order` through a fresh mount: (files/s, user ms per file, system ms per file)."""
    settle = plan(files, order[:SETTLE_FILES], readers)
    read_through_mount(
        daemon.mountpoint, list(settle.jobs), readers, new_buffer(files.total_bytes), RUN_TIMEOUT_S
    )
    timed = order[SETTLE_FILES:]
    run = plan(files, timed, readers)
    buf = new_buffer(files.total_bytes)
    drop_kernel_caches()
    user0, sys0 = tree_cpu(daemon.pid)
    started = time.perf_counter()
    read_through_mount(daemon.mountpoint, list(run.jobs), readers, buf, RUN_TIMEOUT_S)
    wall = time.perf_counter() - started
    user1, sys1 = tree_cpu(daemon.pid)
    wrong = verify_mount_reads(run, buf, files.source)
    if wrong is not None:
        raise RuntimeError(f"wrong bytes read through the mount: {wrong}")
    n = len(timed)
    return n / wall, 1000 * (user1 - user0) / n, 1000 * (sys1 - sys0) / n


def entry_writes(system: BlobmountSystem | RcloneSystem, daemon: MountedDaemon) -> str:
    """Where a whole-file mount wrote its entries (on the trio thread or in the writer's
    thread, and how often the disk was found slow), for the round's line; "" otherwise."""
    if not isinstance(system, BlobmountSystem):
        return ""
    stats = system.stats(daemon)
    whole = (stats or {}).get("whole_file")
    if not whole or "in_place" not in whole:  # block mode, or a version without the figures
        return ""
    in_place = whole["in_place"]
    return (
        f"; entry opens and writes in place: {in_place['reads']}, writes in a thread: "
        f"{whole['thread_writes']}, slow spells: {in_place['slow_reads']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--readers", type=int, default=1)
    parser.add_argument("--old-src", type=Path, help="also whole-file mode of this src folder")
    parser.add_argument(
        "--old-block", action="store_true", help="with --old-src, also its block mode"
    )
    parser.add_argument("--cache-root", type=Path, help="make the cache folders in here")
    parser.add_argument("--rclone", action="store_true", help="also rclone mount, cache off")
    parser.add_argument(
        "--only", metavar="TAGS", help="run only these systems (comma-separated tags)"
    )
    args = parser.parse_args(argv)
    if args.files <= SETTLE_FILES:
        parser.error(f"--files must be more than {SETTLE_FILES}")
    systems: dict[str, BlobmountSystem | RcloneSystem] = {
        "block": BlobmountSystem(),
        "whole": BlobmountSystem(whole_file=True),
    }
    sources: dict[str, Path] = {}
    if args.old_src:
        if not (args.old_src / "blobmount" / "__init__.py").is_file():
            parser.error(f"{args.old_src} is not a src folder with blobmount in it")
        systems["whole-old"] = BlobmountSystem(whole_file=True)
        sources["whole-old"] = args.old_src.resolve()
        if args.old_block:
            systems["block-old"] = BlobmountSystem()
            sources["block-old"] = args.old_src.resolve()
    elif args.old_block:
        parser.error("--old-block needs --old-src")
    if args.rclone:
        systems["rclone-off"] = RcloneSystem("off")
    if args.only:
        wanted = args.only.split(",")
        if unknown := set(wanted) - set(systems):
            parser.error(f"--only: no such system {sorted(unknown)} (have {sorted(systems)})")
        systems = {tag: systems[tag] for tag in wanted}
    results: dict[str, list[tuple[float, float, float]]] = {tag: [] for tag in systems}
    with ExitStack() as stack:
        datasets = Datasets(dataclasses.replace(QUICK, small_file_count=args.files))
        stack.callback(datasets.close)
        files = datasets.small()
        order = list(range(len(files.names)))
        random.Random(1).shuffle(order)
        for r in range(args.rounds):
            for tag in list(systems) if r % 2 == 0 else list(systems)[::-1]:
                with tempfile.TemporaryDirectory(prefix="bm-modes-", dir=args.cache_root) as work:
                    daemon = systems[tag].daemon(files.store, SmallFiles(), Path(work))
                    if tag in sources:
                        daemon.env["PYTHONPATH"] = str(sources[tag])
                    with daemon:
                        rate, user, system = one_round(daemon, files, order, args.readers)
                        where = entry_writes(systems[tag], daemon)
                results[tag].append((rate, user, system))
                print(
                    f"round {r} {tag}: {rate:6.0f} files/s, CPU user {user:.3f} "
                    f"system {system:.3f} ms/file{where}",
                    flush=True,
                )
    first = next(iter(results))
    base = statistics.median(row[0] for row in results[first])
    for tag, rows in results.items():
        rate, user, system = (statistics.median(row[i] for row in rows) for i in range(3))
        print(
            f"{tag}: median {rate:.0f} files/s ({rate / base:.2f} of {first}), CPU user "
            f"{user:.3f} system {system:.3f} ms/file"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
