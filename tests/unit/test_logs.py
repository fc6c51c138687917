"""Logging: the rate limit on repeated warnings, JSON lines, redaction in both formats."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from blobmount.logs import FORMAT, JsonFormatter, RateLimitFilter, RedactingFormatter, setup_logging

SAS = "sv=2023-11-03&se=2030-01-01&sr=c&sp=rl&sig=AbCdEfGhIjKlMnOpQrStUvWxYz0123456789%2Babc%3D"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CONNECTION_STRING = (
    f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={KEY};"
    "EndpointSuffix=core.windows.net"
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(
    msg: str = "block %d of %s failed",
    args: tuple[object, ...] = (3, "a.bin"),
    *,
    name: str = "blobmount.blocks",
    level: int = logging.WARNING,
) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


@pytest.fixture
def limiter() -> tuple[RateLimitFilter, list[logging.LogRecord], Clock]:
    emitted: list[logging.LogRecord] = []
    clock = Clock()
    return RateLimitFilter(emitted.append, burst=3, interval_s=60, clock=clock), emitted, clock


def test_first_burst_passes_then_repeats_are_dropped(limiter) -> None:
    f, emitted, _ = limiter
    passed = [f.filter(record(args=(i, "a.bin"))) for i in range(10)]
    # the template is the key: different arguments are still repeats
    assert passed == [True] * 3 + [False] * 7
    assert emitted == []


def test_one_summary_when_the_interval_is_over(limiter) -> None:
    f, emitted, clock = limiter
    for i in range(10):
        f.filter(record(args=(i, "a.bin")))
    clock.now += 59
    assert not f.filter(record())  # still the same interval
    assert emitted == []
    clock.now += 2
    assert f.filter(record())  # a new interval: this one is logged again...
    assert len(emitted) == 1  # ...after one summary of the last one
    summary = emitted[0]
    assert summary.levelno == logging.WARNING
    assert summary.name == "blobmount.blocks"
    assert summary.getMessage() == (
        "message repeated 8 more times in 60s (only the first 3 are logged): block %d of %s failed"
    )
    assert summary.repeated == 8  # type: ignore[attr-defined]
    # the summary itself passes the filter (the handler filters what `emit` is given)
    assert f.filter(summary)


def test_no_summary_when_nothing_was_dropped(limiter) -> None:
    f, emitted, clock = limiter
    for _ in range(3):
        f.filter(record())
    clock.now += 61
    f.filter(record())
    f.flush()
    assert emitted == []


def test_a_summary_goes_out_when_any_later_record_arrives(limiter) -> None:
    f, emitted, clock = limiter
    for _ in range(5):
        f.filter(record())
    clock.now += 120
    assert f.filter(record("something else entirely", ()))
    assert [r.repeated for r in emitted] == [2]  # type: ignore[attr-defined]


def test_flush_sends_pending_summaries(limiter) -> None:
    f, emitted, _ = limiter
    for _ in range(4):
        f.filter(record())
    for _ in range(6):
        f.filter(record("storage unavailable: %s", ("503",)))
    f.flush()
    assert sorted(r.repeated for r in emitted) == [1, 3]  # type: ignore[attr-defined]
    f.flush()
    assert len(emitted) == 2  # and forgets them


def test_logger_level_and_template_are_separate_keys(limiter) -> None:
    f, _, _ = limiter
    for _ in range(3):
        assert f.filter(record())
    assert not f.filter(record())
    assert f.filter(record(name="blobmount.fs"))
    assert f.filter(record(level=logging.ERROR))
    assert f.filter(record("another template %d", (1,)))


def test_info_and_debug_are_not_limited(limiter) -> None:
    f, _, _ = limiter
    assert all(f.filter(record(level=logging.INFO)) for _ in range(50))
    assert all(f.filter(record(level=logging.DEBUG)) for _ in range(50))


def test_counts_add_up_under_threads() -> None:
    emitted: list[logging.LogRecord] = []
    f = RateLimitFilter(emitted.append, burst=5, interval_s=3600)
    passed = []

    def work() -> None:
        passed.extend(f.filter(record()) for _ in range(1000))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    f.flush()
    assert sum(passed) == 5
    assert [r.repeated for r in emitted] == [8000 - 5]  # type: ignore[attr-defined]


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        RateLimitFilter(print, burst=0)
    with pytest.raises(ValueError):
        RateLimitFilter(print, interval_s=0)


# --- formats and redaction --------------------------------------------------------------


def secret_records() -> list[logging.LogRecord]:
    records = [
        record("opening %s", (f"https://acct.blob.core.windows.net/c?{SAS}",)),
        record("client from %s", (CONNECTION_STRING,)),
        record("request headers %s", ({"Authorization": f"SharedKey acct:{KEY}"},)),
    ]
    try:
        raise RuntimeError(f"failed with AccountKey={KEY};")
    except RuntimeError:
        import sys

        records.append(
            logging.LogRecord("x", logging.ERROR, __file__, 1, "boom", (), sys.exc_info())
        )
    return records


@pytest.mark.parametrize(
    "formatter", [RedactingFormatter(FORMAT), JsonFormatter()], ids=["text", "json"]
)
def test_secrets_are_redacted_in_both_formats(formatter: logging.Formatter) -> None:
    for rec in secret_records():
        line = formatter.format(rec)
        assert KEY not in line
        assert KEY[:20] not in line
        assert "AbCdEfGhIjKlMnOp" not in line
        assert "***" in line


def test_json_lines_have_the_documented_fields() -> None:
    rec = record("mounted %s at %s", ("az://c", "/mnt/data"), level=logging.INFO)
    entry = json.loads(JsonFormatter().format(rec))
    assert set(entry) == {"time", "level", "logger", "message"}
    assert entry["level"] == "INFO"
    assert entry["logger"] == "blobmount.blocks"
    assert entry["message"] == "mounted az://c at /mnt/data"
    assert entry["time"].endswith("Z")
    assert "T" in entry["time"]


def test_json_keeps_tracebacks_and_stays_one_line() -> None:
    rec = secret_records()[-1]
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    entry = json.loads(line)
    assert "RuntimeError: failed with AccountKey=***" in entry["exception"]


def test_json_survives_quotes_next_to_secrets() -> None:
    # Redacting after encoding would swallow the backslash of \" and break the line.
    rec = record('header "Authorization: Bearer abc" and "%s"', ('sig=xyz"q',))
    entry = json.loads(JsonFormatter().format(rec))
    assert "abc" not in entry["message"]
    assert "xyz" not in entry["message"]


# --- setup_logging ----------------------------------------------------------------------


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    yield root
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in saved[0]:
        root.addHandler(handler)
    root.setLevel(saved[1])


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_setup_logging_limits_repeats_and_redacts(
    root_logger: logging.Logger, tmp_path: Path, log_format: str
) -> None:
    log_file = tmp_path / "daemon.log"
    setup_logging("INFO", log_file=log_file, stderr=False, log_format=log_format)
    log = logging.getLogger("blobmount.test")
    for i in range(20):
        log.warning("range GET of block %d failed: %s", i, CONNECTION_STRING)
    log.info("not limited")
    (handler,) = root_logger.handlers
    for f in handler.filters:
        assert isinstance(f, RateLimitFilter)
        f.flush()
    handler.flush()
    lines = log_file.read_text().splitlines()
    assert len(lines) == 5 + 1 + 1  # the burst, the INFO line, one summary
    assert "repeated 15 more times" in lines[-1]
    assert KEY not in log_file.read_text()
    if log_format == "json":
        entries = [json.loads(line) for line in lines]
        assert entries[-1]["repeated"] == 15
        assert [e["level"] for e in entries] == ["WARNING"] * 5 + ["INFO", "WARNING"]
    else:
        assert " WARNING blobmount.test: range GET of block 0 failed" in lines[0]


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_name_that_is_not_unicode_is_logged_escaped(
    root_logger: logging.Logger, tmp_path: Path, log_format: str
) -> None:
    """A blob name with undecodable bytes holds lone surrogates; its line reaches the log file
    (escaped), instead of a "Logging error" traceback on stderr and no line."""
    log_file = tmp_path / "daemon.log"
    setup_logging("INFO", log_file=log_file, stderr=False, log_format=log_format)
    logging.getLogger("blobmount.test").warning("%s: refused", "data/bad\udcffname")
    (handler,) = root_logger.handlers
    handler.flush()
    assert "data/bad\\udcffname: refused" in log_file.read_text(encoding="utf-8")


def test_pending_summaries_are_written_at_exit(tmp_path: Path) -> None:
    log_file = tmp_path / "daemon.log"
    code = (
        "import logging, pathlib, sys\n"
        "from blobmount.logs import setup_logging\n"
        "setup_logging('INFO', log_file=pathlib.Path(sys.argv[1]), stderr=True)\n"
        "for i in range(12):\n"
        "    logging.getLogger('blobmount.x').warning('retrying block %d', i)\n"
    )
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", code, str(log_file)], capture_output=True, text=True, check=True
    )
    lines = log_file.read_text().splitlines()
    assert len(lines) == 6
    assert lines[-1].endswith(
        "message repeated 7 more times in 0s (only the first 5 are logged): retrying block %d"
    )
    # on stderr too, each handler formatting its own copy (so its own timestamp)
    assert done.stderr.splitlines()[-1].split(" WARNING ")[1] == lines[-1].split(" WARNING ")[1]
    assert "Logging error" not in done.stderr
