"""Logging setup: one format, secret redaction on every handler, quiet third-party loggers.

Named logs.py (not logging.py) so it never shadows the standard library.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

# Values that must never reach a log line, whatever the code that logged them did.
_SECRET_PATTERNS = (
    re.compile(r"(?i)(sig=)[^&\s'\"]+"),
    re.compile(r"(?i)(AccountKey=)[^;\s'\"]+"),
    re.compile(r"(?i)(SharedAccessSignature=)[^;\s'\"]+"),
    re.compile(r"(?i)(Authorization['\"]?\s*[:=]\s*['\"]?)[^'\"\n]+"),
    re.compile(r"(?i)(client_secret=)[^&\s'\"]+"),
)


def redact(text: str) -> str:
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(r"\1***", text)
    return text


class RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def setup_logging(
    level: str = "INFO", *, log_file: Path | None = None, stderr: bool = True
) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handlers: list[logging.Handler] = []
    if stderr:
        handlers.append(logging.StreamHandler(sys.stderr))
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
    for handler in handlers:
        handler.setFormatter(RedactingFormatter(FORMAT))
        root.addHandler(handler)
    root.setLevel(level)
    # The Azure SDK logs every request at INFO (URLs included); keep it to real problems.
    for noisy in ("azure", "azure.core.pipeline.policies.http_logging_policy", "aiohttp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
