"""The Python API without FUSE: what it checks before spawning anything, the message when FUSE
is missing, and how settings travel to the daemon. Real mounts are in tests/e2e/test_api.py."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import blobmount
from blobmount.errors import ConfigError, SourceError
from blobmount.launch import child_env, fuse_problem
from blobmount.settings import load_settings


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tempfile's folder, so a test sees every temporary mount point the API creates."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_fuse_problem_names_what_to_install(tmp_path: Path) -> None:
    problem = fuse_problem(dev_fuse=tmp_path / "no-fuse")
    assert problem is not None
    assert str(tmp_path / "no-fuse") in problem
    assert "apt-get install fuse3" in problem
    assert "--device /dev/fuse" in problem

    present = tmp_path / "fuse"
    present.touch()
    problem = fuse_problem({"PATH": str(tmp_path)}, dev_fuse=present)
    assert problem is not None
    assert "fusermount3 is not installed" in problem
    assert "apt-get install fuse3" in problem


def test_without_pyfuse3_the_api_imports_and_mount_says_what_to_install(tmp_path: Path) -> None:
    # pyfuse3 made unimportable, as on a machine where it was never built
    code = f"""
import sys, tempfile
sys.modules["pyfuse3"] = None
tempfile.tempdir = {str(tmp_path)!r}
import blobmount
from blobmount.api import FuseUnavailable
try:
    with blobmount.mount("http://127.0.0.1:9/devstoreaccount1/data"):
        raise SystemExit("mounted without FUSE?")
except FuseUnavailable as exc:
    print(exc)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATASET_", "AZURE_"))}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert "pyfuse3 is not installed" in done.stdout
    assert "pip install pyfuse3" in done.stdout
    assert "libfuse3-dev" in done.stdout
    assert "pkg-config" in done.stdout
    assert list(tmp_path.iterdir()) == []  # the temporary mount point is gone


def test_unknown_setting_is_a_type_error_and_leaves_nothing(private_tmp: Path) -> None:
    with (
        pytest.raises(TypeError, match="read_bufer_block_count"),
        blobmount.mount("az://data", read_bufer_block_count=80),
    ):
        pass
    assert list(private_tmp.iterdir()) == []


def test_bad_setting_names_the_variable(private_tmp: Path) -> None:
    with pytest.raises(ConfigError) as info, blobmount.mount("az://data", read_block_size="lots"):
        pass
    assert "DATASET_MOUNT_READ_BLOCK_SIZE='lots'" in str(info.value)
    assert list(private_tmp.iterdir()) == []


def test_bad_uri_and_unknown_datastore_are_refused_before_spawning(
    private_tmp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SourceError, match="container name 'Bad'"), blobmount.mount("az://Bad"):
        pass
    datastores = tmp_path / "ds.toml"
    datastores.write_text(
        "[datastores.a]\naccount='acct'\ncontainer='data'\ncredential='anonymous'\n"
    )
    monkeypatch.setenv("DATASET_MOUNT_DATASTORES_FILE", str(datastores))
    with (
        pytest.raises(SourceError, match="unknown datastore 'b'"),
        blobmount.mount("azureml://datastores/b/paths/x"),
    ):
        pass
    with pytest.raises(SourceError, match="unknown datastore 'b'"):
        blobmount.download("azureml://datastores/b/paths/x", tmp_path / "dest")
    assert list(private_tmp.iterdir()) == []
    assert not (tmp_path / "dest").exists()


def test_settings_reach_the_daemon_as_the_values_that_were_checked(tmp_path: Path) -> None:
    overrides = {
        "read_block_size": "4MB",
        "read_buffer_block_count": 80,
        "memory_cache_size": "0",
        "cache_size": "-5GB",
        "file_mode": 0o440,  # an int: must not be re-read as the octal digits "288"
        "dir_mode": "0550",
        "allow_other": True,
        "anonymous": False,
        "connect_timeout_s": 2.5,
        "attribute_cache_ttl_ms": 60000,
        "cache_dir": tmp_path / "cache",
        "log_level": "debug",
        "uid": None,  # None means "not given" and is left out
    }
    settings = load_settings({}, **overrides)
    env = child_env(settings, overrides)
    assert "DATASET_MOUNT_UID" not in env
    assert env["DATASET_MOUNT_FILE_MODE"] == "0o440"
    assert env["DATASET_MOUNT_ALLOW_OTHER"] == "true"
    again = load_settings(env)
    for name, value in overrides.items():
        if value is not None:
            assert getattr(again, name) == getattr(settings, name), name


def test_package_exports(tmp_path: Path) -> None:
    from blobmount import api

    assert blobmount.mount is api.mount
    assert blobmount.unmount is api.unmount
    # download mode's own package has another name, so importing it rebinds nothing
    importlib.import_module("blobmount.download_mode.downloader")
    assert blobmount.download is api.download
    with pytest.raises(SourceError):
        blobmount.download("az://Bad", tmp_path / "dest")
    with pytest.raises(AttributeError):
        _ = blobmount.no_such_thing  # type: ignore[attr-defined]


@pytest.mark.skipif(fuse_problem() is not None, reason="the FUSE checks before spawning fail first")
def test_pyfuse3_that_cannot_load_libfuse3_is_reported_with_what_to_install(
    tmp_path: Path,
) -> None:
    # pyfuse3 is installed (find_spec sees it) but importing it fails, as when libfuse3 is gone
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "pyfuse3.py").write_text(
        "raise ImportError('libfuse3.so.3: cannot open shared object file', name='pyfuse3')\n"
    )
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATASET_", "AZURE_"))}
    env["PYTHONPATH"] = str(fake)
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    uri = "http://127.0.0.1:9/devstoreaccount1/data"
    for extra in ([], ["--foreground"]):
        done = subprocess.run(
            [sys.executable, "-m", "blobmount", "mount", *extra, uri, str(mnt)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 1
        assert "pyfuse3 cannot be imported" in done.stderr, done.stderr
        assert "libfuse3-dev" in done.stderr
        assert "Traceback" not in done.stderr
    assert list(mnt.iterdir()) == []
