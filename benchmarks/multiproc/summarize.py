"""Medians, spread and paired differences of the rounds `drive.py` recorded.

    python benchmarks/multiproc/summarize.py [benchmarks/results/multiproc.jsonl]

Small-file modes: per (mount, readers), the tree's and the first process's CPU per file,
files/s, and the smaller process's share of the requests; then, when a mode has exactly two
mounts, the paired differences (same run, round and reader count: the two mounts measured one
after the other) of CPU per file and the ratio of files/s. seq: GiB/s, CPU s/GiB and READs per
process. Runs with extra multifs options (e.g. --clone) are summarized as a mode of their own.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

DEFAULT = Path(__file__).resolve().parents[1] / "results" / "multiproc.jsonl"

Row = dict[str, Any]


def spread(values: list[float], digits: int = 4) -> str:
    return (
        f"{statistics.median(values):.{digits}f} "
        f"[{min(values):.{digits}f}..{max(values):.{digits}f}] n={len(values)}"
    )


def load(path: Path) -> list[Row]:
    """The rounds, each with its mode (plus extra options) and the number of its run."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    last: dict[str, tuple[int, int]] = {}
    for row in rows:
        if row.get("extra"):
            row["mode"] = f"{row['mode']} {row['extra']}"
        run, previous = last.get(row["mode"], (0, -1))
        if row["round"] < previous:  # a run starts again at round 0
            run += 1
        row["run"] = run
        last[row["mode"]] = (run, row["round"])
    return rows


def smaller_share(row: Row) -> float:
    totals = [sum(c.values()) for c in row["counts"]]
    return min(totals) / sum(totals) if len(totals) > 1 and sum(totals) else 1.0


def small_mode(mode: str, rows: list[Row]) -> None:
    print(f"== {mode}: tree CPU ms/file | first process CPU ms/file | files/s | smaller share")
    groups: dict[tuple[str, int], list[Row]] = defaultdict(list)
    for row in rows:
        groups[(row["tag"], row["readers"])].append(row)
    for (tag, readers), group in sorted(groups.items()):
        print(
            f"{tag:9s} R={readers:2d}: tree {spread([r['cpu_ms_per_file'] for r in group])} | "
            f"first {spread([r['cpu_ms_per_file_fuse_proc'] for r in group])} | "
            f"files/s {spread([r['files_per_s'] for r in group], 0)} | "
            f"{statistics.median(smaller_share(r) for r in group):.2f}"
        )
    tags = sorted({row["tag"] for row in rows})
    if len(tags) != 2:
        return
    first, second = tags
    pairs: dict[tuple[int, int, int], dict[str, Row]] = defaultdict(dict)
    for row in rows:
        pairs[(row["run"], row["round"], row["readers"])][row["tag"]] = row
    for readers in sorted({row["readers"] for row in rows}):
        both = [p for (_, _, r), p in pairs.items() if r == readers and len(p) == 2]
        if not both:
            continue
        tree = [p[second]["cpu_ms_per_file"] - p[first]["cpu_ms_per_file"] for p in both]
        proc = [
            p[second]["cpu_ms_per_file_fuse_proc"] - p[first]["cpu_ms_per_file_fuse_proc"]
            for p in both
        ]
        ratio = [p[second]["files_per_s"] / p[first]["files_per_s"] for p in both]
        print(
            f"paired {second} - {first} R={readers:2d}: tree {spread(tree)} | "
            f"first process {spread(proc)} | files/s ratio {spread(ratio, 2)}"
        )


def seq_mode(mode: str, rows: list[Row]) -> None:
    print(f"== {mode}: GiB/s | tree CPU s/GiB | READs per process (first round)")
    groups: dict[tuple[str, int], list[Row]] = defaultdict(list)
    for row in rows:
        groups[(row["tag"], row["readers"])].append(row)
    for (tag, readers), group in sorted(groups.items()):
        reads = [c.get("read", 0) for c in group[0]["counts"]]
        print(
            f"{tag:5s} R={readers}: GiB/s {spread([r['gib_per_s'] for r in group], 3)} | "
            f"CPU s/GiB {spread([r['cpu_s_per_gib'] for r in group], 3)} | READs {reads}"
        )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    rows = load(Path(args[0]) if args else DEFAULT)
    for mode in sorted({row["mode"] for row in rows}):
        chosen = [row for row in rows if row["mode"] == mode]
        if mode.startswith("seq"):
            seq_mode(mode, chosen)
        else:
            small_mode(mode, chosen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
