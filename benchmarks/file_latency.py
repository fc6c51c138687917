"""The time a cold small file takes beyond its GET, mounts side by side (issues #25 and #29).

    python benchmarks/file_latency.py [--latency-us US] [--files N] [--size BYTES]
                                      [--batches B] [--readers T] [--only TAGS]
                                      [--old-src SRC] [--cache-root DIR]

One reader of a DataLoader worker reads one file after another, so what it waits for per file
is the GET plus everything the mount does around it. Against Azurite on this machine the
emulator's own CPU and this VM's drift hide differences of a tenth of a millisecond. Here every
system mounts the same synthetic:// dataset whose GETs wait `--latency-us` before they are
answered (a round trip costing no CPU, `latency_us` in docs/CONFIGURATION.md), all the mounts
are up at once, and they read disjoint batches of cold files in alternating order (a, b, b, a,
...), so drift falls on every system alike. Systems: `block` and `whole` (scenario 3's settings,
whole-file mode), and with `--old-src` also `block-old` and `whole-old` (another `src` folder's
daemon: a before/after of a change).

Reported per system, medians over the batches: milliseconds per file (wall time per file at 1
reader; at T readers, T x wall / files, the time each reader waits per file), that minus the
GET's wait (the mount's part), files/s, and the daemon tree's CPU per file. Every byte is
checked. The GET's wait is measured here, as trio sleeps it: trio's timeouts go through
epoll's whole milliseconds, so a `--latency-us 1000` GET waits about 1.25 ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import trio

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
for _path in (str(REPO / "src"), str(BENCH_DIR)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from modes_ab import tree_cpu  # noqa: E402
from scenarios.mounted import MountedDaemon  # noqa: E402
from scenarios.plans import seed_block_settings  # noqa: E402
from scenarios.synthetic_mount import daemon_env, mount_daemon  # noqa: E402

from blobmount.storage.synthetic import SyntheticDataset, expected_bytes  # noqa: E402

#: files each mount reads before the timed batches (listings, the first connections)
SETTLE_FILES = 100
WHOLE_FILE = {"DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "false"}


@dataclass
class System:
    tag: str
    env: dict[str, str]
    src: Path | None = None
    #: (ms per file, CPU ms per file) of each batch
    batches: list[tuple[float, float]] = field(default_factory=list)


def read_files(root: Path, dataset: SyntheticDataset, indexes: list[int], readers: int) -> float:
    """Read each file whole with `readers` threads, check its bytes; the wall time."""

    def one(index: int) -> str | None:
        name = dataset.name(index)
        with open(root / name, "rb", buffering=0) as f:
            got = f.read(dataset.size(index) + 1)
        return None if got == expected_bytes(dataset, name, 0, dataset.size(index)) else name

    started = time.perf_counter()
    with ThreadPoolExecutor(readers) as pool:
        wrong = [name for name in pool.map(one, indexes) if name is not None]
    wall = time.perf_counter() - started
    if wrong:
        raise RuntimeError(f"wrong bytes read through the mount: {wrong[:3]}")
    return wall


def sleep_ms(latency_us: int, samples: int = 200) -> float:
    """How long `trio.sleep` of `latency_us` takes here, on average: what the daemon's
    synthetic GETs wait."""

    async def measure() -> float:
        started = time.perf_counter()
        for _ in range(samples):
            await trio.sleep(latency_us / 1e6)
        return 1000 * (time.perf_counter() - started) / samples

    return trio.run(measure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-us", type=int, default=1000, help="each GET's wait")
    parser.add_argument("--files", type=int, default=500, help="files per batch")
    parser.add_argument("--size", type=int, default=25_000, help="bytes per file")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--readers", type=int, default=1)
    parser.add_argument("--only", metavar="TAGS", help="run only these systems (comma-separated)")
    parser.add_argument("--old-src", type=Path, help="also block-old and whole-old from here")
    parser.add_argument("--cache-root", type=Path, help="make the cache folders in here")
    args = parser.parse_args(argv)
    block_env = seed_block_settings()
    systems = [System("block", block_env), System("whole", {**block_env, **WHOLE_FILE})]
    if args.old_src:
        if not (args.old_src / "blobmount" / "__init__.py").is_file():
            parser.error(f"{args.old_src} is not a src folder with blobmount in it")
        old = args.old_src.resolve()
        systems += [
            System("block-old", block_env, old),
            System("whole-old", {**block_env, **WHOLE_FILE}, old),
        ]
    if args.only:
        wanted = args.only.split(",")
        if unknown := set(wanted) - {s.tag for s in systems}:
            parser.error(f"--only: no such system {sorted(unknown)}")
        systems = [s for s in systems if s.tag in wanted]
    total = SETTLE_FILES + args.batches * args.files
    query = (
        f"small_files={total}&small_size={args.size}&per_folder=1000&large_files=0"
        f"&latency_us={args.latency_us}"
    )
    dataset = SyntheticDataset.from_query(query)
    print(f"synthetic://latency?{query}; {args.readers} reader(s)", flush=True)
    with ExitStack() as stack:
        daemons: dict[str, MountedDaemon] = {}
        for system in systems:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=args.cache_root)))
            env = daemon_env(system.env, work, None)
            env["PYTHONPATH"] = str(system.src or REPO / "src")
            daemon = mount_daemon(f"synthetic://latency?{query}", env, work)
            daemons[system.tag] = stack.enter_context(daemon)
            read_files(daemon.mountpoint, dataset, list(range(SETTLE_FILES)), args.readers)
        for b in range(args.batches):
            first = SETTLE_FILES + b * args.files
            batch = list(range(first, first + args.files))
            for system in systems if b % 2 == 0 else systems[::-1]:
                daemon = daemons[system.tag]
                cpu0 = sum(tree_cpu(daemon.pid))
                wall = read_files(daemon.mountpoint, dataset, batch, args.readers)
                cpu = sum(tree_cpu(daemon.pid)) - cpu0
                n = len(batch)
                system.batches.append((1000 * wall * args.readers / n, 1000 * cpu / n))
    latency_ms = sleep_ms(args.latency_us) if args.latency_us else 0.0
    print(f"each GET waits {latency_ms:.3f} ms (measured)")
    print(f"{'system':10} {'ms/file':>8} {'beyond GET':>10} {'files/s':>8} {'CPU ms/file':>11}")
    for system in systems:
        ms = statistics.median(row[0] for row in system.batches)
        cpu = statistics.median(row[1] for row in system.batches)
        spread = f"(batches {min(r[0] for r in system.batches):.3f}-"
        spread += f"{max(r[0] for r in system.batches):.3f})"
        rate = 1000 * args.readers / ms
        print(f"{system.tag:10} {ms:8.3f} {ms - latency_ms:10.3f} {rate:8.0f} {cpu:11.3f} {spread}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
