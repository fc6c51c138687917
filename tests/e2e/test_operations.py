"""Running blobmount in production (issue #7): systemd readiness, stats and metrics of a live
mount, logs, the sidecar entrypoint, and the packaging files (systemd unit, Dockerfile,
compose file, Kubernetes pod), checked as far as this machine allows: no Docker engine,
no systemd as PID 1, no Kubernetes API server."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from blobmount.errors import ExitStatus
from blobmount.runstate import stats_socket
from blobmount.settings import load_settings
from blobmount.stats import fetch_stats
from blobmount.testing.pattern import pattern_bytes
from tests.helpers.mount import is_mounted
from tests.helpers.page_cache import drop_page_cache
from tests.helpers.single_process import FETCHES_PER_PROCESS

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "packaging" / "systemd" / "blobmount@.service"
DOCKER = ROOT / "docker"
VENV_BIN = Path(sys.executable).parent
MiB = 1024 * 1024

#: what `blobmount unmount` waits for a daemon after DATASET_UNMOUNT_TIMEOUT_SECONDS
UNMOUNT_GRACE_S = 10


def live(test):
    """A test through a real FUSE mount of Azurite (the packaging checks need neither)."""
    return pytest.mark.azurite(pytest.mark.fuse(test))


def blobmount(
    *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blobmount", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_for(predicate, timeout_s: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def dataset(azurite) -> str:
    name = f"ops-{uuid.uuid4().hex[:8]}"
    azurite.create_container(name)
    azurite.upload_many(
        name,
        [
            ("hello.txt", b"hello\n"),
            ("data/big.bin", pattern_bytes("big", 0, 3 * MiB + 12345)),
        ],
    )
    return name


# --- systemd readiness ------------------------------------------------------------------


class NotifyListener:
    """A unix datagram socket playing systemd's NOTIFY_SOCKET. For every message it records
    whether the mount point was mounted and listable at the moment the message arrived."""

    def __init__(self, mountpoint: Path) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="bm-notify-"))  # short: sun_path is 108 bytes
        self.path = self.dir / "notify"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.sock.settimeout(0.2)
        self.mountpoint = mountpoint
        self.messages: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            seen: dict[str, Any] = {"fields": fields, "mounted": is_mounted(self.mountpoint)}
            if fields.get("READY") == "1":
                try:
                    seen["listing"] = sorted(os.listdir(self.mountpoint))
                except OSError as exc:
                    seen["listing"] = exc
            self.messages.append(seen)

    def wait(self, key: str, timeout_s: float = 60) -> dict[str, Any]:
        def found() -> bool:
            return any(key in m["fields"] for m in self.messages)

        wait_for(found, timeout_s, f"{key} on NOTIFY_SOCKET (got {self.messages})")
        return next(m for m in self.messages if key in m["fields"])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@live
def test_systemd_ready_only_once_mounted_and_stopping_on_sigterm(dataset, mount_factory, tmp_path):
    listener = NotifyListener(tmp_path / "mnt")
    try:
        daemon = mount_factory(dataset, env={"NOTIFY_SOCKET": str(listener.path)}, name="mnt")
        ready = listener.wait("READY")
        # READY=1 arrived when the mount answered: mounted, and a listing works right away
        assert ready["mounted"], listener.messages
        assert ready["listing"] == ["data", "hello.txt"]
        assert ready["fields"]["STATUS"].startswith("mounted ")
        assert str(daemon.mountpoint) in ready["fields"]["STATUS"]
        assert not any("STOPPING" in m["fields"] for m in listener.messages)

        daemon.proc.send_signal(signal.SIGTERM)
        stopping = listener.wait("STOPPING")
        assert stopping["fields"]["STOPPING"] == "1"
        assert daemon.proc.wait(60) == 0
        assert not is_mounted(daemon.mountpoint)
        keys = [next(iter(m["fields"])) for m in listener.messages]
        assert keys == ["READY", "STOPPING"]  # nothing before READY, nothing after STOPPING
    finally:
        listener.close()


@live
def test_a_private_mount_namespace_hides_the_mount(azurite, dataset, mount_env, tmp_path, fuse_ok):
    """Why the systemd unit has no ProtectSystem=/PrivateTmp=/ReadWritePaths=...: each of these
    runs the service in its own mount namespace whose mounts do not propagate to the host.
    `unshare --propagation slave` builds the same kind of namespace."""
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs unshare(1) and root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    namespace = [unshare, "--mount", "--propagation", "slave", "--"]
    mount = ["mount", "--foreground", f"{azurite.account_url}/{dataset}", str(mnt)]
    proc = subprocess.Popen(
        [*namespace, sys.executable, "-m", "blobmount", *mount],
        env=mount_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        inside = Path(f"/proc/{proc.pid}/mounts")

        def mounted_inside() -> bool:
            assert proc.poll() is None, "the daemon exited"
            return f" {mnt} fuse.blobmount " in inside.read_text()

        wait_for(mounted_inside, 60, "the mount inside the namespace")
        assert not is_mounted(mnt)  # the rest of the machine does not see it
        assert os.listdir(mnt) == []
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- stats and metrics of a live mount --------------------------------------------------


def stats_json(mountpoint: Path, env: dict[str, str]) -> dict[str, Any]:
    done = blobmount("stats", str(mountpoint), "--json", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def read_dropping_page_cache(path: Path) -> bytes:
    """Read through a new open, after telling the kernel to drop the file's cached pages, so
    the reads reach the daemon (drop_caches needs privileges a container may not have)."""
    drop_page_cache(path)
    with open(path, "rb", buffering=0) as f:
        return f.read()


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@FETCHES_PER_PROCESS
@live
def test_stats_and_metrics_of_a_file_read_twice(dataset, mount_factory, mount_env):
    port = free_port()
    env = {
        "DATASET_MOUNT_READ_BLOCK_SIZE": "1MB",
        "DATASET_MOUNT_METRICS_ADDR": f"127.0.0.1:{port}",
    }
    daemon = mount_factory(dataset, env=env)
    path = daemon.mountpoint / "data/big.bin"
    expected = pattern_bytes("big", 0, 3 * MiB + 12345)
    blocks = 4

    s0 = stats_json(daemon.mountpoint, mount_env)
    assert read_dropping_page_cache(path) == expected
    s1 = stats_json(daemon.mountpoint, mount_env)
    assert read_dropping_page_cache(path) == expected
    s2 = stats_json(daemon.mountpoint, mount_env)

    def delta(a: dict, b: dict, *keys: str) -> float:
        x, y = a, b
        for key in keys:
            x, y = x[key], y[key]
        return y - x

    # first read: every block fetched from storage once, readers waited for some of them
    # each block fetched once, adjacent read-ahead blocks in one request
    assert 1 <= delta(s0, s1, "storage", "range_requests") <= blocks
    assert delta(s0, s1, "storage", "range_bytes") == len(expected)
    assert delta(s0, s1, "blocks", "bytes_served") == len(expected)
    assert delta(s0, s1, "blocks", "storage_waits") >= 1
    assert delta(s0, s1, "blocks", "prefetch_started") >= 1  # read-ahead fetched...
    assert delta(s0, s1, "blocks", "prefetch_used") >= 1  # ...and it was used
    assert s1["blocks"]["storage_wait_s"] > 0
    # second read: the same bytes, from the RAM tier, nothing from storage
    assert delta(s1, s2, "blocks", "reads") > 0, "the kernel answered; the page cache stayed"
    assert delta(s1, s2, "storage", "range_requests") == 0
    assert delta(s1, s2, "storage", "range_bytes") == 0
    assert delta(s1, s2, "blocks", "ram_hits") == blocks
    assert delta(s1, s2, "blocks", "storage_waits") == 0
    assert delta(s1, s2, "blocks", "bytes_served") == len(expected)
    assert s2["storage"]["errors"] == {}
    assert s2["retry"] == {"retries": 0, "gave_up": 0}
    assert s2["blocks"]["ram"]["capacity_bytes"] == 128 * MiB  # the default limit

    def memory_ratio(s: dict) -> float:
        b = s["blocks"]
        hits = b["buffer_hits"] + b["ram_hits"]
        return hits / (hits + b["storage_waits"])

    assert memory_ratio(s2) > memory_ratio(s1)

    # one process served it all: its requests (two opens and their reads at least) and CPU,
    # and no lock shared with other processes was ever taken
    (only,) = s2["processes"]
    assert (only["pid"], only["main"], only["shared_lock_s"]) == (daemon.pid, True, 0)
    assert delta(s0["processes"][0], only, "requests") >= 4
    assert delta(s0["processes"][0], only, "cpu_s") > 0

    # the metrics endpoint serves the same counters (the mount is idle now)
    got = scrape(port)
    s3 = fetch_stats(stats_socket(daemon.mountpoint))
    same = {
        ("blobmount_storage_requests_total", (("operation", "range"),)): (
            "storage",
            "range_requests",
        ),
        ("blobmount_storage_requests_total", (("operation", "list"),)): (
            "storage",
            "list_requests",
        ),
        ("blobmount_storage_read_bytes_total", ()): ("storage", "range_bytes"),
        ("blobmount_block_lookups_total", (("source", "ram"),)): ("blocks", "ram_hits"),
        ("blobmount_block_lookups_total", (("source", "buffer"),)): ("blocks", "buffer_hits"),
        ("blobmount_block_lookups_total", (("source", "fetch"),)): ("blocks", "storage_waits"),
        ("blobmount_read_bytes_total", ()): ("blocks", "bytes_served"),
        ("blobmount_reads_total", ()): ("blocks", "reads"),
        ("blobmount_readahead_blocks_fetched_total", ()): ("blocks", "prefetch_started"),
        ("blobmount_readahead_blocks_used_total", ()): ("blocks", "prefetch_used"),
        ("blobmount_storage_wait_seconds_total", ()): ("blocks", "storage_wait_s"),
        ("blobmount_ram_cache_limit_bytes", ()): ("blocks", "ram", "capacity_bytes"),
        ("blobmount_storage_retries_total", ()): ("retry", "retries"),
    }
    for metric, keys in same.items():
        value: Any = s3
        for key in keys:
            value = value[key]
        assert got[metric] == pytest.approx(value), metric
    range_requests = s2["storage"]["range_requests"]
    assert got[("blobmount_storage_requests_total", (("operation", "range"),))] == range_requests
    info = [k for k in got if k[0] == "blobmount_mount_info"]
    assert dict(info[0][1])["mountpoint"] == str(daemon.mountpoint)
    assert got[("process_resident_memory_bytes", ())] > 0

    # people get the same figures as text
    done = blobmount("stats", str(daemon.mountpoint), env=mount_env)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    for line in (
        "served to readers",
        f"storage requests  {range_requests} range",
        "cache hits        RAM ",
        "read-ahead",
        "RAM tier",
        "disk tier",
        "waiting on storage",
        "retries / errors",
    ):
        assert line in text, text

    # neither the stats socket nor the metrics endpoint adds anything to the namespace
    found = sorted(
        os.path.relpath(os.path.join(root, n), daemon.mountpoint)
        for root, dirs, files in os.walk(daemon.mountpoint)
        for n in dirs + files
    )
    assert found == ["data", "data/big.bin", "hello.txt"]

    # unmounting frees the metrics port
    daemon.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


@FETCHES_PER_PROCESS
@live
def test_a_small_files_get_starts_at_its_first_open(dataset, mount_factory, mount_env):
    # one block: the GET goes out with the first OPEN (the kernel holds none of its pages), and
    # the READ takes that block, landed or on the wire; a reopen, whose reads the kernel may
    # answer from its page cache, starts nothing
    daemon = mount_factory(dataset, env={"DATASET_MOUNT_MEMORY_CACHE_SIZE": "0"})
    path = daemon.mountpoint / "hello.txt"
    s0 = stats_json(daemon.mountpoint, mount_env)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.read(fd, 100) == b"hello\n"
    finally:
        os.close(fd)
    s1 = stats_json(daemon.mountpoint, mount_env)
    assert path.read_bytes() == b"hello\n"
    s2 = stats_json(daemon.mountpoint, mount_env)
    for a, b, started in ((s0, s1, 1), (s1, s2, 0)):
        assert b["storage"]["range_requests"] - a["storage"]["range_requests"] == started
        assert b["blocks"]["prefetch_started"] - a["blocks"]["prefetch_started"] == started
        assert b["blocks"]["prefetch_used"] - a["blocks"]["prefetch_used"] == started
    assert s2["blocks"]["prefetch_wasted"] == 0
    assert s2["blocks"]["read_ahead_bytes"] == 0


@live
def test_stats_without_the_disk_tier(dataset, mount_factory, mount_env):
    daemon = mount_factory(dataset, env={"DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED": "false"})
    assert stats_json(daemon.mountpoint, mount_env)["disk"] is None
    done = blobmount("stats", str(daemon.mountpoint), env=mount_env)
    assert done.returncode == 0, done.stderr
    assert "disk tier         off" in done.stdout
    assert "disk off" in done.stdout


@pytest.fixture
def mountpoint(tmp_path, fuse_ok) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    yield mnt
    if is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)


@live
def test_metrics_address_problems_stop_the_mount(azurite, dataset, mountpoint, mount_env):
    uri = f"{azurite.account_url}/{dataset}"
    env = {**mount_env, "DATASET_MOUNT_METRICS_ADDR": "9464"}
    done = blobmount("mount", uri, str(mountpoint), env=env)
    assert done.returncode != 0
    assert "DATASET_MOUNT_METRICS_ADDR='9464' is not valid" in done.stderr
    assert not is_mounted(mountpoint)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        env = {**mount_env, "DATASET_MOUNT_METRICS_ADDR": address}
        done = blobmount("mount", uri, str(mountpoint), env=env)
    assert done.returncode != 0
    assert f"DATASET_MOUNT_METRICS_ADDR='{address}'" in done.stderr
    assert not is_mounted(mountpoint)


# --- logs -------------------------------------------------------------------------------


@contextlib.contextmanager
def background_mount(uri: str, mountpoint: Path, env: dict[str, str], log_file: Path):
    done = blobmount("mount", uri, str(mountpoint), "--log-file", str(log_file), env=env)
    assert done.returncode == 0, done.stderr + log_file.read_text(errors="replace")
    pid = int(done.stdout.split("(pid ")[1].split(",")[0])
    try:
        yield done
    finally:
        blobmount("unmount", str(mountpoint), env=env)
        if psutil.pid_exists(pid):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.TimeoutExpired):
                psutil.Process(pid).wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # only if it outlived its unmount


@live
@pytest.mark.parametrize(
    ("credential", "log_format"),
    [("connection_string", "text"), ("account_key", "json"), ("sas", "json")],
)
def test_logs_hold_no_credentials(
    azurite, dataset, mountpoint, mount_env, tmp_path, credential, log_format
):
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    key = azurite.connection_string.split("AccountKey=")[1].split(";")[0]
    env = {k: v for k, v in mount_env.items() if k != "AZURE_STORAGE_CONNECTION_STRING"}
    env["DATASET_MOUNT_LOG_LEVEL"] = "DEBUG"
    env["DATASET_MOUNT_LOG_FORMAT"] = log_format
    uri = f"{azurite.account_url}/{dataset}"
    secrets = [key, key[:20], key[-20:]]
    if credential == "connection_string":
        env["AZURE_STORAGE_CONNECTION_STRING"] = azurite.connection_string
    elif credential == "account_key":
        env["AZURE_STORAGE_KEY"] = key
    else:
        sas = generate_container_sas(
            azurite.account,
            dataset,
            account_key=key,
            permission=ContainerSasPermissions(read=True, list=True),
            expiry=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1),
        )
        uri += f"?{sas}"
        secrets.append(next(p for p in sas.split("&") if p.startswith("sig="))[4:])
    log_file = tmp_path / "daemon.log"
    with background_mount(uri, mountpoint, env, log_file) as done:
        assert (mountpoint / "hello.txt").read_bytes() == b"hello\n"
        with contextlib.suppress(FileNotFoundError):
            (mountpoint / "missing.txt").read_bytes()  # a lookup that fails, logged at DEBUG
        stats = blobmount("stats", str(mountpoint), "--json", env=env)
        assert stats.returncode == 0
    text = log_file.read_text()
    for secret in secrets:
        assert secret not in text
        assert secret not in done.stdout + done.stderr + stats.stdout
    assert "DEBUG" in text  # verbose, and still clean
    if log_format == "json":
        entries = [json.loads(line) for line in text.splitlines()]
        assert all({"time", "level", "logger", "message"} <= set(e) for e in entries)
        messages = [e["message"] for e in entries]
        settings_line = next(m for m in messages if m.startswith("settings: "))
        assert "DATASET_MOUNT_LOG_FORMAT=json" in settings_line
        assert any(m.startswith("mounted ") for m in messages)
        assert messages[-1].startswith("unmounted ")
    else:
        assert re.search(r"^\S+ \S+ INFO    blobmount\.compose\.storage: settings: ", text, re.M)


# --- the sidecar entrypoint, outside a container ----------------------------------------


def restricted_like_the_sidecar() -> list[str]:
    """setpriv arguments that give the entrypoint the container's privileges: root, with
    CAP_SYS_ADMIN as the only capability, and no_new_privs."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("needs setpriv(1) and root")
    caps = ["--bounding-set=-all,+sys_admin", "--inh-caps=-all", "--ambient-caps=-all"]
    return [setpriv, *caps, "--no-new-privs", "--"]


@live
@pytest.mark.parametrize("privileges", ["as_is", "cap_sys_admin_only"])
def test_entrypoint_mounts_and_unmounts_on_sigterm(
    azurite, dataset, mount_env, tmp_path, fuse_ok, privileges
):
    prefix = restricted_like_the_sidecar() if privileges == "cap_sys_admin_only" else []
    share = tmp_path / "share"
    mnt = share / "data"  # does not exist yet: the entrypoint makes it
    env = {
        **mount_env,
        "BLOBMOUNT_SOURCE_URI": f"{azurite.account_url}/{dataset}",
        "MOUNTPOINT": str(mnt),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "DATASET_MOUNT_LOG_FORMAT": "json",
    }
    log_file = tmp_path / "entrypoint.log"
    with open(log_file, "wb") as out:
        proc = subprocess.Popen(
            [*prefix, str(DOCKER / "entrypoint.sh")],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def ready() -> bool:
            assert proc.poll() is None, log_file.read_text()
            return is_mounted(mnt) and sorted(os.listdir(mnt)) == ["data", "hello.txt"]

        wait_for(ready, 60, "the entrypoint's mount")
        # exec: the process we started is now the daemon itself, so signals reach it
        cmdline = psutil.Process(proc.pid).cmdline()
        assert cmdline[-3:] == ["mount", "--foreground", str(mnt)], cmdline
        if prefix:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            assert re.search(r"^CapEff:\s+0*200000$", status, re.M), status  # CAP_SYS_ADMIN
            assert re.search(r"^NoNewPrivs:\s+1$", status, re.M), status
        # the readiness probe of compose and Kubernetes
        probe = blobmount("stats", str(mnt), env=env)
        assert probe.returncode == 0, probe.stderr
        assert (mnt / "hello.txt").read_bytes() == b"hello\n"

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert not is_mounted(mnt)
        assert blobmount("stats", str(mnt), env=env).returncode != 0
        last = json.loads(log_file.read_text().splitlines()[-1])
        assert last["message"].startswith("unmounted ")
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_entrypoint_without_a_source_says_so(tmp_path):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "MOUNTPOINT": str(tmp_path / "m")}
    done = subprocess.run(
        [str(DOCKER / "entrypoint.sh")], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 2  # usage or configuration, as blobmount says it
    assert "BLOBMOUNT_SOURCE_URI" in done.stderr
    assert not (tmp_path / "m").exists()


# --- packaging files --------------------------------------------------------------------


def read_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """systemd's unit syntax: [Section], Key=Value, repeated keys accumulate, '#' comments,
    no continuation lines in our file (checked)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"continuation line: {raw}"
        if line.startswith("["):
            assert line.endswith("]"), raw
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"setting outside a section: {raw}"
        key, sep, value = line.partition("=")
        assert sep, f"not Key=Value: {raw}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


# Each of these gives the service its own mount namespace (systemd.exec(5)), so the FUSE mount
# would not be seen outside the service; see docs/INSTALL-SYSTEMD.md.
NAMESPACING = (
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateDevices",
    "PrivateMounts",
    "PrivateUsers",
    "PrivateNetwork",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectProc",
    "ProcSubset",
    "ReadWritePaths",
    "ReadOnlyPaths",
    "InaccessiblePaths",
    "ExecPaths",
    "NoExecPaths",
    "TemporaryFileSystem",
    "BindPaths",
    "BindReadOnlyPaths",
    "MountFlags",
    "RootDirectory",
    "RootImage",
    "MountAPIVFS",
    "DynamicUser",
)


def test_unit_file_settings():
    unit = read_unit(UNIT)
    service = unit["Service"]
    one = {key: values[-1] for key, values in service.items()}
    assert one["Type"] == "notify"
    assert one["NotifyAccess"] == "main"
    assert one["Restart"] == "on-failure"
    # a configuration mistake (exit status 2, blobmount.errors.ExitStatus.USAGE) is not retried
    assert one["RestartPreventExitStatus"].split() == [str(int(ExitStatus.USAGE))]
    assert one["EnvironmentFile"] == "/etc/blobmount/%i.env"
    # no URI on the command line: the CLI reads BLOBMOUNT_SOURCE_URI (no SAS in `ps`)
    assert one["ExecStart"].endswith(" mount --foreground ${MOUNTPOINT}")
    assert one["ExecStop"].lstrip("-").endswith(" unmount ${MOUNTPOINT}")
    assert one["ExecStart"].split()[0] == one["ExecStop"].lstrip("-").split()[0]
    default_timeout = load_settings({}).unmount_timeout_s
    assert int(one["TimeoutStopSec"]) >= default_timeout + UNMOUNT_GRACE_S + 5
    assert one["CapabilityBoundingSet"] == "CAP_SYS_ADMIN"
    assert one["NoNewPrivileges"] == "yes"
    assert "/dev/fuse rw" in service["DeviceAllow"]
    assert "User" not in service  # mount(2) as root; a user would need setuid fusermount3
    present = [key for key in NAMESPACING if key in service]
    assert not present, f"these hide the mount from the host: {present}"
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def instance_for_verify(tmp_path: Path, text: str) -> Path:
    """The unit as an instance systemd-analyze can load, with ExecStart= pointing at this
    checkout's blobmount (verify checks that the command exists)."""
    exe = VENV_BIN / "blobmount"
    assert exe.exists()
    template = tmp_path / "blobmount@.service"
    template.write_text(text.replace("/usr/local/bin/blobmount", str(exe)))
    instance = tmp_path / "blobmount@data.service"
    instance.symlink_to(template.name)
    return instance


def systemd_analyze(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    return subprocess.run([exe, *args], capture_output=True, text=True, check=False, timeout=120)


def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    text = UNIT.read_text()
    done = systemd_analyze("verify", str(instance_for_verify(tmp_path, text)))
    assert done.returncode == 0, done.stderr
    assert done.stdout + done.stderr == ""  # not even a warning
    # and it does catch mistakes (it only warns about a bad key, so warnings count)
    broken = tmp_path / "broken"
    broken.mkdir()
    typo = text.replace("NotifyAccess=main", "NotifyAcess=main")
    done = systemd_analyze("verify", str(instance_for_verify(broken, typo)))
    assert "Unknown key 'NotifyAcess'" in done.stderr


def test_systemd_analyze_security_rates_the_unit(tmp_path):
    done = systemd_analyze(
        "security",
        "--offline=yes",
        "--no-pager",
        str(instance_for_verify(tmp_path, UNIT.read_text())),
    )
    if "--offline" in done.stderr:
        pytest.skip(f"this systemd-analyze has no offline security mode: {done.stderr}")
    assert done.returncode == 0, done.stderr
    exposure = re.search(r"Overall exposure level for \S+: (\d+\.\d)", done.stdout)
    assert exposure, done.stdout
    # 4.1 with systemd 252; the table in docs/INSTALL-SYSTEMD.md explains what is left
    assert float(exposure[1]) <= 5.0


MAKEFILE = (ROOT / "Makefile").read_text()


def test_dockerfile_builds_from_files_that_exist():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    copies = re.findall(r"^COPY (?!--from)(.+)$", dockerfile, re.M)
    assert copies
    # BuildKit's Dockerfile-specific ignore file: everything is left out but what is listed
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    assert "*" in ignore
    kept = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for line in copies:
        *sources, _ = line.split()
        for source in sources:
            if source == "dist/":  # the release's wheel, which `make dist` builds first
                assert "dist/blobmount-*-py3-none-any.whl" in kept
                make_dist = r"^dist: .*\n(\t.*\n)*\t\$\(PY\) -m build --outdir dist"
                assert re.search(make_dist, MAKEFILE, re.M)
                continue
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert source.rstrip("/") in kept, f"COPY {source}: excluded from the build context"
    assert "fuse3" in dockerfile
    # the image installs the wheel, with pyfuse3 from the [fuse] extra
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(dep.startswith("pyfuse3") for dep in extras["fuse"])
    assert "set -- /dist/blobmount-*-py3-none-any.whl" in dockerfile
    assert 'pip install --no-cache-dir "$1[fuse]"' in dockerfile
    assert 'python -c "import pyfuse3"' in dockerfile
    assert re.search(r"^FROM python:\S+-slim|^ARG PYTHON_IMAGE=python:\S+-slim", dockerfile, re.M)
    entrypoint = re.search(r"^ENTRYPOINT (.+)$", dockerfile, re.M)
    assert entrypoint
    assert json.loads(entrypoint[1])[-1] == "/usr/local/bin/blobmount-entrypoint"
    assert "COPY docker/entrypoint.sh /usr/local/bin/blobmount-entrypoint" in dockerfile
    assert os.access(DOCKER / "entrypoint.sh", os.X_OK)
    for shell in ("sh", "bash"):
        if shutil.which(shell):
            check = subprocess.run([shell, "-n", str(DOCKER / "entrypoint.sh")], check=False)
            assert check.returncode == 0


def test_compose_file():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"azurite", "seed", "blobmount", "consumer"}
    assert services["azurite"]["image"].startswith("mcr.microsoft.com/azure-storage/azurite")
    for name in ("seed", "blobmount"):  # both build the image, so nothing tries to pull it
        build = services[name]["build"]
        assert (DOCKER / build["context"] / build["dockerfile"]).resolve() == DOCKER / "Dockerfile"
        assert services[name]["image"] == "blobmount:dev"
    seed_source = services["seed"]["volumes"][0].split(":")[0]
    assert (DOCKER / seed_source).exists()

    sidecar = services["blobmount"]
    env = sidecar["environment"]
    assert env["BLOBMOUNT_SOURCE_URI"].endswith("/demo")  # the container seed_demo.py fills
    assert "/dev/fuse:/dev/fuse" in sidecar["devices"]
    assert sidecar["cap_drop"] == ["ALL"]
    assert sidecar["cap_add"] == ["SYS_ADMIN"]
    assert "privileged" not in sidecar
    assert "apparmor:unconfined" in sidecar["security_opt"]
    assert "no-new-privileges:true" in sidecar["security_opt"]
    assert sidecar["healthcheck"]["test"] == ["CMD", "blobmount", "stats", env["MOUNTPOINT"]]
    grace = int(sidecar["stop_grace_period"].rstrip("s"))
    assert grace > load_settings({}).unmount_timeout_s

    def share(service: dict) -> dict:
        return next(v for v in service["volumes"] if isinstance(v, dict) and v["type"] == "bind")

    mine, theirs = share(sidecar), share(services["consumer"])
    assert mine["bind"]["propagation"] == "rshared"
    assert theirs["bind"]["propagation"] == "rslave"
    assert mine["source"] == theirs["source"]
    assert mine["target"] == theirs["target"]
    assert env["MOUNTPOINT"].startswith(mine["target"] + "/")  # inside the shared volume
    assert services["consumer"]["depends_on"]["blobmount"]["condition"] == "service_healthy"
    assert env["MOUNTPOINT"] in "\n".join(services["consumer"]["command"])


def test_kubernetes_pod_and_its_copy_in_the_docs():
    text = (DOCKER / "k8s-pod.yaml").read_text()
    pod = yaml.safe_load(text)
    assert pod["kind"] == "Pod"
    spec = pod["spec"]
    (sidecar,) = spec["initContainers"]
    (trainer,) = spec["containers"]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    mountpoint = env["MOUNTPOINT"]
    # the API server refuses Bidirectional propagation in a container that is not privileged
    assert sidecar["securityContext"]["privileged"] is True
    shared = next(m for m in sidecar["volumeMounts"] if m["mountPropagation"] == "Bidirectional")
    seen = next(m for m in trainer["volumeMounts"] if m["name"] == shared["name"])
    assert seen["mountPropagation"] == "HostToContainer"
    assert mountpoint.startswith(shared["mountPath"] + "/")
    assert trainer["securityContext"]["allowPrivilegeEscalation"] is False
    probe = ["blobmount", "stats", mountpoint]
    assert sidecar["startupProbe"]["exec"]["command"] == probe
    assert sidecar["readinessProbe"]["exec"]["command"] == probe
    assert sidecar["lifecycle"]["preStop"]["exec"]["command"] == [
        "blobmount",
        "unmount",
        mountpoint,
    ]
    grace = spec["terminationGracePeriodSeconds"]
    assert grace >= load_settings({}).unmount_timeout_s + UNMOUNT_GRACE_S
    assert text in (ROOT / "docs" / "SIDECAR.md").read_text()
