"""Settings from environment variables: every variable's default, a good value and a bad value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from blobmount.errors import ConfigError
from blobmount.settings import ENV_VARS, Settings, describe, load_settings, split_host_port
from blobmount.units import GiB, KiB, MiB

CPUS = os.cpu_count() or 1


# (field, env var, default, good text, parsed good value, bad text)
CASES: list[tuple[str, str, Any, str, Any, str]] = [
    ("attribute_cache_ttl_ms", "DATASET_MOUNT_ATTRIBUTE_CACHE_TTL", None, "1500", 1500, "-1"),
    ("reserved_free_disk_space", "DATASET_RESERVED_FREE_DISK_SPACE", 150 * MiB, "1GB", GiB, "-1MB"),
    ("cache_size", "DATASET_MOUNT_CACHE_SIZE", None, "-5GB", -5 * GiB, "lots"),
    (
        "file_cache_prune_threshold",
        "DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD",
        1.0,
        "0.9",
        0.9,
        "0",
    ),
    ("file_cache_prune_target", "DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET", 0.7, "0.5", 0.5, "1"),
    ("read_block_size", "DATASET_MOUNT_READ_BLOCK_SIZE", 2 * MiB, "8MB", 8 * MiB, "abc"),
    ("read_buffer_block_count", "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT", 32, "0", 0, "4097"),
    ("read_threads", "DATASET_MOUNT_READ_THREADS", min(4 * CPUS, 1024), "16", 16, "0"),
    (
        "block_based_cache_enabled",
        "DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED",
        True,
        "false",
        False,
        "maybe",
    ),
    ("memory_cache_size", "DATASET_MOUNT_MEMORY_CACHE_SIZE", 128 * MiB, "0", 0, "-1"),
    ("block_file_cache_enabled", "DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED", True, "off", False, "2"),
    (
        "block_file_cache_max_queue_size",
        "DATASET_MOUNT_BLOCK_FILE_CACHE_MAX_QUEUE_SIZE",
        512 * MiB,
        "64 MiB",
        64 * MiB,
        "x",
    ),
    (
        "block_file_cache_write_threads",
        "DATASET_MOUNT_BLOCK_FILE_CACHE_WRITE_THREADS",
        min(2 * CPUS, 256),
        "3",
        3,
        "257",
    ),
    ("unmount_timeout_s", "DATASET_UNMOUNT_TIMEOUT_SECONDS", 30, "0", 0, "1.5"),
    ("http_retry_count", "AZUREML_DATASET_HTTP_RETRY_COUNT", 7, "10", 10, "101"),
    ("downloader_threads", "RSLEX_DOWNLOADER_THREADS", min(4 * CPUS, 1024), "64", 64, "-4"),
    (
        "cache_dir",
        "DATASET_MOUNT_CACHE_DIR",
        Path("/home/u/.cache/blobmount"),
        "/x",
        Path("/x"),
        "a\0b",
    ),
    ("read_ahead_memory_limit", "DATASET_MOUNT_READ_AHEAD_MEMORY_LIMIT", None, "1GB", GiB, "-1GB"),
    ("hint_memory_limit", "DATASET_MOUNT_HINT_MEMORY_LIMIT", 256 * MiB, "1GB", GiB, "-1"),
    ("hint_window_files", "DATASET_MOUNT_HINT_WINDOW", 512, "64", 64, "0"),
    ("hint_threads", "DATASET_MOUNT_HINT_THREADS", 32, "8", 8, "1025"),
    ("kernel_read_ahead", "DATASET_MOUNT_KERNEL_READ_AHEAD", MiB, "4MB", 4 * MiB, "65MB"),
    ("kernel_max_background", "DATASET_MOUNT_KERNEL_MAX_BACKGROUND", 64, "0", 0, "65536"),
    ("flow_control", "DATASET_MOUNT_FLOW_CONTROL", True, "off", False, "later"),
    ("breaker_seconds", "DATASET_MOUNT_BREAKER_SECONDS", 5.0, "0", 0.0, "-1"),
    ("snapshot", "DATASET_MOUNT_SNAPSHOT", None, "/d/train.bmsnap", "/d/train.bmsnap", "a\0b"),
    ("worker_processes", "DATASET_MOUNT_WORKER_PROCESSES", 1, "4", 4, "17"),
    ("connect_timeout_s", "DATASET_MOUNT_CONNECT_TIMEOUT_SECONDS", 10.0, "2.5", 2.5, "0"),
    ("read_timeout_s", "DATASET_MOUNT_READ_TIMEOUT_SECONDS", 30.0, "60", 60.0, "inf"),
    ("allow_other", "DATASET_MOUNT_ALLOW_OTHER", False, "yes", True, "sure"),
    ("uid", "DATASET_MOUNT_UID", None, "1000", 1000, "root"),
    ("gid", "DATASET_MOUNT_GID", None, "0", 0, "-1"),
    ("file_mode", "DATASET_MOUNT_FILE_MODE", 0o444, "0440", 0o440, "0644"),
    ("dir_mode", "DATASET_MOUNT_DIR_MODE", 0o555, "550", 0o550, "0755"),
    ("log_file", "DATASET_MOUNT_LOG_FILE", None, "/var/log/bm.log", Path("/var/log/bm.log"), "\0"),
    ("log_level", "DATASET_MOUNT_LOG_LEVEL", "INFO", "debug", "DEBUG", "TRACE"),
    ("anonymous", "DATASET_MOUNT_ANONYMOUS", False, "1", True, "nope"),
    ("listing_mode", "DATASET_MOUNT_LISTING_MODE", "auto", "FLAT", "flat", "tree"),
    ("log_format", "DATASET_MOUNT_LOG_FORMAT", "text", "JSON", "json", "yaml"),
    (
        "metrics_addr",
        "DATASET_MOUNT_METRICS_ADDR",
        None,
        "127.0.0.1:9464",
        "127.0.0.1:9464",
        "9464",
    ),
]
IDS = [case[0] for case in CASES]

# A HOME for the default cache dir, so defaults do not depend on the machine.
BASE_ENV = {"HOME": "/home/u"}


def test_cases_cover_every_setting() -> None:
    assert {(field, env) for field, env, *_ in CASES} == set(ENV_VARS.items())


@pytest.mark.parametrize(("field", "env_var", "default", "good", "parsed", "bad"), CASES, ids=IDS)
def test_default(field: str, env_var: str, default: Any, good: str, parsed: Any, bad: str) -> None:
    assert getattr(load_settings(BASE_ENV), field) == default


@pytest.mark.parametrize(("field", "env_var", "default", "good", "parsed", "bad"), CASES, ids=IDS)
def test_good_value(
    field: str, env_var: str, default: Any, good: str, parsed: Any, bad: str
) -> None:
    settings = load_settings({**BASE_ENV, env_var: good})
    assert getattr(settings, field) == parsed
    assert getattr(settings, field) != default


@pytest.mark.parametrize(("field", "env_var", "default", "good", "parsed", "bad"), CASES, ids=IDS)
def test_bad_value(
    field: str, env_var: str, default: Any, good: str, parsed: Any, bad: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({**BASE_ENV, env_var: bad})
    message = str(info.value)
    assert message.startswith(f"{env_var}={bad!r} is not valid: expected ")
    assert "\n" not in message


def test_message_example_from_the_spec() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"DATASET_MOUNT_READ_BLOCK_SIZE": "abc"})
    assert str(info.value) == (
        "DATASET_MOUNT_READ_BLOCK_SIZE='abc' is not valid: expected a size in bytes with an "
        "optional KB/MB/GB suffix between 64 KiB and 256 MiB (e.g. 2MB)"
    )


def test_no_pydantic_error_escapes_or_chains() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"DATASET_MOUNT_READ_THREADS": "many"})
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__


@pytest.mark.parametrize(
    ("env_var", "bad"),
    [
        ("DATASET_MOUNT_READ_BLOCK_SIZE", "32KB"),
        ("DATASET_MOUNT_READ_BLOCK_SIZE", "512MB"),
        ("DATASET_MOUNT_READ_BLOCK_SIZE", "1.5"),
        ("DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD", "1.5"),
        ("DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD", "nan"),
        ("DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET", "-0.1"),
        ("DATASET_MOUNT_READ_THREADS", "1025"),
        ("DATASET_MOUNT_READ_THREADS", "true"),
        ("DATASET_UNMOUNT_TIMEOUT_SECONDS", "86401"),
        ("DATASET_MOUNT_ATTRIBUTE_CACHE_TTL", "1.5s"),
        ("DATASET_MOUNT_CONNECT_TIMEOUT_SECONDS", "-1"),
        ("DATASET_MOUNT_UID", "4294967295"),
        ("DATASET_MOUNT_FILE_MODE", "0999"),
        ("DATASET_MOUNT_FILE_MODE", "01444"),
        ("DATASET_MOUNT_FILE_MODE", "r--r--r--"),
        ("DATASET_MOUNT_DIR_MODE", "0575"),
        ("DATASET_MOUNT_METRICS_ADDR", "127.0.0.1:0"),
        ("DATASET_MOUNT_METRICS_ADDR", "127.0.0.1:65536"),
        ("DATASET_MOUNT_METRICS_ADDR", "127.0.0.1:"),
        ("DATASET_MOUNT_METRICS_ADDR", ":9464"),
        ("DATASET_MOUNT_METRICS_ADDR", "::1:9464"),
        ("DATASET_MOUNT_METRICS_ADDR", "http://127.0.0.1:9464"),
    ],
)
def test_more_bad_values(env_var: str, bad: str) -> None:
    with pytest.raises(ConfigError, match=f"^{env_var}="):
        load_settings({env_var: bad})


def test_write_bits_are_refused_because_the_mount_is_read_only() -> None:
    with pytest.raises(ConfigError, match=r"DATASET_MOUNT_FILE_MODE='0666'.*read-only"):
        load_settings({"DATASET_MOUNT_FILE_MODE": "0666"})


@pytest.mark.parametrize(
    ("env", "field", "expected"),
    [
        ({"DATASET_MOUNT_CACHE_SIZE": "0"}, "cache_size", 0),
        ({"DATASET_MOUNT_CACHE_SIZE": "20 GiB"}, "cache_size", 20 * GiB),
        ({"DATASET_MOUNT_READ_BLOCK_SIZE": "64KB"}, "read_block_size", 64 * KiB),
        ({"DATASET_MOUNT_READ_BLOCK_SIZE": "256MB"}, "read_block_size", 256 * MiB),
        ({"DATASET_MOUNT_READ_BLOCK_SIZE": "4194304"}, "read_block_size", 4 * MiB),
        ({"DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD": "1"}, "file_cache_prune_threshold", 1.0),
        ({"DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET": "0"}, "file_cache_prune_target", 0.0),
        ({"DATASET_MOUNT_FILE_MODE": "0o400"}, "file_mode", 0o400),
        ({"DATASET_MOUNT_DIR_MODE": "0"}, "dir_mode", 0),
        ({"DATASET_MOUNT_LOG_LEVEL": "warn"}, "log_level", "WARNING"),
        ({"DATASET_MOUNT_READ_THREADS": " 8 "}, "read_threads", 8),
        ({"DATASET_MOUNT_METRICS_ADDR": "[::1]:9464"}, "metrics_addr", "[::1]:9464"),
        ({"DATASET_MOUNT_METRICS_ADDR": "node-1.local:80"}, "metrics_addr", "node-1.local:80"),
    ],
)
def test_edge_values_accepted(env: dict[str, str], field: str, expected: Any) -> None:
    assert getattr(load_settings(env), field) == expected


def test_all_bad_variables_are_reported_together_one_line_each() -> None:
    env = {
        "DATASET_MOUNT_READ_BLOCK_SIZE": "abc",
        "DATASET_MOUNT_FILE_MODE": "0644",
        "AZUREML_DATASET_HTTP_RETRY_COUNT": "lots",
        "DATASET_MOUNT_CACHE_SIZE": "-5GB",  # fine: negative means leave free
    }
    with pytest.raises(ConfigError) as info:
        load_settings(env)
    lines = str(info.value).splitlines()
    assert len(lines) == 3
    # in declaration order, so the message is stable
    assert lines[0].startswith("DATASET_MOUNT_READ_BLOCK_SIZE='abc' ")
    assert lines[1].startswith("AZUREML_DATASET_HTTP_RETRY_COUNT='lots' ")
    assert lines[2].startswith("DATASET_MOUNT_FILE_MODE='0644' ")


def test_prune_target_above_threshold_names_both_variables() -> None:
    env = {
        "DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD": "0.8",
        "DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET": "0.9",
    }
    with pytest.raises(ConfigError) as info:
        load_settings(env)
    message = str(info.value)
    assert "DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET=0.9" in message
    assert "DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD=0.8" in message


def test_prune_target_equal_to_threshold_is_fine() -> None:
    env = {
        "DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD": "0.6",
        "DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET": "0.6",
    }
    settings = load_settings(env)
    assert settings.file_cache_prune_target == settings.file_cache_prune_threshold == 0.6


def test_default_target_above_a_lowered_threshold_is_reported() -> None:
    # 0.7 (default target) > 0.5: the user must lower the target too.
    with pytest.raises(ConfigError, match=r"DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET=0\.7"):
        load_settings({"DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD": "0.5"})


def test_overrides_win_over_the_environment() -> None:
    env = {"DATASET_MOUNT_READ_BLOCK_SIZE": "8MB", "DATASET_MOUNT_READ_THREADS": "16"}
    settings = load_settings(env, read_block_size=4 * MiB, allow_other=True)
    assert settings.read_block_size == 4 * MiB
    assert settings.allow_other is True
    assert settings.read_threads == 16


def test_override_hides_a_bad_environment_value() -> None:
    settings = load_settings({"DATASET_MOUNT_READ_THREADS": "many"}, read_threads=3)
    assert settings.read_threads == 3


def test_overrides_accept_text_like_the_environment() -> None:
    assert load_settings({}, cache_size="-2GB").cache_size == -2 * GiB


def test_none_override_means_flag_not_given() -> None:
    settings = load_settings({"DATASET_MOUNT_CACHE_SIZE": "10GB"}, cache_size=None)
    assert settings.cache_size == 10 * GiB


def test_bad_override_names_the_variable_and_the_flag() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({}, read_block_size=1024, read_threads=True)
    lines = str(info.value).splitlines()
    assert lines == [line for line in lines if "(from a command-line flag) is not valid" in line]
    assert lines[0].startswith("DATASET_MOUNT_READ_BLOCK_SIZE=1024 (from a command-line flag)")
    assert lines[1].startswith("DATASET_MOUNT_READ_THREADS=True (from a command-line flag)")


def test_unknown_override_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="read_blocksize"):
        load_settings({}, read_blocksize=1)


def test_names_are_case_sensitive_and_unrelated_variables_ignored() -> None:
    env = {
        "dataset_mount_read_block_size": "abc",
        "DATASET_MOUNT_NOT_A_SETTING": "abc",
        "PATH": "/usr/bin",
    }
    assert load_settings(env).read_block_size == 2 * MiB


def test_blank_value_counts_as_unset() -> None:
    settings = load_settings({"DATASET_MOUNT_READ_BLOCK_SIZE": "", "DATASET_MOUNT_UID": "  "})
    assert settings.read_block_size == 2 * MiB
    assert settings.uid is None
    assert {row[0]: row[2] for row in describe(settings)}["DATASET_MOUNT_UID"] == "default"


def test_reads_os_environ_when_no_mapping_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT", "5")
    assert load_settings().read_buffer_block_count == 5
    monkeypatch.setenv("DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT", "oops")
    with pytest.raises(ConfigError, match="DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT='oops'"):
        load_settings()


def test_a_given_mapping_replaces_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT", "oops")
    assert load_settings({}).read_buffer_block_count == 32


def test_settings_is_frozen() -> None:
    settings = load_settings({})
    with pytest.raises(Exception, match="frozen"):
        settings.read_threads = 1  # type: ignore[misc]


def test_cache_dir_default_follows_xdg_then_home() -> None:
    xdg = load_settings({"XDG_CACHE_HOME": "/xdg", "HOME": "/home/u"})
    assert xdg.cache_dir == Path("/xdg/blobmount")
    # a relative XDG_CACHE_HOME is ignored, as the XDG spec says
    relative = load_settings({"XDG_CACHE_HOME": "rel", "HOME": "/home/u"})
    assert relative.cache_dir == Path("/home/u/.cache/blobmount")


def test_paths_are_made_absolute_and_expand_home() -> None:
    settings = load_settings(
        {"HOME": "/home/u", "DATASET_MOUNT_CACHE_DIR": "cache", "DATASET_MOUNT_LOG_FILE": "x.log"}
    )
    assert settings.cache_dir == Path.cwd() / "cache"
    assert settings.log_file == Path.cwd() / "x.log"
    home = load_settings({"DATASET_MOUNT_CACHE_DIR": "~/c"})
    assert home.cache_dir == Path.home() / "c"


def test_env_vars_names() -> None:
    assert ENV_VARS["read_block_size"] == "DATASET_MOUNT_READ_BLOCK_SIZE"
    assert ENV_VARS["http_retry_count"] == "AZUREML_DATASET_HTTP_RETRY_COUNT"
    assert ENV_VARS["downloader_threads"] == "RSLEX_DOWNLOADER_THREADS"
    ours = set(ENV_VARS) - {case[0] for case in CASES[:17]}
    assert all(ENV_VARS[field].startswith("DATASET_MOUNT_") for field in ours)


def test_describe_values_and_sources() -> None:
    env = {"HOME": "/home/u", "DATASET_MOUNT_CACHE_SIZE": "-5GB", "DATASET_MOUNT_UID": "1000"}
    rows = describe(load_settings(env, read_block_size="4MB"))
    assert [row[0] for row in rows] == list(ENV_VARS.values())
    table = {name: (value, source) for name, value, source in rows}
    assert table["DATASET_MOUNT_READ_BLOCK_SIZE"] == ("4 MiB", "flag")
    assert table["DATASET_MOUNT_CACHE_SIZE"] == (
        "-5 GiB (leave 5 GiB of the disk free)",
        "environment",
    )
    assert table["DATASET_MOUNT_UID"] == ("1000", "environment")
    assert table["DATASET_RESERVED_FREE_DISK_SPACE"] == ("150 MiB", "default")
    assert table["DATASET_MOUNT_ATTRIBUTE_CACHE_TTL"] == ("never expires", "default")
    assert table["DATASET_MOUNT_FILE_MODE"] == ("0444", "default")
    assert table["DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED"] == ("true", "default")
    assert table["DATASET_UNMOUNT_TIMEOUT_SECONDS"] == ("30 s", "default")
    assert table["DATASET_MOUNT_CACHE_DIR"] == ("/home/u/.cache/blobmount", "default")


def test_describe_shows_exact_bytes_for_odd_sizes() -> None:
    rows = describe(load_settings({"DATASET_MOUNT_MEMORY_CACHE_SIZE": "123456789"}))
    value = {name: value for name, value, _ in rows}["DATASET_MOUNT_MEMORY_CACHE_SIZE"]
    assert value == "117.74 MiB (123456789 bytes)"


def test_describe_of_a_directly_built_settings_guesses_sources() -> None:
    rows = describe(Settings(read_threads=2))
    sources = {name: source for name, _, source in rows}
    assert sources["DATASET_MOUNT_READ_THREADS"] == "environment"
    assert sources["DATASET_MOUNT_READ_BLOCK_SIZE"] in {"default", "environment"}


def test_importing_settings_does_not_import_fuse_or_azure() -> None:
    code = (
        "import sys, blobmount.settings, blobmount.source, blobmount.units\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('pyfuse3', 'azure', 'trio')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_metrics_address_splits_into_host_and_port() -> None:
    assert split_host_port("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert split_host_port("[::1]:9464") == ("::1", 9464)
    assert split_host_port("0.0.0.0:1") == ("0.0.0.0", 1)


def test_metrics_address_message_names_the_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"DATASET_MOUNT_METRICS_ADDR": "localhost"})
    assert str(info.value).startswith("DATASET_MOUNT_METRICS_ADDR='localhost' is not valid")
    assert "host:port" in str(info.value)
    row = {n: v for n, v, _ in describe(load_settings({}))}["DATASET_MOUNT_METRICS_ADDR"]
    assert row == "off"
