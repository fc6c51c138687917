"""Exit statuses: the one table from error class to status, and the command line using it."""

from __future__ import annotations

import argparse
import logging

import pytest

from blobmount import cli
from blobmount.errors import (
    BlobChanged,
    BlobmountError,
    BlobNotFound,
    ConfigError,
    ContainerNotFound,
    CredentialError,
    ExitStatus,
    MountPointError,
    ProcessFailed,
    SourceError,
    StorageError,
    StorageUnavailable,
    exit_status,
)
from blobmount.launch import FuseUnavailable, MountFailed


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ConfigError("bad"), 2),
        (SourceError("bad"), 2),
        (MountPointError("bad"), 2),
        (CredentialError("refused"), 3),
        (ContainerNotFound("gone"), 4),
        (BlobNotFound("gone"), 4),
        (StorageUnavailable("down", retry_after_s=1.0), 4),
        (StorageError("HTTP 400"), 1),
        (BlobChanged("412"), 1),
        (FuseUnavailable("no /dev/fuse"), 1),
        (BlobmountError("other"), 1),
        (ValueError("a bug"), 1),
    ],
)
def test_each_kind_of_error_has_its_status(error: BaseException, status: int) -> None:
    assert exit_status(error) == status


def test_a_subclass_gets_its_base_class_status() -> None:
    class OddSetting(ConfigError):
        pass

    assert exit_status(OddSetting("x")) == ExitStatus.USAGE


@pytest.mark.parametrize(
    ("daemon_status", "status"),
    [(2, 2), (3, 3), (4, 4), (1, 1), (0, 1), (-15, 1), (137, 1), (None, 1)],
)
def test_a_failed_daemon_reports_its_own_status(daemon_status: int | None, status: int) -> None:
    # 0 is not success when the mount failed; a signal or a status not ours is "anything else"
    assert exit_status(ProcessFailed("failed", daemon_status)) == status
    failed = MountFailed("container not found", log_file=None, exit_status=daemon_status)  # type: ignore[arg-type]
    assert exit_status(failed) == status


def test_the_documented_statuses_are_distinct() -> None:
    assert [int(s) for s in ExitStatus] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ConfigError("DATASET_MOUNT_X='y' is not valid"), 2),
        (CredentialError("refused"), 3),
        (StorageUnavailable("connection refused"), 4),
        (MountFailed("container not found", log_file=None, exit_status=4), 4),  # type: ignore[arg-type]
        (PermissionError(13, "Permission denied", "/var/cache/x"), 1),
    ],
)
def test_the_command_line_prints_one_line_and_exits_with_the_status(
    error: BaseException,
    status: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def run(args: argparse.Namespace) -> int:
        raise error

    monkeypatch.setattr(cli.stats, "run", run)
    assert cli.main(["stats", "/mnt/x"]) == status
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("blobmount: ")
    assert "Traceback" not in err


def test_help_lists_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for status in ExitStatus:
        assert f"  {int(status)}  " in out


def test_warnings_before_a_command_sets_up_logging_go_to_stderr_once_each(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    cli._warnings_to_stderr()
    cli._warnings_to_stderr()  # a second call adds nothing
    assert len(root.handlers) == 1
    logging.getLogger("blobmount.settings").warning("DATASET_MOUNT_X is not a setting")
    logging.getLogger("blobmount.settings").info("not shown")
    assert capsys.readouterr().err == "blobmount: DATASET_MOUNT_X is not a setting\n"
