"""Dataset snapshots at scale (issue #28): a 1,000,000-blob snapshot's file size, load time and
memory, what making it costs in list requests, and the time to a ready mount that takes its
namespace from it.

    .venv/bin/python benchmarks/snapshot_scale.py                   # 1,000,000 entries
    .venv/bin/python benchmarks/snapshot_scale.py --entries 200000 --json
    .venv/bin/python benchmarks/snapshot_scale.py --no-mount        # no FUSE needed

Two datasets of N blobs each:

- *synthetic*: `synthetic://` (names like small/d0042/f0042123.bin, random 64-bit ETags, no
  MD5), made with `blobmount snapshot create` in a subprocess, as a user makes one: its time
  and list requests (against one flat listing: ceil(N / 5,000) pages), the file's size;
- *imagenet-like*: names like train/n01440764/n01440764_10026.JPEG, Azure-style ETags and
  times growing with the upload, a Content-MD5 on every blob (16 incompressible bytes: the
  worst case), encoded in this process: the file's size per entry.

Each file is then loaded in a fresh Python process (blobmount already imported): wall time and
the growth of its RSS per entry. With FUSE, the synthetic snapshot is mounted with
`blobmount mount --snapshot` (background; the command returns once the mount answers), and the
same source without it: time to ready, the daemon's RSS, list requests (from its stats), one
file read and checked. Nothing is asserted: the figures are printed (and with --json, written).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from blobmount.snapshots.format import encode  # noqa: E402
from blobmount.snapshots.table import TableBuilder  # noqa: E402
from blobmount.source import parse_source  # noqa: E402
from blobmount.storage.base import MAX_LIST_PAGE, BlobProps  # noqa: E402
from blobmount.storage.synthetic import SyntheticDataset, expected_bytes  # noqa: E402

PYTHON = sys.executable

#: the child process that loads a snapshot: RSS before and after, and the time it took
_LOADER = r"""
import json, sys, time
from pathlib import Path
from blobmount.snapshots.format import decode
from blobmount.storage.base import BlobProps

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

path = Path(sys.argv[1])
before = rss()
started = time.perf_counter()
snapshot = decode(path.read_bytes(), str(path))
seconds = time.perf_counter() - started
after = rss()
table = snapshot.table
page = table.list_page(table.name(len(table) // 2).rpartition("/")[0] + "/", delimiter="/")
print(json.dumps({"seconds": seconds, "rss_bytes": after - before, "table_bytes": table.nbytes,
                  "entries": len(table), "page": len(page.blobs)}))
"""


def _imagenet_like(entries: int) -> list[BlobProps]:
    rng = random.Random(28)
    classes = sorted(
        {f"n{rng.randrange(10**7, 10**8):08d}" for _ in range(max(1, entries // 1000))}
    )
    per_class = math.ceil(entries / len(classes))
    out: list[BlobProps] = []
    clock = 0.0
    for label in classes:
        for number in sorted(rng.sample(range(1, 10 * per_class + 10), per_class)):
            clock += 0.004 + rng.random() / 1000
            out.append(
                BlobProps(
                    name=f"train/{label}/{label}_{number}.JPEG",
                    size=int(rng.lognormvariate(11.5, 0.6)),
                    etag=f'"0x{0x8DC1A2B3C4D5E6F + int(clock * 1e7):X}"',
                    last_modified=1_767_225_600 + int(clock),
                    content_md5=rng.randbytes(16),
                )
            )
    return out[:entries]


def _typical(entries: int, path: Path) -> dict[str, Any]:
    started = time.perf_counter()
    builder = TableBuilder()
    for props in _imagenet_like(entries):
        builder.add(props)
    table = builder.build()
    made = time.perf_counter() - started
    started = time.perf_counter()
    data = encode(
        table,
        source="az://bench/train",
        location="acct/bench",
        prefix="train/",
        created=time.time(),
    )
    encoded = time.perf_counter() - started
    path.write_bytes(data)
    return {
        "entries": len(table),
        "file_bytes": len(data),
        "bytes_per_entry": len(data) / len(table),
        "build_seconds": made,
        "encode_seconds": encoded,
        "mean_name_bytes": len(table.names_blob) / len(table),
    }


def _blobmount(*args: object, env: dict[str, str], timeout: float = 900) -> tuple[float, Any]:
    """Run `blobmount ARGS`; (seconds, its stdout parsed as JSON when it is JSON)."""
    started = time.perf_counter()
    proc = subprocess.run(
        [PYTHON, "-m", "blobmount", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"blobmount {args[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    try:
        return seconds, json.loads(proc.stdout)
    except json.JSONDecodeError:
        return seconds, proc.stdout


def _load(path: Path, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [PYTHON, "-c", _LOADER, str(path)], env=env, capture_output=True, text=True, check=True
    )
    figures: dict[str, Any] = json.loads(proc.stdout)
    figures["rss_per_entry"] = figures["rss_bytes"] / figures["entries"]
    figures["table_bytes_per_entry"] = figures["table_bytes"] / figures["entries"]
    return figures


def _daemon_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _mount_once(uri: str, snapshot: Path | None, work: Path, env: dict[str, str]) -> dict[str, Any]:
    """Mount `uri` (with `snapshot`), time it until ready, check it, unmount."""
    mountpoint = work / ("mnt-snap" if snapshot else "mnt-list")
    mountpoint.mkdir()
    args: list[object] = ["mount", uri, mountpoint, "--log-file", work / f"{mountpoint.name}.log"]
    if snapshot is not None:
        args += ["--snapshot", snapshot]
    ready_s, _ = _blobmount(*args, env=env)
    try:
        _, stats = _blobmount("stats", mountpoint, "--json", env=env)
        rss = _daemon_rss(int(stats["pid"]))
        dataset = SyntheticDataset.from_query(parse_source(uri).synthetic_query or "")
        started = time.perf_counter()
        folders = len(os.listdir(mountpoint / "small"))
        name = dataset.name(dataset.files // 2)
        data = (mountpoint / name).read_bytes()
        first_access_s = time.perf_counter() - started
        _, after = _blobmount("stats", mountpoint, "--json", env=env)
    finally:
        _blobmount("unmount", mountpoint, env=env)
    return {
        "ready_seconds": ready_s,
        "daemon_rss_bytes": rss,
        "folders_listed": folders,
        "read_ok": data == expected_bytes(dataset, name, 0, dataset.size(dataset.files // 2)),
        "first_access_seconds": first_access_s,
        "list_requests": after["storage"]["list_requests"],
        "properties_requests": after["storage"]["properties_requests"],
    }


def _fuse_usable() -> bool:
    return Path("/dev/fuse").exists() and shutil.which("fusermount3") is not None


def run(entries: int, mount: bool, work: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATASET_")}
    env["DATASET_MOUNT_CACHE_DIR"] = str(work / "cache")
    env["XDG_RUNTIME_DIR"] = env.get("XDG_RUNTIME_DIR", str(work / "run"))
    uri = f"synthetic://bench?small_files={entries}&small_size=110KB&per_folder=1000"
    out: dict[str, Any] = {"entries": entries, "uri": uri}

    synthetic_file = work / "synthetic.bmsnap"
    create_s, made = _blobmount("snapshot", "create", uri, synthetic_file, "--json", env=env)
    out["synthetic"] = {
        "create_seconds": create_s,
        "list_requests": made["list_requests"],
        "one_flat_listing": math.ceil(entries / MAX_LIST_PAGE),
        "file_bytes": made["file_bytes"],
        "bytes_per_entry": made["file_bytes"] / entries,
        "load": _load(synthetic_file, env),
    }
    typical_file = work / "imagenet.bmsnap"
    out["imagenet_like"] = _typical(entries, typical_file)
    out["imagenet_like"]["load"] = _load(typical_file, env)
    if mount and _fuse_usable():
        with_snapshot = _mount_once(uri, synthetic_file, work, env)
        listing = _mount_once(uri, None, work, env)
        with_snapshot["daemon_rss_per_entry_over_listing"] = (
            with_snapshot["daemon_rss_bytes"] - listing["daemon_rss_bytes"]
        ) / entries
        out["mount"] = {"snapshot": with_snapshot, "listing": listing}
    return out


def to_markdown(r: dict[str, Any]) -> str:
    syn, typ = r["synthetic"], r["imagenet_like"]
    lines = [
        f"## Snapshots of {r['entries']:,} entries",
        "",
        "| figure | synthetic | imagenet-like (MD5 on every blob) |",
        "| --- | --- | --- |",
        f"| file size | {syn['file_bytes'] / 1e6:.1f} MB | {typ['file_bytes'] / 1e6:.1f} MB |",
        f"| bytes per entry (file) | {syn['bytes_per_entry']:.1f} | {typ['bytes_per_entry']:.1f} |",
        f"| load (read, check, decode) | {syn['load']['seconds']:.2f} s | "
        f"{typ['load']['seconds']:.2f} s |",
        f"| RSS growth per entry | {syn['load']['rss_per_entry']:.0f} B | "
        f"{typ['load']['rss_per_entry']:.0f} B |",
        f"| table's own bytes per entry | {syn['load']['table_bytes_per_entry']:.0f} B | "
        f"{typ['load']['table_bytes_per_entry']:.0f} B |",
        f"| made in | {syn['create_seconds']:.1f} s (CLI, listing included) | "
        f"{typ['build_seconds'] + typ['encode_seconds']:.1f} s (in process) |",
        f"| list requests to make it | {syn['list_requests']} (one flat listing: "
        f"{syn['one_flat_listing']}) | - |",
    ]
    mount = r.get("mount")
    if mount:
        snap, plain = mount["snapshot"], mount["listing"]
        lines += [
            "",
            "| mount of the synthetic source | with --snapshot | listing it |",
            "| --- | --- | --- |",
            f"| `blobmount mount` until ready | {snap['ready_seconds']:.2f} s | "
            f"{plain['ready_seconds']:.2f} s |",
            f"| daemon RSS when ready | {snap['daemon_rss_bytes'] / 2**20:.0f} MiB | "
            f"{plain['daemon_rss_bytes'] / 2**20:.0f} MiB |",
            f"| list a folder and read a file | {snap['first_access_seconds']:.3f} s | "
            f"{plain['first_access_seconds']:.3f} s |",
            f"| list / properties requests | {snap['list_requests']} / "
            f"{snap['properties_requests']} | {plain['list_requests']} / "
            f"{plain['properties_requests']} |",
            f"| bytes read right | {snap['read_ok']} | {plain['read_ok']} |",
            "",
            f"The snapshot costs the daemon {snap['daemon_rss_per_entry_over_listing']:.0f} bytes "
            "of RSS per entry over the same mount without it.",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/snapshot_scale.py", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--no-mount", action="store_true", help="skip the FUSE mounts")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bm-snapshot-") as tmp:
        result = run(args.entries, not args.no_mount, Path(tmp))
    print(to_markdown(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
