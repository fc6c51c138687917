"""Two views of the settings for people and scripts: a warning for a DATASET_MOUNT_* variable
blobmount does not read (with the closest known name), and `blobmount config --json`."""

from __future__ import annotations

import ast
import json
import logging
import re
from pathlib import Path

import pytest

from blobmount import settings as settings_module
from blobmount.settings import (
    ENV_VARS,
    describe,
    describe_json,
    known_variables,
    load_settings,
    unknown_variables,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "blobmount"


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("DATASET_MOUNT_READ_BUFER_BLOCK_COUNT", "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT"),
        ("DATASET_MOUNT_CACHE_SIZ", "DATASET_MOUNT_CACHE_SIZE"),
        ("DATASET_MOUNT_LOGLEVEL", "DATASET_MOUNT_LOG_LEVEL"),
        # the same words under another of the Azure ML prefixes
        ("DATASET_MOUNT_UNMOUNT_TIMEOUT_SECONDS", "DATASET_UNMOUNT_TIMEOUT_SECONDS"),
        ("DATASET_MOUNT_HTTP_RETRY_COUNT", "AZUREML_DATASET_HTTP_RETRY_COUNT"),
        ("DATASET_MOUNT_DATASTORE_FILE", "DATASET_MOUNT_DATASTORES_FILE"),
        ("DATASET_MOUNT_ZZZ", None),  # nothing alike: the shared prefix does not count
    ],
)
def test_an_unknown_variable_gets_the_closest_known_name(name: str, closest: str | None) -> None:
    assert unknown_variables({name: "1", "PATH": "/bin"}) == [(name, closest)]


def test_known_and_other_variables_are_not_reported() -> None:
    env = dict.fromkeys(known_variables(), "1")
    env |= {"DATASET_OTHER": "1", "AZURE_STORAGE_KEY": "x", "HOME": "/root"}
    assert unknown_variables(env) == []


def test_every_dataset_mount_name_the_code_reads_is_known() -> None:
    # a variable read anywhere in src must never be called unknown
    named: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            is_text = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if is_text and re.fullmatch(r"DATASET_MOUNT_[A-Z0-9_]+", node.value):
                named.add(node.value)
    assert named
    assert named <= known_variables()


def test_load_settings_warns_once_per_unknown_name(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settings_module, "_warned", set())
    env = {"DATASET_MOUNT_READ_BUFER_BLOCK_COUNT": "80"}
    with caplog.at_level(logging.WARNING, logger="blobmount.settings"):
        load_settings(env)
        load_settings(env)
    (record,) = caplog.records
    assert record.getMessage() == (
        "DATASET_MOUNT_READ_BUFER_BLOCK_COUNT is not a blobmount setting and is ignored; "
        "did you mean DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT?"
    )


def test_config_json_has_every_setting_with_value_text_and_source() -> None:
    env = {
        "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT": "80",
        "DATASET_MOUNT_MEMORY_CACHE_SIZE": "1GB",
        "DATASET_MOUNT_CACHE_DIR": "/var/cache/x",
    }
    settings = load_settings(env, anonymous=True)
    out = json.loads(describe_json(settings, env))
    assert list(out["settings"]) == list(ENV_VARS.values())
    texts = {name: (text, source) for name, text, source in describe(settings)}
    for name, entry in out["settings"].items():
        assert (entry["text"], entry["source"]) == texts[name]
    rows = out["settings"]
    assert rows["DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT"]["value"] == 80
    assert rows["DATASET_MOUNT_MEMORY_CACHE_SIZE"]["value"] == 1024**3
    assert rows["DATASET_MOUNT_CACHE_DIR"]["value"] == "/var/cache/x"
    assert rows["DATASET_MOUNT_ANONYMOUS"] == {"value": True, "text": "true", "source": "flag"}
    assert rows["DATASET_MOUNT_ATTRIBUTE_CACHE_TTL"]["value"] is None
    assert out["unknown"] == []


def test_config_json_masks_credentials_and_secrets() -> None:
    key = "c2VjcmV0LWtleS1ieXRlcy1mb3ItdGVzdGluZy0xMjM0NTY3ODkw"
    env = {
        "AZURE_STORAGE_CONNECTION_STRING": f"AccountName=a;AccountKey={key}",
        "AZURE_STORAGE_SAS_TOKEN": "sv=2024&sig=abcdef",
        "AZURE_CLIENT_SECRET": "hunter2",
        "AZURE_STORAGE_ACCOUNT": "myaccount",  # not a secret: not listed either
        "AZURE_STORAGE_KEY": "  ",  # blank: not set
        "DATASET_MOUNT_LOG_FILE": "/var/log/x.log?sig=abcdef",
        "DATASET_MOUNT_TYPO": "1",
    }
    text = describe_json(load_settings(env), env)
    for secret in (key, "abcdef", "hunter2"):
        assert secret not in text
    out = json.loads(text)
    assert out["credentials"] == {
        "AZURE_CLIENT_SECRET": "***",
        "AZURE_STORAGE_CONNECTION_STRING": "***",
        "AZURE_STORAGE_SAS_TOKEN": "***",
    }
    assert out["unknown"] == ["DATASET_MOUNT_TYPO"]


def test_a_setting_named_like_a_secret_is_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    # none is today; a future one (a proxy password, a token file's content) must not leak
    monkeypatch.setitem(ENV_VARS, "log_level", "DATASET_MOUNT_PROXY_PASSWORD")
    out = json.loads(describe_json(load_settings({}), {}))
    assert out["settings"]["DATASET_MOUNT_PROXY_PASSWORD"]["value"] == "***"
    assert out["settings"]["DATASET_MOUNT_PROXY_PASSWORD"]["text"] == "***"
