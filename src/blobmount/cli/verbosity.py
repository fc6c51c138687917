"""`-v/--verbose` and `--debug`: the log level chosen on the command line.

Precedence, highest first: `--debug` (DEBUG: also one line per storage request), `-v` (INFO),
DATASET_MOUNT_LOG_LEVEL, the default INFO. The flags go to `load_settings` as the `log_level`
override, so they win over the variable the way every flag does, reach a background daemon
through its environment (`launch.child_env`) and show as "flag" in `blobmount config`.

They can be given before the command (`blobmount --debug mount ...`) or after it (`blobmount
mount --debug ...`). A command's own copy has no default (argparse.SUPPRESS): a default there
would overwrite what was given before the command.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

DEBUG = "DEBUG"
INFO = "INFO"


def add_flags(parser: Any, *, command: bool) -> None:
    """Add -v/--verbose and --debug to `parser` (`command`: a command's own parser)."""
    default: Any = argparse.SUPPRESS if command else False
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default,
        help="log at INFO level (overrides DATASET_MOUNT_LOG_LEVEL)",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        default=default,
        help="log at DEBUG level, with one line per storage request: method, blob path, status, "
        "milliseconds and both request ids (overrides DATASET_MOUNT_LOG_LEVEL and -v)",
    )


def log_level(args: argparse.Namespace) -> str | None:
    """The level the flags ask for, or None to leave it to the settings."""
    if getattr(args, "debug", False):
        return DEBUG
    if getattr(args, "verbose", False):
        return INFO
    return None


def early_level(args: argparse.Namespace) -> int:
    """What the messages before a command's own logging show: warnings, or what was asked."""
    return {None: logging.WARNING, INFO: logging.INFO, DEBUG: logging.DEBUG}[log_level(args)]
