"""storage/request_log.py: what a storage request's debug line says, and that it says nothing
secret; the -v / --debug flags and their precedence over DATASET_MOUNT_LOG_LEVEL."""

from __future__ import annotations

import json
import logging

import pytest

from blobmount.cli import _parser
from blobmount.cli import mount as mount_cli
from blobmount.cli.verbosity import early_level, log_level
from blobmount.logs import FORMAT, JsonFormatter, RedactingFormatter
from blobmount.settings import load_settings
from blobmount.storage import request_log
from blobmount.storage.request_log import SentRequest, describe_url

ACCOUNT_URL = "https://acct.blob.core.windows.net"
SIG = "sv=2024-08-04&sr=c&sp=rl&se=2030-01-01&sig=c2VjcmV0LXNpZ25hdHVyZQ%3D%3D"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (f"{ACCOUNT_URL}/data/a/b.bin", "acct/data/a/b.bin"),
        (f"{ACCOUNT_URL}/data/a%20b/%E6%96%87.txt?{SIG}", "acct/data/a%20b/%E6%96%87.txt"),
        (
            f"{ACCOUNT_URL}/data?restype=container&comp=list&include=metadata&maxresults=5000"
            f"&prefix=train%2Fshard%2001%2F&delimiter=%2F&marker=abc&{SIG}",
            "acct/data/train/shard%2001/ list",
        ),
        (f"{ACCOUNT_URL}/data?restype=container&comp=list&maxresults=1", "acct/data/ list"),
        # path-style (Azurite): the account is in the endpoint's path, and stays in the line
        (
            "http://127.0.0.1:10000/devstoreaccount1/c/x.bin",
            "devstoreaccount1/c/x.bin",
        ),
    ],
)
def test_the_path_is_the_account_and_url_path_without_the_query(url, expected):
    account_url = (
        "http://127.0.0.1:10000/devstoreaccount1" if url.startswith("http://") else ACCOUNT_URL
    )
    account = "devstoreaccount1" if url.startswith("http://") else "acct"
    assert describe_url(url, account_url, account) == expected


def _line(caplog, sent: SentRequest, *args) -> logging.LogRecord:
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=request_log.__name__):
        if args and isinstance(args[0], BaseException):
            sent.failed(args[0])
        else:
            sent.answered(*args)
    (record,) = caplog.records
    return record


def test_an_answered_request_names_every_field(caplog):
    sent = SentRequest.start(
        "GET", "acct/data/a.bin", {"x-ms-range": "bytes=0-2097151"}, "c1d2-client"
    )
    record = _line(caplog, sent, 206, "srv-9", 2097152)
    message = record.getMessage()
    head, ms, rest = message.partition(" ms=")
    assert head == "GET acct/data/a.bin range=0-2097151 status=206"
    number, _, tail = rest.partition(" ")
    assert float(number) >= 0.0
    assert tail == "bytes=2097152 x-ms-client-request-id=c1d2-client x-ms-request-id=srv-9"
    assert record.levelno == logging.DEBUG


def test_a_request_without_an_answer_names_the_failure_and_no_server_id(caplog):
    sent = SentRequest.start("HEAD", "acct/data/a.bin", {}, "id-1")
    message = _line(caplog, sent, ConnectionResetError("peer")).getMessage()
    assert message.startswith("HEAD acct/data/a.bin status=- error=ConnectionResetError ms=")
    assert message.endswith(" x-ms-client-request-id=id-1 x-ms-request-id=-")
    assert "peer" not in message  # the exception's text is not ours to print


def test_request_lines_pass_the_redacting_formatters_unchanged(caplog):
    path = describe_url(f"{ACCOUNT_URL}/data/k.bin?{SIG}", ACCOUNT_URL, "acct")
    sent = SentRequest.start("GET", path, {"x-ms-range": "bytes=5-9"}, "id-2")
    record = _line(caplog, sent, 200, "srv", 5)
    message = record.getMessage()
    assert "sig" not in message
    assert "se=" not in message
    text = RedactingFormatter(FORMAT).format(record)
    assert text.endswith(message)  # nothing in it looked like a secret
    assert json.loads(JsonFormatter().format(record))["message"] == message


def test_nothing_is_logged_when_debug_is_off(caplog):
    with caplog.at_level(logging.INFO, logger=request_log.__name__):
        assert not request_log.enabled()
        SentRequest.start("GET", "p", {}, "id").answered(200, None, 0)
    assert caplog.records == []


# -- the flags ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        (["mount", "az://c/p", "/mnt"], None),
        (["mount", "-v", "az://c/p", "/mnt"], "INFO"),
        (["mount", "--verbose", "--debug", "az://c/p", "/mnt"], "DEBUG"),
        (["--debug", "mount", "az://c/p", "/mnt"], "DEBUG"),  # before the command
        (["-v", "mount", "--debug", "az://c/p", "/mnt"], "DEBUG"),
        (["--debug", "download", "az://c/p", "dest"], "DEBUG"),
        (["download", "-v", "az://c/p", "dest"], "INFO"),
        (["warm", "--debug", "/mnt"], "DEBUG"),
        (["-v", "stats", "/mnt"], "INFO"),
    ],
)
def test_flags_before_or_after_the_command_choose_the_level(argv, level):
    args = _parser().parse_args(argv)
    assert log_level(args) == level
    expected = {None: logging.WARNING, "INFO": logging.INFO, "DEBUG": logging.DEBUG}[level]
    assert early_level(args) == expected


@pytest.mark.parametrize(
    ("env_level", "argv", "effective", "source"),
    [
        ("ERROR", ["mount", "az://c/p", "/mnt"], "ERROR", "environment"),
        ("ERROR", ["mount", "-v", "az://c/p", "/mnt"], "INFO", "flag"),
        ("WARNING", ["--debug", "mount", "az://c/p", "/mnt"], "DEBUG", "flag"),
        ("DEBUG", ["mount", "-v", "az://c/p", "/mnt"], "INFO", "flag"),
        (None, ["mount", "az://c/p", "/mnt"], "INFO", "default"),
    ],
)
def test_the_flags_win_over_the_variable(env_level, argv, effective, source):
    env = {} if env_level is None else {"DATASET_MOUNT_LOG_LEVEL": env_level}
    settings = load_settings(env, **mount_cli.overrides(_parser().parse_args(argv)))
    assert settings.log_level == effective
    assert settings._sources["log_level"] == source
