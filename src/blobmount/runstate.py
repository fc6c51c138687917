"""Records of running mounts (pid, log file) so `unmount` and `stats` can find the daemon."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path


def runtime_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where daemons keep their sockets; `environ` is the daemon's environment (default: ours)."""
    base = (os.environ if environ is None else environ).get("XDG_RUNTIME_DIR")
    if base:
        return Path(base) / "blobmount"
    if os.geteuid() == 0:
        return Path("/run/blobmount")
    return Path(f"/tmp/blobmount-{os.geteuid()}")


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "blobmount"


def _key(mountpoint: Path) -> str:
    # abspath, not resolve(): resolving stats the path, which hangs on a stuck mount (and
    # deadlocks inside the daemon that serves it)
    return hashlib.sha256(os.path.abspath(mountpoint).encode()).hexdigest()[:16]


def stats_socket(mountpoint: Path) -> Path:
    """Where a mount's daemon answers `blobmount stats` (outside the mounted namespace)."""
    return runtime_dir() / f"{_key(mountpoint)}.sock"


def hints_socket(mountpoint: Path, environ: Mapping[str, str] | None = None) -> Path:
    """Where a mount's daemon takes read-order hints (`blobmount.hints`), outside the mount."""
    return runtime_dir(environ) / f"{_key(mountpoint)}.hints"


def default_log_file(mountpoint: Path) -> Path:
    slug = os.path.abspath(mountpoint).strip("/").replace("/", "_") or "root"
    return state_dir() / "logs" / f"{slug[:80]}-{_key(mountpoint)[:8]}.log"


@dataclass(frozen=True, slots=True)
class MountRecord:
    pid: int
    mountpoint: str
    source: str  # display form, no secrets
    log_file: str | None

    @staticmethod
    def path_for(mountpoint: Path) -> Path:
        return runtime_dir() / f"{_key(mountpoint)}.json"

    def save(self) -> None:
        path = self.path_for(Path(self.mountpoint))
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(path)

    @classmethod
    def load(cls, mountpoint: Path) -> MountRecord | None:
        try:
            data = json.loads(cls.path_for(mountpoint).read_text())
            return cls(**data)
        except (OSError, ValueError, TypeError):
            return None

    def remove(self) -> None:
        try:
            self.path_for(Path(self.mountpoint)).unlink()
        except FileNotFoundError:
            pass


def pid_alive(pid: int) -> bool:
    """True if `pid` is a running process (a zombie waiting to be reaped counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
