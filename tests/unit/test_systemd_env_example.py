"""The environment file in docs/INSTALL-SYSTEMD.md works when copied: read as systemd's
`EnvironmentFile=` reads it, every value is one blobmount accepts.

systemd's rules (systemd.exec(5), EnvironmentFile=): a line whose first non-blank character is
`#` or `;` is a comment; any other line is KEY=VALUE, blanks around the key and before the value
dropped; a value may be quoted, and a `\\` takes the next character as it is; trailing blanks
of an unquoted value are dropped. A `#` after a value is *not* a comment: it is part of the
value.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from blobmount.datastores import resolve_source
from blobmount.errors import ConfigError
from blobmount.launch import SOURCE_ENV
from blobmount.settings import load_settings, unknown_variables

DOC = Path(__file__).resolve().parents[2] / "docs" / "INSTALL-SYSTEMD.md"
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_environment_file(text: str) -> dict[str, str]:
    """The variables systemd sets from an environment file's text."""
    env: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.lstrip()
        if not line or line[0] in "#;":
            continue
        assert not line.endswith("\\"), f"line {number}: continued lines are not handled here"
        key, sep, value = line.partition("=")
        key = key.strip()
        assert sep, f"line {number}: not KEY=VALUE: {raw!r}"
        assert _KEY.fullmatch(key), f"line {number}: not a variable name: {key!r}"
        value = value.lstrip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        else:
            value = re.sub(r"\\(.)", r"\1", value).rstrip()
        env[key] = value
    return env


def documented_example() -> str:
    """The code block of INSTALL-SYSTEMD.md that is the instance's .env file."""
    blocks = re.findall(r"^```\n(.*?)^```", DOC.read_text(), re.M | re.S)
    (example,) = [block for block in blocks if f"{SOURCE_ENV}=" in block]
    return str(example)


def test_the_parser_reads_as_systemd_does() -> None:
    env = parse_environment_file(
        '# a comment\n; another\n  KEY = value  \nQ="a # b"\nE=a\\ b\nT=true  # not a comment\n'
    )
    assert env == {"KEY": "value", "Q": "a # b", "E": "a b", "T": "true  # not a comment"}


def test_the_documented_environment_file_is_accepted_as_copied() -> None:
    env = parse_environment_file(documented_example())
    assert all("#" not in value for value in env.values()), env
    settings = load_settings(env)  # raises ConfigError for any value blobmount refuses
    assert unknown_variables(env) == []
    spec = resolve_source(env[SOURCE_ENV])
    assert spec.container == "datasets"
    assert Path(env["MOUNTPOINT"]).is_absolute()
    # each DATASET_* line of the example took effect, as written
    assert settings.allow_other is True
    assert settings.log_format == "json"
    assert settings.metrics_addr == "127.0.0.1:9464"
    assert settings.cache_size == 200 * 1024**3


def test_a_comment_after_a_value_is_refused() -> None:
    # why the example keeps its comments on lines of their own
    env = parse_environment_file("DATASET_MOUNT_ALLOW_OTHER=true   # let others read\n")
    with pytest.raises(ConfigError, match="DATASET_MOUNT_ALLOW_OTHER"):
        load_settings(env)
