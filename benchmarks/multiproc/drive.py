"""The spike's driver: files/s and the CPU of the mount's whole process tree, per file and per
GiB, for multifs mounted with 1 and 2 processes (route 1), or bare against route 2.

    python benchmarks/multiproc/drive.py small   [--files 3000] [--rounds 5] [--readers 1,4,16]
                                                 [--mounts 1,2] [--extra=--clone]
    python benchmarks/multiproc/drive.py seq     [--rounds 4] [--readers 1,4] [--big-mib 1024]
    python benchmarks/multiproc/drive.py handoff [--files 3000] [--rounds 5] [--workers 1]

Every configuration is mounted at once (an idle mount costs nothing) and rounds alternate
between them (ABBA...), so each sees the same machine. Before each round the caches are dropped
(sync; echo 3 > drop_caches; a 0.3 s pause for the FORGETs that sends). small: each round reads
every file once in a new shuffled order (open, one read, close); seq: R readers each read their
own region of the big file in 1 MiB preadv. CPU is the whole tree's (schedstat, ns; the 10 ms
tick figure is kept as *_ticks), also the first process's alone ("fuse proc": the serial part
for route 2, one process's share for route 1). Every byte is verified after the round. One JSON
line per round is appended to --out (default benchmarks/results/multiproc.jsonl);
`summarize.py` reads it. Needs root for drop_caches (without it, rounds hit the page cache).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parents[1]
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

from multiproc.content import big_bytes, small_bytes  # noqa: E402
from multiproc.counters import OPS  # noqa: E402
from multiproc.mounting import Mount, drop_caches, run_threads  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
CHUNK = 1 * MiB


def _delta_counts(
    before: list[dict[str, int]], after: list[dict[str, int]]
) -> list[dict[str, int]]:
    return [
        {op: b[op] - a[op] for op in OPS if b[op] - a[op]}
        for a, b in zip(before, after, strict=True)
    ]


def _measure(mount: Mount, work: Any, readers: int) -> tuple[float, dict[int, float], float, Any]:
    """Drop caches, run the readers; (wall s, CPU s per pid, tick CPU s, request counts)."""
    drop_caches()
    cpu0, counts0, ticks0 = mount.cpu(), mount.count_rows(), mount.ticks()
    started = time.perf_counter()
    run_threads(readers, work)
    wall = time.perf_counter() - started
    cpu1, counts1, ticks1 = mount.cpu(), mount.count_rows(), mount.ticks()
    per_pid = {pid: cpu1[pid] - cpu0.get(pid, 0.0) for pid in cpu1}
    return wall, per_pid, ticks1 - ticks0, _delta_counts(counts0, counts1)


def small_round(mount: Mount, order: list[int], readers: int, size: int) -> dict[str, Any]:
    """Every file of `order` once (open, one read, close) by `readers` threads."""
    got: list[bytes | None] = [None] * mount.files
    queue = iter(order)
    lock = threading.Lock()
    base = str(mount.mnt)

    def work(_k: int) -> None:
        while True:
            with lock:
                i = next(queue, None)
            if i is None:
                return
            fd = os.open(f"{base}/f{i:05d}", os.O_RDONLY)
            try:
                got[i] = os.read(fd, size + 1)
            finally:
                os.close(fd)

    wall, per_pid, ticks, counts = _measure(mount, work, readers)
    for i in order:
        if got[i] != small_bytes(i, 0, size, size):
            raise RuntimeError(f"{mount.tag}: wrong bytes in f{i:05d}")
    cpu = sum(per_pid.values())
    files = len(order)
    return {
        "tag": mount.tag,
        "processes": mount.processes,
        "readers": readers,
        "files": files,
        "wall_s": wall,
        "files_per_s": files / wall,
        "cpu_s": cpu,
        "cpu_ms_per_file": 1000 * cpu / files,
        "cpu_ms_per_file_fuse_proc": 1000 * per_pid.get(mount.pid, 0.0) / files,
        "cpu_ms_per_file_ticks": 1000 * ticks / files,
        "counts": counts,
    }


def seq_round(mount: Mount, readers: int, big: int, buf: bytearray) -> dict[str, Any]:
    """The big file by `readers` threads, each its own region, in 1 MiB preadv."""
    view = memoryview(buf)
    region = big // readers
    path = str(mount.mnt / "big")
    view[:] = bytes(len(buf))  # zeroed: a read that never happened cannot pass

    def work(k: int) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            offset, end = k * region, (k + 1) * region if k < readers - 1 else big
            while offset < end:
                n = os.preadv(fd, [view[offset : min(offset + CHUNK, end)]], offset)
                if n <= 0:
                    raise RuntimeError(f"short read at {offset}")
                offset += n
        finally:
            os.close(fd)

    wall, per_pid, ticks, counts = _measure(mount, work, readers)
    for offset in range(0, big, CHUNK):
        want = big_bytes(offset, CHUNK, big)
        if bytes(view[offset : offset + len(want)]) != want:
            raise RuntimeError(f"{mount.tag}: wrong bytes in big at {offset}")
    cpu = sum(per_pid.values())
    gib = big / GiB
    return {
        "tag": mount.tag,
        "processes": mount.processes,
        "readers": readers,
        "wall_s": wall,
        "gib_per_s": gib / wall,
        "cpu_s_per_gib": cpu / gib,
        "cpu_s_per_gib_fuse_proc": per_pid.get(mount.pid, 0.0) / gib,
        "cpu_s_per_gib_ticks": ticks / gib,
        "counts": counts,
    }


def print_medians(rows: list[dict[str, Any]], key: str) -> None:
    """Median [min..max] of `key` per (tag, readers)."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["tag"], row["readers"]), []).append(row)
    for (tag, readers), group in sorted(groups.items()):
        values = [r[key] for r in group]
        rate_key = "files_per_s" if "files_per_s" in group[0] else "gib_per_s"
        rates = [r[rate_key] for r in group]
        print(
            f"{tag} R={readers}: {key} {statistics.median(values):.4f} "
            f"[{min(values):.4f}..{max(values):.4f}] n={len(values)}; {rate_key} "
            f"{statistics.median(rates):.3f} [{min(rates):.3f}..{max(rates):.3f}]",
            flush=True,
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("small", "seq", "handoff"))
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--size", type=int, default=25_000)
    parser.add_argument("--big-mib", type=int, default=1024, help="seq: size of the big file")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--readers", help="comma-separated (default 1,4,16; seq 1,4)")
    parser.add_argument("--mounts", default="1,2", help="process counts to mount")
    parser.add_argument("--workers", type=int, default=1, help="handoff: worker processes")
    parser.add_argument("--extra", default="", help="more multifs options, space-separated")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "multiproc.jsonl")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    default_readers = "1,4" if args.mode == "seq" else "1,4,16"
    readers = [int(x) for x in (args.readers or default_readers).split(",")]
    extra = tuple(args.extra.split())
    sizes = ("--size", str(args.size), "--big-bytes", str(args.big_mib * MiB))
    if args.mode == "handoff":
        handoff = ("--handoff-workers", str(args.workers))
        configs = [("bare1", 1, sizes + extra), ("handoff1", 1, sizes + extra + handoff)]
    else:
        configs = [(f"{args.mode}{n}", int(n), sizes + extra) for n in args.mounts.split(",")]
    rows: list[dict[str, Any]] = []
    big = args.big_mib * MiB
    buf = bytearray(1) * big if args.mode == "seq" else bytearray()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack, open(args.out, "a") as out:
        mounts = [stack.enter_context(Mount(t, n, args.files, e)) for t, n, e in configs]
        everything = list(range(args.files))
        for r in range(args.rounds):
            order = everything[:]
            random.Random(r).shuffle(order)
            for count in readers:
                for mount in mounts if r % 2 == 0 else mounts[::-1]:
                    if args.mode == "seq":
                        res = seq_round(mount, count, big, buf)
                        line = f"{res['gib_per_s']:.3f} GiB/s, {res['cpu_s_per_gib']:.3f} s/GiB"
                    else:
                        res = small_round(mount, order, count, args.size)
                        line = (
                            f"{res['files_per_s']:.0f} files/s, {res['cpu_ms_per_file']:.4f} "
                            f"ms/file (fuse proc {res['cpu_ms_per_file_fuse_proc']:.4f})"
                        )
                    res.update(mode=args.mode, round=r, extra=args.extra)
                    out.write(json.dumps(res) + "\n")
                    out.flush()
                    rows.append(res)
                    print(f"round {r} {mount.tag} R={count}: {line} {res['counts']}", flush=True)
    print("--- medians [min..max]")
    if args.mode == "seq":
        print_medians(rows, "cpu_s_per_gib")
    else:
        print_medians(rows, "cpu_ms_per_file")
        print_medians(rows, "cpu_ms_per_file_fuse_proc")
    return 0


if __name__ == "__main__":
    sys.exit(main())
