"""A cgroup as /proc/self/cgroup and /sys/fs/cgroup would show it, in a temporary folder: for the
tests of the limits the daemon reads from its cgroup (memory, CPUs)."""

from __future__ import annotations

from pathlib import Path


def fake_cgroup(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[Path, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc_file = tmp_path / "cgroup"
    proc_file.write_text(proc)
    root = tmp_path / "sys"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text + "\n")
    return proc_file, root
