"""Fixtures for end-to-end tests: a dataset in Azurite and a real FUSE mount of it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.mount import MountedDaemon, fuse_unavailable_reason

pytestmark = pytest.mark.fuse


def worker_processes_env() -> dict[str, str]:
    """BLOBMOUNT_TEST_WORKER_PROCESSES=N runs every mount of the tests with N processes (CI runs
    the mount tests once with 1 and once with 2)."""
    processes = os.environ.get("BLOBMOUNT_TEST_WORKER_PROCESSES")
    return {"DATASET_MOUNT_WORKER_PROCESSES": processes} if processes else {}


@pytest.fixture(scope="session")
def fuse_ok() -> None:
    reason = fuse_unavailable_reason()
    if reason is not None:
        if os.environ.get("BLOBMOUNT_REQUIRE_ALL") == "1":
            pytest.fail(f"FUSE is required in CI but unavailable: {reason}")
        pytest.skip(f"FUSE unavailable: {reason}")


@pytest.fixture
def mount_env(azurite, tmp_path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DATASET_", "AZURE_STORAGE", "AZUREML_", "RSLEX_"))
    }
    env["AZURE_STORAGE_CONNECTION_STRING"] = azurite.connection_string
    env.update(worker_processes_env())
    # under the test's own tmp_path: the disk tier is on by default and would leave blocks
    env["DATASET_MOUNT_CACHE_DIR"] = str(tmp_path / "cache")
    return env


@pytest.fixture
def mount_factory(fuse_ok, azurite, mount_env, tmp_path, request) -> Iterator:
    """mount(container, prefix='', env=None, args=(), name=None, base_url=None) -> MountedDaemon;
    all stopped at teardown. `base_url` replaces Azurite's account URL (e.g. a fault proxy's)."""
    mounts: list[MountedDaemon] = []

    def mount(
        container: str,
        prefix: str = "",
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        name: str | None = None,
        base_url: str | None = None,
    ) -> MountedDaemon:
        base = base_url or azurite.account_url
        uri = f"{base}/{container}" + (f"/{prefix}" if prefix else "")
        n = len(mounts)
        daemon = MountedDaemon(
            uri,
            tmp_path / (name or f"mnt{n}"),
            {**mount_env, **(env or {})},
            tmp_path / f"daemon{n}.log",
            tuple(args),
        )
        mounts.append(daemon)
        return daemon.start()

    yield mount
    failed = request.node.rep_call.failed if hasattr(request.node, "rep_call") else False
    for daemon in mounts:
        daemon.stop()
        if failed:
            print(f"--- daemon log {daemon.log_file} ---\n{daemon.log()[-20000:]}")
    # disk-tier blocks of a streaming test run to gigabytes: give the space back now
    for daemon in mounts:
        cache = daemon.env.get("DATASET_MOUNT_CACHE_DIR")
        if cache and Path(cache).is_relative_to(tmp_path):
            shutil.rmtree(cache, ignore_errors=True)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    setattr(item, "rep_" + rep.when, rep)
    return rep
