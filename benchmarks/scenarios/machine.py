"""The machine a run ran on: CPU, memory, OS, versions of Python, Azurite, Node and the
packages, the git commit, and how much memory the VM handed back to its host (for the report's
"Machine" section)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import psutil

from scenarios.guest_memory import reported_free_memory_kib
from scenarios.plans import GiB


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=cwd, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _os_name() -> str:
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.system()


def _azurite_version(executable: str) -> str | None:
    """From Azurite's package.json (its main.js sits under dist/src/blob/)."""
    for folder in Path(executable).resolve().parents:
        package = folder / "package.json"
        if package.exists():
            try:
                meta = json.loads(package.read_text())
            except (OSError, ValueError):
                return None
            if meta.get("name") == "azurite":
                return str(meta.get("version"))
    return _run([executable, "--version"])


def _package(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def describe_machine(repo: Path) -> dict[str, Any]:
    """CPU, cores, RAM, kernel, OS, Python, Azurite, Node, package versions, git commit."""
    from blobmount import __version__
    from blobmount.testing.azurite import find_azurite

    try:
        azurite_exe: str | None = find_azurite()
    except FileNotFoundError:
        azurite_exe = None
    commit = _run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo)
    # read-only: `git diff --quiet` exits 1 when the work tree differs from HEAD
    dirty = None
    if commit is not None:
        try:
            dirty = (
                subprocess.run(
                    ["git", "diff", "--quiet", "HEAD", "--", "src"],
                    cwd=repo,
                    capture_output=True,
                    timeout=30,
                    check=False,
                ).returncode
                == 1
            )
        except (OSError, subprocess.TimeoutExpired):
            dirty = None
    return {
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "ram_bytes": psutil.virtual_memory().total,
        "kernel": platform.release(),
        "os": _os_name(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "azurite": _azurite_version(azurite_exe) if azurite_exe else None,
        "node": _run(["node", "--version"]),
        "fuse": _run(["fusermount3", "--version"]) or _run(["fusermount3", "-V"]),
        "blobmount": __version__,
        "git_commit": commit,
        "src_differs_from_commit": dirty,
        "packages": {
            name: _package(name)
            for name in ("azure-storage-blob", "azure-core", "aiohttp", "pyfuse3", "trio")
        },
        "load_average_at_start": os.getloadavg(),
        "reported_free_kib_at_start": reported_free_memory_kib(),
    }


def machine_line(m: dict[str, Any]) -> list[str]:
    git = m.get("git_commit") or "unknown"
    if m.get("src_differs_from_commit"):
        git += " (src/ has uncommitted changes)"
    load = ", ".join(f"{x:.2f}" for x in m.get("load_average_at_start", ()))
    return [
        f"- CPU: {m['cpu_model']}, {m['logical_cpus']} logical CPUs "
        f"({m['physical_cores']} cores), RAM {m['ram_bytes'] / GiB:.1f} GiB",
        f"- OS: {m['os']}, kernel {m['kernel']}, {m['fuse'] or 'fusermount3 ?'}",
        f"- Python {m['python']}; Azurite {m['azurite']} on Node {m['node']}",
        f"- blobmount {m['blobmount']} at {git}; "
        + ", ".join(f"{k} {v}" for k, v in m["packages"].items()),
        f"- load average when the run started: {load}",
        *_reported_line(m),
    ]


def _reported_line(m: dict[str, Any]) -> list[str]:
    start, end = m.get("reported_free_kib_at_start"), m.get("reported_free_kib_at_end")
    if start is None or end is None:
        return []
    return [
        f"- free memory handed back to the hypervisor during the run (free page reporting): "
        f"{(end - start) / 2**20:,.1f} GiB; each page of it costs a host fault when next used "
        "(docs/BENCHMARKING.md, Known limits)"
    ]
