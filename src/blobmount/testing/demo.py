"""`make demo`: a local Azurite with a generated sample dataset, mounted and read like a trainer.

Starts Azurite on a free loopback port, uploads a small image-style dataset (many small files in
class folders, a few tar shards, one large file), mounts it with `blobmount mount`, lists it,
verifies every byte against the generated source, times a sequential read, then unmounts and
stops Azurite. With DEMO_KEEP=1 it leaves the mount up until Ctrl-C.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from blobmount.testing.azurite import AzuriteServer
from blobmount.testing.pattern import pattern_bytes

CONTAINER = "datasets"
PREFIX = "imagenet-mini"
MiB = 1024 * 1024


def sample_dataset() -> list[tuple[str, bytes]]:
    items = []
    for cls in range(4):
        for i in range(50):
            name = f"{PREFIX}/train/class_{cls}/img_{i:04d}.jpg"
            items.append((name, pattern_bytes(name, 0, 20_000 + (i * 997) % 10_000)))
    for shard in range(3):
        name = f"{PREFIX}/shards/shard-{shard:03d}.tar"
        items.append((name, pattern_bytes(name, 0, 8 * MiB + shard)))
    items.append((f"{PREFIX}/features.bin", pattern_bytes("features", 0, 96 * MiB)))
    items.append((f"{PREFIX}/README.txt", b"A generated sample dataset for the blobmount demo.\n"))
    return items


def blobmount(*args: str, env: dict[str, str]) -> None:
    cmd = [sys.executable, "-m", "blobmount", *args]
    print("$ blobmount " + " ".join(args), flush=True)
    subprocess.run(cmd, env=env, check=True)


def main() -> int:
    work = Path(".demo").absolute()
    mountpoint = work / "mnt"
    if mountpoint.exists() and os.path.ismount(mountpoint):
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)
    mountpoint.mkdir(parents=True, exist_ok=True)
    with AzuriteServer() as azurite:
        print(f"Azurite listening on {azurite.account_url}")
        items = sample_dataset()
        azurite.create_container(CONTAINER)
        azurite.upload_many(CONTAINER, items)
        total = sum(len(data) for _, data in items)
        print(f"uploaded {len(items)} blobs ({total / MiB:.0f} MiB) to container '{CONTAINER}'")

        env = dict(os.environ)
        env["AZURE_STORAGE_CONNECTION_STRING"] = azurite.connection_string
        env["DATASET_MOUNT_CACHE_DIR"] = str(work / "cache")
        env.setdefault("DATASET_MOUNT_LOG_FILE", str(work / "blobmount.log"))
        uri = f"{azurite.account_url}/{CONTAINER}/{PREFIX}"
        blobmount("mount", uri, str(mountpoint), env=env)
        try:
            show(mountpoint, items)
            if os.environ.get("DEMO_KEEP") == "1":
                print(f"\nmounted at {mountpoint}; press Ctrl-C to unmount and stop Azurite")
                try:
                    while True:
                        time.sleep(3600)
                except KeyboardInterrupt:
                    pass
        finally:
            blobmount("unmount", str(mountpoint), env=env)
    return 0


def show(mountpoint: Path, items: list[tuple[str, bytes]]) -> None:
    print(f"\n$ ls {mountpoint}")
    print("  ".join(sorted(os.listdir(mountpoint))))
    print(f"$ ls {mountpoint}/train/class_0 | head -3")
    print("\n".join(sorted(os.listdir(mountpoint / "train/class_0"))[:3]))

    started = time.monotonic()
    bad = 0
    for name, data in items:
        path = mountpoint / name[len(PREFIX) + 1 :]
        if hashlib.sha256(path.read_bytes()).digest() != hashlib.sha256(data).digest():
            bad += 1
            print(f"MISMATCH: {path}")
    elapsed = time.monotonic() - started
    print(
        f"\nverified {len(items)} files byte for byte in {elapsed:.1f}s: "
        f"{'all correct' if bad == 0 else f'{bad} WRONG'}"
    )

    started = time.monotonic()
    with open(mountpoint / "features.bin", "rb") as f:
        size = 0
        while chunk := f.read(4 * MiB):
            size += len(chunk)
    elapsed = time.monotonic() - started
    print(
        f"sequential read of features.bin ({size / MiB:.0f} MiB, second read): "
        f"{size / MiB / elapsed:.0f} MiB/s"
    )
    if shutil.which("df"):
        subprocess.run(["df", "-h", str(mountpoint)], check=False)
    if bad:
        raise SystemExit(1)


if __name__ == "__main__":
    raise SystemExit(main())
