"""`blobmount download` below the process level: argument parsing, settings wiring (retries,
threads), signals and exit statuses, with the in-memory store in place of Azure."""

from __future__ import annotations

import os
import signal
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from blobmount.cli import _parser, main
from blobmount.cli.download import exit_status
from blobmount.compose.download import Outcome, run_download
from blobmount.download_mode.downloader import DownloadConfig, DownloadResult
from blobmount.errors import StorageUnavailable
from blobmount.settings import load_settings
from blobmount.source import parse_source
from blobmount.storage.faulty import FaultyStorageClient
from blobmount.storage.memory import InMemoryStorageClient
from tests.unit.test_download_downloader import Hooked
from tests.unit.test_download_progress import stats


def factory(storage):
    @asynccontextmanager
    async def opener():
        yield storage

    return opener


def test_parser_defaults_and_options():
    args = _parser().parse_args(["download", "az://cont/pre", "out"])
    assert (args.uri, args.dest, args.include, args.exclude) == (
        "az://cont/pre",
        Path("out"),
        [],
        [],
    )
    assert args.part_size == 8 * 1024 * 1024
    assert not args.verify
    args = _parser().parse_args(
        [
            "download",
            "az://cont",
            "out",
            "--include",
            "*.jpg",
            "--include",
            "*.png",
            "--exclude",
            "tmp/",
            "--verify",
            "--threads",
            "3",
            "--part-size",
            "1MB",
            "--json",
        ]
    )
    assert args.include == ["*.jpg", "*.png"]
    assert args.exclude == ["tmp/"]
    assert args.threads == 3
    assert args.part_size == 1024 * 1024
    assert args.verify
    assert args.json


def test_part_size_out_of_range_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["download", "az://cont", "out", "--part-size", "1KB"])
    assert exc.value.code == 2
    assert "between 64 KiB and 256 MiB" in capsys.readouterr().err


def test_bad_threads_setting_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RSLEX_DOWNLOADER_THREADS", "0")
    assert main(["download", "az://cont", str(tmp_path / "d")]) == 2  # a configuration mistake
    assert "RSLEX_DOWNLOADER_THREADS='0' is not valid" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(("retries", "ok"), [("1", False), ("2", True)])
async def test_retries_follow_azureml_dataset_http_retry_count(tmp_path, retries, ok):
    mem = InMemoryStorageClient()
    mem.put("f.txt", b"f")
    faulty = FaultyStorageClient(mem)
    faulty.fail_next("get_range", 2, lambda: StorageUnavailable("HTTP 503"))
    settings = load_settings({"AZUREML_DATASET_HTTP_RETRY_COUNT": retries})
    config = DownloadConfig(dest=tmp_path / "d", transfers=1)
    outcome = await run_download(
        settings, parse_source("az://cont"), config, False, factory(faulty)
    )
    assert outcome.result.ok is ok
    assert exit_status(outcome) == (0 if ok else 1)
    assert outcome.retries["retries"] == int(retries)  # the repeats, under one counted request
    assert outcome.requests["range_requests"] == 1
    assert faulty.calls["get_range"] == (2 if not ok else 3)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_a_signal_stops_the_download_cleanly(tmp_path, signum):
    mem = InMemoryStorageClient()
    for i in range(20):
        mem.put(f"f{i:02d}", b"x" * 100)
    gets = 0

    async def before(name: str, start: int) -> None:
        nonlocal gets
        gets += 1
        if gets == 5:
            os.kill(os.getpid(), signum)
            await trio.sleep_forever()  # the GET in flight when the signal comes

    settings = load_settings({})
    config = DownloadConfig(dest=tmp_path / "d", transfers=2)
    storage = Hooked(mem, before)
    outcome = await run_download(
        settings, parse_source("az://cont"), config, False, factory(storage)
    )
    assert outcome.interrupted == signal.Signals(signum).name
    assert exit_status(outcome) == 128 + signum
    names = sorted(os.listdir(tmp_path / "d"))
    assert ".blobmount-download.tmp" not in names
    files = [n for n in names if not n.startswith(".")]
    assert 0 < len(files) < 20
    for name in files:
        assert (tmp_path / "d" / name).read_bytes() == b"x" * 100


def test_exit_statuses():
    clean = DownloadResult(stats(), (), None)
    assert exit_status(Outcome(clean, None, {}, {})) == 0
    assert exit_status(Outcome(DownloadResult(stats(failed=1), (), None), None, {}, {})) == 1
    assert exit_status(Outcome(DownloadResult(stats(), (), "listing stopped"), None, {}, {})) == 1
    assert exit_status(Outcome(clean, "SIGINT", {}, {})) == 130
    assert exit_status(Outcome(clean, "SIGTERM", {}, {})) == 143


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"transfers": 0}, "transfers must be at least 1"),
        ({"part_size": 0}, "part size must be positive"),
        ({"prefix": "no-slash"}, "must be '' or end in '/'"),
        ({"includes": ("",)}, "empty filter pattern"),
    ],
)
def test_bad_configs_are_refused(tmp_path, kw, message):
    with pytest.raises(ValueError, match=message):
        DownloadConfig(dest=tmp_path, **kw)


def test_an_empty_filter_pattern_is_a_config_error(tmp_path, capsys):
    assert main(["download", "az://cont", str(tmp_path / "d"), "--exclude", ""]) == 2
    assert "empty filter pattern" in capsys.readouterr().err
