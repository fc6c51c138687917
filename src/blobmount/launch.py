"""A mount served by a background daemon: start it, wait until it answers, stop it.

`start_mount` checks the settings and the URI in the caller's process, spawns
``python -m blobmount mount --foreground`` (the URI passed in its environment, so a SAS never
shows in ``ps``) and waits on its readiness pipe; `unmount` stops a daemon gracefully; `mount`
holds a mount for the length of a ``with`` block. The Python API (`blobmount.api`), the CLI
and `blobmount warm` on a URI all mount through here. Importing this module does not need FUSE.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from blobmount.datastores import DATASTORES_FILE_VAR, datastores_file_path, resolve_source
from blobmount.errors import BlobmountError, ConfigError, MountPointError, ProcessFailed
from blobmount.mountpoint import mount_type, unmount_fuse
from blobmount.readiness import READY_FD_ENV, wait_for_ready_line
from blobmount.runstate import MountRecord, default_log_file, pid_alive
from blobmount.settings import ENV_VARS, Settings, load_settings
from blobmount.source import SourceSpec

log = logging.getLogger(__name__)

#: how the background daemon receives the source URI (its environment, never its argv)
SOURCE_ENV = "BLOBMOUNT_SOURCE_URI"
READY_TIMEOUT_S = 120.0
#: after a graceful unmount, how long the daemon may take to exit before it is killed
EXIT_GRACE_S = 10.0

PathArg = str | os.PathLike[str]


class FuseUnavailable(BlobmountError):
    """FUSE is missing on this machine (no /dev/fuse, no fusermount3, or no pyfuse3)."""


class MountFailed(ProcessFailed):
    """The daemon did not get the mount ready; the message is its reason, `exit_status` its exit
    status (see `blobmount.errors.ExitStatus`), `log_file` its log."""

    def __init__(self, message: str, log_file: Path, exit_status: int | None = None) -> None:
        super().__init__(message, exit_status)
        self.log_file = log_file


# -- FUSE -----------------------------------------------------------------------------------

_DEBIAN_HINT = "on Debian/Ubuntu: apt-get install fuse3"


def fuse_problem(
    env: Mapping[str, str] | None = None, *, dev_fuse: Path = Path("/dev/fuse")
) -> str | None:
    """Why a mount cannot work here, with what to install, or None when FUSE looks usable.

    Checks, without importing anything heavy: the /dev/fuse device, the fusermount3 helper on
    PATH (from `env`), and that the pyfuse3 package is installed.
    """
    env = os.environ if env is None else env
    if not dev_fuse.exists():
        return (
            f"FUSE is not available: {dev_fuse} does not exist. Install FUSE 3 ({_DEBIAN_HINT}); "
            "in a container, run it with --device /dev/fuse --cap-add SYS_ADMIN"
        )
    path = env.get("PATH", os.defpath)
    if not any(shutil.which(name, path=path) for name in ("fusermount3", "fusermount")):
        return f"FUSE is not available: fusermount3 is not installed ({_DEBIAN_HINT})"
    if find_spec("pyfuse3") is None:
        return (
            "FUSE is not available: the Python package pyfuse3 is not installed. Install it with "
            "`pip install pyfuse3`; building it needs libfuse3-dev and pkg-config "
            "(on Debian/Ubuntu: apt-get install fuse3 libfuse3-dev pkg-config)"
        )
    return None


def pyfuse3_import_problem(exc: ImportError) -> str:
    """The message for pyfuse3 (or libfuse3 under it) failing to import in the daemon."""
    return (
        f"FUSE is not available: pyfuse3 cannot be imported ({exc}). It needs the fuse3 "
        "library (on Debian/Ubuntu: apt-get install fuse3 libfuse3-dev pkg-config, then "
        "pip install --force-reinstall pyfuse3)"
    )


# -- the log file ---------------------------------------------------------------------------


def check_log_file(path: Path, given_by: str) -> None:
    """Refuse a log file the daemon could not write, before anything is mounted: its logs would
    be lost. Creates the file (empty) when it can; never creates folders, since a missing one
    is more likely a typo than a wish. `given_by` names where the path came from.

    Raises:
        ConfigError: the folder is missing or not a folder, or the file cannot be written.
    """
    folder = path.parent
    if not folder.is_dir():
        state = "is not a folder" if folder.exists() else "does not exist; create it"
        raise ConfigError(
            f"cannot write the log file {path} ({given_by}): {folder} {state} or choose "
            "another log file"
        )
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise ConfigError(
            f"cannot write the log file {path} ({given_by}): "
            f"{exc.strerror or type(exc).__name__}; choose another log file"
        ) from None


def log_file_origin(from_flag: bool) -> str:
    """How a user set the log file, for `check_log_file`'s message."""
    return "--log-file" if from_flag else ENV_VARS["log_file"]


# -- mounting -------------------------------------------------------------------------------


def check_mount_request(uri: str, overrides: Mapping[str, Any]) -> tuple[Settings, SourceSpec]:
    """The checks that need no mount: the settings (`overrides` winning over the environment),
    the URI, and FUSE. Run by the caller before it spawns a daemon, and by the daemon itself.

    Raises:
        ConfigError, SourceError, CredentialError, FuseUnavailable: see `start_mount`.
    """
    settings = load_settings(**overrides)
    spec = resolve_source(uri)
    problem = fuse_problem()
    if problem is not None:
        raise FuseUnavailable(problem)
    return settings, spec


def child_env(settings: Settings, overrides: Mapping[str, Any]) -> dict[str, str]:
    """The DATASET_MOUNT_* variables that carry `overrides` (flags or keyword arguments) to the
    daemon, written from the validated `settings` so the daemon parses exactly what we checked.
    """
    out: dict[str, str] = {}
    for name, given in overrides.items():
        if given is None:
            continue
        value = getattr(settings, name)
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif name in ("file_mode", "dir_mode"):
            text = f"0o{value:o}"  # an int would be read back as octal digits
        elif isinstance(value, float):
            text = repr(value)
        else:
            text = str(value)
        out[ENV_VARS[name]] = text
    return out


@dataclass(frozen=True)
class RunningMount:
    """A mount served by a background daemon started by `start_mount`."""

    pid: int
    mountpoint: Path
    log_file: Path
    status: str  # the daemon's readiness line, e.g. "mounted <source> at <mount point>"
    unmount_timeout_s: float
    process: subprocess.Popen[bytes] = field(repr=False, compare=False)

    def stop(self) -> None:
        """Unmount (gracefully, as `unmount`) if still mounted, and wait for the daemon to exit.

        Raises:
            MountPointError: the mount could not be removed.
        """
        try:
            # `unmount`'s steps, with the daemon known by its process rather than its record
            alive = self.process.poll() is None
            if alive and _stop_daemon(self.process.pid, self.unmount_timeout_s):
                return
            if alive or mount_type(self.mountpoint) is not None:
                _remove_mount(self.mountpoint)
        finally:
            _reap(self.process, EXIT_GRACE_S)


def _reap(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        log.warning("daemon %d did not exit after unmounting; killing it", process.pid)
        process.kill()
        process.wait()


def start_mount(
    uri: str,
    mountpoint: PathArg,
    *,
    overrides: Mapping[str, Any] | None = None,
    allow_non_empty: bool = False,
) -> RunningMount:
    """Mount `uri` at `mountpoint` with a background daemon; return once the mount answers.

    `overrides` are settings by field name (None values are ignored), winning over the
    environment. The daemon inherits the environment (credentials, other settings).

    Raises:
        ConfigError: a bad setting (each one named), a malformed datastores file.
        SourceError: a malformed URI, an unknown datastore.
        CredentialError: a datastore's credential is missing.
        FuseUnavailable: FUSE is missing; the message says what to install.
        ConfigError: also for a log file that cannot be written.
        MountFailed: the daemon could not mount (its reason: missing container, refused
            credentials, bad mount point...); nothing is left mounted or running. Its
            `exit_status` is the daemon's.
    """
    overrides = dict(overrides or {})
    # Cheap checks first, in the caller's process: bad settings or a bad URI stop here.
    settings, spec = check_mount_request(uri, overrides)
    mountpoint = Path(mountpoint).absolute()
    if settings.log_file is None:
        log_file = default_log_file(mountpoint).absolute()
        log_file.parent.mkdir(parents=True, exist_ok=True)  # our own folder: make it
    else:
        log_file = settings.log_file.absolute()
        check_log_file(log_file, log_file_origin(overrides.get("log_file") is not None))

    env = dict(os.environ)
    env.update(child_env(settings, overrides))
    env[SOURCE_ENV] = uri
    env["BLOBMOUNT_DAEMONIZED"] = "1"
    if spec.datastore is not None:
        # the daemon must read the same file, even if it resolves paths from elsewhere
        env[DATASTORES_FILE_VAR] = str(datastores_file_path()[0])
    cmd = [sys.executable, "-m", "blobmount", "mount", "--foreground", "--log-file", str(log_file)]
    if allow_non_empty:
        cmd.append("--allow-non-empty")
    cmd.append(str(mountpoint))

    read_fd, write_fd = os.pipe()
    try:
        env[READY_FD_ENV] = str(write_fd)
        with open(log_file, "ab") as log_out:
            child = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_out,
                stderr=log_out,
                pass_fds=(write_fd,),
                # its own session: a Ctrl-C meant for the caller must not kill the mount
                start_new_session=True,
            )
        os.close(write_fd)
        write_fd = -1
        message = wait_for_ready_line(read_fd, child, READY_TIMEOUT_S)
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
    if message.startswith("ready "):
        return RunningMount(
            child.pid, mountpoint, log_file, message[6:], settings.unmount_timeout_s, child
        )
    # A daemon that sent its reason is exiting by itself, with the status that says what kind
    # of failure it was: wait for it rather than terminate it. One that said nothing is stopped.
    said_why = message.startswith("error ")
    if not said_why and child.poll() is None:
        child.terminate()
    _reap(child, EXIT_GRACE_S)
    if said_why:
        raise MountFailed(message[6:], log_file, child.returncode)
    raise MountFailed(f"{message}; see the log {log_file}", log_file, child.returncode)


def unmount(mountpoint: PathArg, *, timeout_s: float | None = None) -> None:
    """Unmount gracefully: the daemon finishes requests in flight (up to `timeout_s`, default
    DATASET_UNMOUNT_TIMEOUT_SECONDS), then unmounts and exits; a daemon that does not stop in
    time is killed, and a mount without a daemon is removed with fusermount3.

    Raises:
        MountPointError: nothing is mounted there, or the mount could not be removed.
    """
    mountpoint = Path(mountpoint).absolute()
    if timeout_s is None:
        timeout_s = load_settings().unmount_timeout_s
    record = MountRecord.load(mountpoint)
    if record is not None and pid_alive(record.pid) and _stop_daemon(record.pid, timeout_s):
        return
    _remove_mount(mountpoint)


def _stop_daemon(pid: int, timeout_s: float) -> bool:
    """SIGTERM the daemon and wait; SIGKILL it after the grace time. True if it stopped by
    itself (and so unmounted)."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s + 10
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.05)
    if not pid_alive(pid):
        return True
    log.warning("daemon %d did not stop in time; forcing", pid)
    os.kill(pid, signal.SIGKILL)
    return False


def _remove_mount(mountpoint: Path) -> None:
    if mount_type(mountpoint) is None:
        raise MountPointError(f"{mountpoint} is not mounted")
    if unmount_fuse(mountpoint) or unmount_fuse(mountpoint, lazy=True):
        return
    raise MountPointError(f"could not unmount {mountpoint}")


@contextlib.contextmanager
def mount(
    uri: str,
    mountpoint: PathArg | None = None,
    *,
    allow_non_empty: bool = False,
    **settings: Any,
) -> Iterator[Path]:
    """Mount `uri` for the length of a ``with`` block and yield the mounted folder.

    `mountpoint` must be an existing folder (empty unless `allow_non_empty`); without one, a
    temporary folder is created and removed afterwards. `settings` are named like the fields of
    `blobmount.settings.Settings` (``read_block_size="8MB"``, ``memory_cache_size=0``) and win
    over the DATASET_MOUNT_* variables. On leaving the block, also by an exception, the mount
    is unmounted gracefully and the daemon has exited.

    Raises:
        TypeError: a keyword names no setting.
        ConfigError, SourceError, CredentialError, FuseUnavailable, MountFailed: see
            `start_mount`; nothing is mounted then.
        MountPointError: the mount could not be removed on leaving the block.
    """
    created: Path | None = None
    # Resolved now, while nothing is mounted there (later a stat could wait on the mount): the
    # daemon and /proc/mounts know the mount by its resolved path.
    if mountpoint is None:
        created = Path(tempfile.mkdtemp(prefix="blobmount-"))
        target = created.resolve()
    else:
        target = Path(mountpoint).expanduser().resolve()
    try:
        running = start_mount(uri, target, overrides=settings, allow_non_empty=allow_non_empty)
    except BaseException:
        if created is not None:
            created.rmdir()
        raise
    try:
        yield running.mountpoint
    except BaseException:
        # keep the body's exception; a failure to unmount is logged, not raised over it
        try:
            running.stop()
        except BlobmountError as exc:
            log.error("could not unmount %s: %s", running.mountpoint, exc)
        raise
    else:
        running.stop()
    finally:
        if created is not None:
            with contextlib.suppress(OSError):  # still mounted: leave it rather than hang
                created.rmdir()
