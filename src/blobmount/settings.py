"""Every tunable of blobmount, read from the Azure ML mount's environment variables.

The names, units and defaults follow the Azure ML data runtime (``DATASET_MOUNT_*``,
``DATASET_*``, ``RSLEX_*``, ``AZUREML_DATASET_*``); variables of our own also start with
``DATASET_MOUNT_``. Names are matched case-sensitively and exactly; an empty value counts as unset.
Sizes take binary KB/MB/GB suffixes (see `blobmount.units`). See docs/CONFIGURATION.md.

`load_settings` is the entry point: it reads the environment (or a given mapping), applies
command-line overrides, and turns every bad value into one `ConfigError` naming each variable,
its value and what is allowed. Components never see `Settings`: the composition layer
(`blobmount.compose`) copies what each needs into its own small config. Importing this module
must not import pyfuse3 or the Azure SDK.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, GetCoreSchemaHandler, PrivateAttr, ValidationError, model_validator
from pydantic_core import PydanticCustomError, core_schema
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from blobmount.cpu_limit import usable_cpus
from blobmount.datastores import DATASTORES_FILE_VAR
from blobmount.errors import ConfigError
from blobmount.logs import redact
from blobmount.units import KiB, MiB, format_size, parse_bool, parse_size

__all__ = [
    "ENV_VARS",
    "Settings",
    "describe",
    "describe_json",
    "load_settings",
    "split_host_port",
    "unknown_variables",
]

log = logging.getLogger(__name__)

# The environment `load_settings` was given; None means os.environ. A ContextVar because
# pydantic-settings builds its sources inside the model constructor, where no argument reaches.
_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar(
    "blobmount_settings_environ", default=None
)


def _environ() -> Mapping[str, str]:
    env = _ENVIRON.get()
    return os.environ if env is None else env


def _env_value(env: Mapping[str, str], name: str) -> str | None:
    """The value of `name`, or None when unset or blank (a blank value counts as unset)."""
    value = env.get(name)
    if value is None or not value.strip():
        return None
    return value


def _cpu_count() -> int:
    return os.cpu_count() or 1


def _default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/blobmount, else $HOME/.cache/blobmount (both from the environment read)."""
    env = _environ()
    xdg = _env_value(env, "XDG_CACHE_HOME")
    if xdg is not None and Path(xdg).is_absolute():  # XDG says to ignore a relative value
        return Path(xdg) / "blobmount"
    home = _env_value(env, "HOME")
    return (Path(home) if home is not None else Path.home()) / ".cache" / "blobmount"


# ---------------------------------------------------------------------------------------------
# Rules: each parses one kind of value (text from the environment, or a Python value from a flag),
# checks its range, says in words what it allows, and formats a value back for `describe`.


class _Rule:
    """A before-validator that also knows its human description. Used as Annotated metadata."""

    allowed: str = ""

    def parse(self, value: object) -> Any:
        raise NotImplementedError

    def format(self, value: Any) -> str:
        return str(value)

    def __call__(self, value: object) -> Any:
        return self.parse(value)

    def __get_pydantic_core_schema__(
        self, source_type: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_before_validator_function(self, handler(source_type))


def _reject_bool(value: object) -> None:
    # bool is an int subclass; True as a thread count is a caller bug, not 1.
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")


def _range_text(low: str | None, high: str | None) -> str:
    if low is not None and high is not None:
        return f"between {low} and {high}"
    if low is not None:
        return f"{low} or more"
    return ""


class _Size(_Rule):
    def __init__(
        self,
        *,
        example: str,
        minimum: int | None = 0,
        maximum: int | None = None,
        note: str = "",
    ) -> None:
        self.minimum = minimum
        self.maximum = maximum
        low = None if minimum is None else format_size(minimum)
        high = None if maximum is None else format_size(maximum)
        rng = _range_text(low, high)
        self.allowed = "a size in bytes with an optional KB/MB/GB suffix"
        self.allowed += f" {rng}" if rng else ""
        self.allowed += f"{note} (e.g. {example})"

    def parse(self, value: object) -> int:
        _reject_bool(value)
        if isinstance(value, str):
            size = parse_size(value, allow_negative=self.minimum is None or self.minimum < 0)
        elif isinstance(value, int):
            size = value
        else:
            raise ValueError("not a size")
        if self.minimum is not None and size < self.minimum:
            raise ValueError("too small")
        if self.maximum is not None and size > self.maximum:
            raise ValueError("too large")
        return size

    def format(self, value: Any) -> str:
        text = format_size(value)
        # format_size rounds odd sizes to two decimals; show the exact count too.
        if parse_size(text, allow_negative=True) != value:
            text += f" ({value} bytes)"
        return text


class _CacheSize(_Size):
    """A size where a negative value means "leave this much of the disk free"."""

    def format(self, value: Any) -> str:
        if value < 0:
            return f"{super().format(value)} (leave {super().format(-value)} of the disk free)"
        return super().format(value)


class _Int(_Rule):
    def __init__(self, minimum: int, maximum: int | None, *, what: str, unit: str = "") -> None:
        self.minimum = minimum
        self.maximum = maximum
        self.unit = unit
        rng = _range_text(str(minimum), None if maximum is None else str(maximum))
        self.allowed = f"{what} {rng}"

    def parse(self, value: object) -> int:
        _reject_bool(value)
        if isinstance(value, str):
            if not re.fullmatch(r"\s*[+-]?\d+\s*", value):
                raise ValueError("not a whole number")
            number = int(value)
        elif isinstance(value, int):
            number = value
        else:
            raise ValueError("not a whole number")
        if number < self.minimum or (self.maximum is not None and number > self.maximum):
            raise ValueError("out of range")
        return number

    def format(self, value: Any) -> str:
        return f"{value}{self.unit}"


class _Processes(_Int):
    """A number of processes, or "auto": the CPUs this process may use (`cpu_limit`), at most
    `maximum`."""

    def __init__(self, maximum: int) -> None:
        super().__init__(1, maximum, what="a number of processes")
        self.allowed += ', or "auto" (the CPUs this process may use)'

    def parse(self, value: object) -> int:
        if isinstance(value, str) and value.strip().lower() == "auto":
            assert self.maximum is not None
            return min(usable_cpus(), self.maximum)
        return super().parse(value)


class _Float(_Rule):
    def __init__(
        self,
        *,
        what: str,
        above: float | None = None,
        at_least: float | None = None,
        below: float | None = None,
        at_most: float | None = None,
        unit: str = "",
    ) -> None:
        self.above, self.at_least, self.below, self.at_most = above, at_least, below, at_most
        self.unit = unit
        parts = []
        if above is not None:
            parts.append(f"greater than {above:g}")
        if at_least is not None:
            parts.append(f"at least {at_least:g}")
        if below is not None:
            parts.append(f"less than {below:g}")
        if at_most is not None:
            parts.append(f"at most {at_most:g}")
        self.allowed = f"{what} " + " and ".join(parts)

    def parse(self, value: object) -> float:
        _reject_bool(value)
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                raise ValueError("not a number") from None
        elif isinstance(value, int | float):
            number = float(value)
        else:
            raise ValueError("not a number")
        if not math.isfinite(number):
            raise ValueError("not finite")
        if (
            (self.above is not None and not number > self.above)
            or (self.at_least is not None and not number >= self.at_least)
            or (self.below is not None and not number < self.below)
            or (self.at_most is not None and not number <= self.at_most)
        ):
            raise ValueError("out of range")
        return number

    def format(self, value: Any) -> str:
        return f"{value:g}{self.unit}"


class _Bool(_Rule):
    allowed = "true/false, 1/0, yes/no or on/off"

    def parse(self, value: object) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            return parse_bool(value)
        raise ValueError("not a boolean")

    def format(self, value: Any) -> str:
        return "true" if value else "false"


class _Mode(_Rule):
    """Permission bits as octal text ("0444", "444", "0o444"); write bits are refused."""

    def __init__(self, example: str) -> None:
        self.allowed = (
            "octal permission bits from 0 to 0777 without write bits, since the mount is "
            f"read-only (e.g. {example})"
        )

    def parse(self, value: object) -> int:
        _reject_bool(value)
        if isinstance(value, str):
            match = re.fullmatch(r"\s*(?:0o)?([0-7]{1,4})\s*", value, re.IGNORECASE)
            if match is None:
                raise ValueError("not octal")
            mode = int(match[1], 8)
        elif isinstance(value, int):
            mode = value
        else:
            raise ValueError("not a mode")
        if not 0 <= mode <= 0o777:
            raise ValueError("not permission bits")
        if mode & 0o222:
            raise ValueError("write bits on a read-only mount")
        return mode

    def format(self, value: Any) -> str:
        return f"{value:04o}"


class _Path(_Rule):
    allowed = "a file system path"

    def parse(self, value: object) -> Path:
        if not isinstance(value, str | os.PathLike):
            raise ValueError("not a path")
        text = os.fspath(value)
        if not isinstance(text, str) or not text.strip() or "\0" in text:
            raise ValueError("not a path")
        # Absolute now: the daemon may change directory after it starts.
        return Path(text).expanduser().absolute()


class _LogLevel(_Rule):
    _LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
    allowed = "one of DEBUG, INFO, WARNING, ERROR (any case)"

    def parse(self, value: object) -> str:
        if not isinstance(value, str):
            raise ValueError("not a level name")
        level = value.strip().upper()
        if level == "WARN":
            level = "WARNING"
        if level not in self._LEVELS:
            raise ValueError("unknown level")
        return level


class _Choice(_Rule):
    """One of a few lower-case words."""

    def __init__(self, *choices: str) -> None:
        self.choices = choices
        self.allowed = "one of " + ", ".join(choices)

    def parse(self, value: object) -> str:
        if not isinstance(value, str) or value.strip().lower() not in self.choices:
            raise ValueError("not one of the choices")
        return value.strip().lower()


class _ListenAddress(_Rule):
    """A TCP address to listen on: "host:port", an IPv6 host in brackets ("[::1]:9464")."""

    allowed = "host:port with a port from 1 to 65535 (e.g. 127.0.0.1:9464 or [::1]:9464)"

    def parse(self, value: object) -> str:
        if not isinstance(value, str):
            raise ValueError("not an address")
        text = value.strip()
        split_host_port(text)
        return text


def split_host_port(text: str) -> tuple[str, int]:
    """("host", port) of a "host:port" listen address; brackets are taken off an IPv6 host.

    Raises:
        ValueError: not host:port, or the port is not 1 to 65535.
    """
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not re.fullmatch(r"[0-9A-Fa-f:.]+", host) or ":" not in host:
            raise ValueError("not an IPv6 address")
    elif not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]*", host):
        raise ValueError("not a host name or IPv4 address")
    if not sep or not re.fullmatch(r"\d{1,5}", port) or not 1 <= int(port) <= 65535:
        raise ValueError("not a port")
    return host, int(port)


class _SnapshotRef(_Rule):
    """Where a dataset snapshot is: a blob URI (kept as given) or a local path (made absolute)."""

    allowed = "a snapshot file's path, or its blob URI in any source form (az://, https://, ...)"

    def parse(self, value: object) -> str:
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str) or not value.strip() or "\0" in value:
            raise ValueError("not a path or URI")
        text = value.strip()
        if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", text):
            return text
        # absolute now: the daemon may change directory after it starts
        return str(Path(text).expanduser().absolute())

    def format(self, value: Any) -> str:
        return redact(str(value))  # a blob URI may carry a SAS


class _Optional(_Rule):
    """Wraps a rule for a field whose default None has a meaning (`none_text`)."""

    def __init__(self, rule: _Rule, none_text: str) -> None:
        self.rule = rule
        self.none_text = none_text
        self.allowed = rule.allowed

    def parse(self, value: object) -> Any:
        return None if value is None else self.rule.parse(value)

    def format(self, value: Any) -> str:
        return self.none_text if value is None else self.rule.format(value)


_UID = _Int(0, 2**32 - 2, what="a numeric id")  # 2**32-1 is (uid_t)-1, "no change"


def _env(name: str, default: Any = None, *, factory: Callable[[], Any] | None = None) -> Any:
    """A field read from environment variable `name`."""
    if factory is not None:
        return Field(default_factory=factory, validation_alias=name)
    return Field(default, validation_alias=name)


# ---------------------------------------------------------------------------------------------


class _MappingEnvSource(EnvSettingsSource):
    """The environment source, reading `load_settings`'s mapping instead of always os.environ."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ_map = environ
        super().__init__(settings_cls, case_sensitive=True)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {
            name: value
            for name in self._environ_map
            if (value := _env_value(self._environ_map, name)) is not None
        }


class Settings(BaseSettings):
    """Effective settings. Build with `load_settings`; field docs are in docs/CONFIGURATION.md."""

    model_config = SettingsConfigDict(
        frozen=True,
        case_sensitive=True,
        extra="ignore",
        validate_by_name=True,
        validate_by_alias=True,
    )

    # --- the Azure ML mount's variables
    attribute_cache_ttl_ms: Annotated[
        int | None,
        _Optional(
            _Int(0, None, what="a whole number of milliseconds", unit=" ms"), "never expires"
        ),
    ] = _env("DATASET_MOUNT_ATTRIBUTE_CACHE_TTL")
    reserved_free_disk_space: Annotated[int, _Size(example="150MB")] = _env(
        "DATASET_RESERVED_FREE_DISK_SPACE", 150 * MiB
    )
    cache_size: Annotated[
        int | None,
        _Optional(
            _CacheSize(
                example="20GB or -5GB",
                minimum=None,
                note="; negative means leave that much of the disk free",
            ),
            "unlimited",
        ),
    ] = _env("DATASET_MOUNT_CACHE_SIZE")
    file_cache_prune_threshold: Annotated[
        float, _Float(what="a fraction", above=0.0, at_most=1.0)
    ] = _env("DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD", 1.0)
    file_cache_prune_target: Annotated[
        float, _Float(what="a fraction", at_least=0.0, below=1.0)
    ] = _env("DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET", 0.7)
    read_block_size: Annotated[int, _Size(example="2MB", minimum=64 * KiB, maximum=256 * MiB)] = (
        _env("DATASET_MOUNT_READ_BLOCK_SIZE", 2 * MiB)
    )
    read_buffer_block_count: Annotated[int, _Int(0, 4096, what="a number of blocks")] = _env(
        "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT", 32
    )
    read_threads: Annotated[int, _Int(1, 1024, what="a number of threads")] = _env(
        "DATASET_MOUNT_READ_THREADS", factory=lambda: min(4 * _cpu_count(), 1024)
    )
    block_based_cache_enabled: Annotated[bool, _Bool()] = _env(
        "DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED", True
    )
    memory_cache_size: Annotated[int, _Size(example="128MB")] = _env(
        "DATASET_MOUNT_MEMORY_CACHE_SIZE", 128 * MiB
    )
    block_file_cache_enabled: Annotated[bool, _Bool()] = _env(
        "DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED", True
    )
    block_file_cache_max_queue_size: Annotated[int, _Size(example="512MB")] = _env(
        "DATASET_MOUNT_BLOCK_FILE_CACHE_MAX_QUEUE_SIZE", 512 * MiB
    )
    block_file_cache_write_threads: Annotated[int, _Int(1, 256, what="a number of threads")] = _env(
        "DATASET_MOUNT_BLOCK_FILE_CACHE_WRITE_THREADS", factory=lambda: min(2 * _cpu_count(), 256)
    )
    unmount_timeout_s: Annotated[int, _Int(0, 86400, what="a number of seconds", unit=" s")] = _env(
        "DATASET_UNMOUNT_TIMEOUT_SECONDS", 30
    )
    http_retry_count: Annotated[int, _Int(0, 100, what="a number of retries")] = _env(
        "AZUREML_DATASET_HTTP_RETRY_COUNT", 7
    )
    downloader_threads: Annotated[int, _Int(1, 1024, what="a number of threads")] = _env(
        "RSLEX_DOWNLOADER_THREADS", factory=lambda: min(4 * _cpu_count(), 1024)
    )
    cache_dir: Annotated[Path, _Path()] = _env(
        "DATASET_MOUNT_CACHE_DIR", factory=_default_cache_dir
    )

    # --- our own
    read_ahead_memory_limit: Annotated[int | None, _Optional(_Size(example="1GB"), "auto")] = _env(
        "DATASET_MOUNT_READ_AHEAD_MEMORY_LIMIT"
    )
    connect_timeout_s: Annotated[
        float, _Float(what="a number of seconds", above=0.0, unit=" s")
    ] = _env("DATASET_MOUNT_CONNECT_TIMEOUT_SECONDS", 10.0)
    read_timeout_s: Annotated[float, _Float(what="a number of seconds", above=0.0, unit=" s")] = (
        _env("DATASET_MOUNT_READ_TIMEOUT_SECONDS", 30.0)
    )
    allow_other: Annotated[bool, _Bool()] = _env("DATASET_MOUNT_ALLOW_OTHER", False)
    uid: Annotated[int | None, _Optional(_UID, "the mounting user")] = _env("DATASET_MOUNT_UID")
    gid: Annotated[int | None, _Optional(_UID, "the mounting user's group")] = _env(
        "DATASET_MOUNT_GID"
    )
    file_mode: Annotated[int, _Mode("0444")] = _env("DATASET_MOUNT_FILE_MODE", 0o444)
    dir_mode: Annotated[int, _Mode("0555")] = _env("DATASET_MOUNT_DIR_MODE", 0o555)
    log_file: Annotated[Path | None, _Optional(_Path(), "default (chosen by the CLI)")] = _env(
        "DATASET_MOUNT_LOG_FILE"
    )
    log_level: Annotated[str, _LogLevel()] = _env("DATASET_MOUNT_LOG_LEVEL", "INFO")
    anonymous: Annotated[bool, _Bool()] = _env("DATASET_MOUNT_ANONYMOUS", False)
    listing_mode: Annotated[str, _Choice("auto", "hierarchical", "flat")] = _env(
        "DATASET_MOUNT_LISTING_MODE", "auto"
    )
    log_format: Annotated[str, _Choice("text", "json")] = _env("DATASET_MOUNT_LOG_FORMAT", "text")
    metrics_addr: Annotated[str | None, _Optional(_ListenAddress(), "off")] = _env(
        "DATASET_MOUNT_METRICS_ADDR"
    )
    hint_memory_limit: Annotated[int, _Size(example="256MB")] = _env(
        "DATASET_MOUNT_HINT_MEMORY_LIMIT", 256 * MiB
    )
    hint_window_files: Annotated[int, _Int(1, 1_000_000, what="a number of files")] = _env(
        "DATASET_MOUNT_HINT_WINDOW", 512
    )
    hint_threads: Annotated[int, _Int(1, 1024, what="a number of requests")] = _env(
        "DATASET_MOUNT_HINT_THREADS", 32
    )
    kernel_read_ahead: Annotated[int, _Size(example="1MB", maximum=64 * MiB)] = _env(
        "DATASET_MOUNT_KERNEL_READ_AHEAD", 1 * MiB
    )
    kernel_max_background: Annotated[int, _Int(0, 65535, what="a number of requests")] = _env(
        "DATASET_MOUNT_KERNEL_MAX_BACKGROUND", 64
    )
    flow_control: Annotated[bool, _Bool()] = _env("DATASET_MOUNT_FLOW_CONTROL", True)
    breaker_seconds: Annotated[
        float, _Float(what="a number of seconds", at_least=0.0, unit=" s")
    ] = _env("DATASET_MOUNT_BREAKER_SECONDS", 5.0)
    snapshot: Annotated[str | None, _Optional(_SnapshotRef(), "none (list the source)")] = _env(
        "DATASET_MOUNT_SNAPSHOT"
    )
    worker_processes: Annotated[int, _Processes(16)] = _env("DATASET_MOUNT_WORKER_PROCESSES", 1)

    # Where each field's value came from: "default", "environment" or "flag" (set by load_settings).
    _sources: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _check_prune_order(self) -> Settings:
        if self.file_cache_prune_target > self.file_cache_prune_threshold:
            raise PydanticCustomError(
                "prune_order",
                "DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET={target} is above "
                "DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD={threshold}: pruning starts at the "
                "threshold and stops at the target, so the target must not be above it",
                {
                    "target": f"{self.file_cache_prune_target:g}",
                    "threshold": f"{self.file_cache_prune_threshold:g}",
                },
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags first, then the environment; no .env or secrets files (nothing implicit).
        return init_settings, _MappingEnvSource(settings_cls, _environ())


def _env_name(field: str) -> str:
    alias = Settings.model_fields[field].validation_alias
    assert isinstance(alias, str)
    return alias


#: field name → environment variable name, in declaration order
ENV_VARS: dict[str, str] = {field: _env_name(field) for field in Settings.model_fields}

_FIELD_BY_KEY: dict[str, str] = {
    **{env: f for f, env in ENV_VARS.items()},
    **{f: f for f in ENV_VARS},
}


def _rule(field: str) -> _Rule:
    for item in Settings.model_fields[field].metadata:
        if isinstance(item, _Rule):
            return item
    raise AssertionError(f"settings field {field} has no rule")


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _problems(exc: ValidationError, flags: set[str]) -> list[str]:
    """One line per bad variable, in declaration order, then cross-field problems."""
    per_field: dict[str, str] = {}
    general: list[str] = []
    for error in exc.errors():
        loc = error["loc"]
        field = _FIELD_BY_KEY.get(str(loc[0])) if loc else None
        if field is None:
            general.append(error["msg"])
            continue
        if field in per_field:
            continue
        origin = " (from a command-line flag)" if field in flags else ""
        per_field[field] = (
            f"{ENV_VARS[field]}={_show(error['input'])}{origin} is not valid: "
            f"expected {_rule(field).allowed}"
        )
    return [per_field[f] for f in ENV_VARS if f in per_field] + general


def load_settings(env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Read the settings from `env` (default: os.environ), with `overrides` winning over it.

    `overrides` are field values from command-line flags, as Python values (``4 * MiB``) or text
    (``"4MB"``). An override of None means "flag not given" and is ignored, so a CLI can pass its
    parsed arguments straight through.

    Raises:
        ConfigError: one or more values are bad; one line per variable, naming it, the value
            given and what is allowed.
        TypeError: an override names no setting (a programming error).
    """
    unknown = sorted(set(overrides) - set(ENV_VARS))
    if unknown:
        raise TypeError(f"load_settings() got unknown setting(s): {', '.join(unknown)}")
    flags = {name: value for name, value in overrides.items() if value is not None}
    environ = os.environ if env is None else env
    _warn_unknown(environ)

    token = _ENVIRON.set(environ)
    try:
        settings = Settings(**flags)
    except ValidationError as exc:
        raise ConfigError("\n".join(_problems(exc, set(flags)))) from None
    except SettingsError as exc:  # the environment source itself failed
        raise ConfigError(f"cannot read settings from the environment: {exc}") from None
    finally:
        _ENVIRON.reset(token)

    sources = {}
    for field, name in ENV_VARS.items():
        if field in flags:
            sources[field] = "flag"
        elif _env_value(environ, name) is not None:
            sources[field] = "environment"
        else:
            sources[field] = "default"
    settings._sources = sources
    return settings


def describe(settings: Settings) -> list[tuple[str, str, str]]:
    """(variable, effective value for people, source) for every setting, for `blobmount config`.

    Source is "default", "environment" or "flag". For a `Settings` not built by `load_settings`
    the source is a best guess: "environment" for explicitly set fields, else "default".
    """
    rows = []
    for field, name in ENV_VARS.items():
        source = settings._sources.get(field)
        if source is None:
            source = "environment" if field in settings.model_fields_set else "default"
        rows.append((name, _rule(field).format(getattr(settings, field)), source))
    return rows


# ---------------------------------------------------------------------------------------------
# Variables with our prefix that we do not read: most likely a typo, which would otherwise be
# ignored without a word.

#: the prefix of blobmount's own variables
OWN_PREFIX = "DATASET_MOUNT_"
#: variables with that prefix read outside `Settings`
_READ_ELSEWHERE = (DATASTORES_FILE_VAR,)
#: names already warned about in this process (load_settings runs more than once per command)
_warned: set[str] = set()


def known_variables() -> frozenset[str]:
    """Every variable blobmount reads for its settings."""
    return frozenset(ENV_VARS.values()) | frozenset(_READ_ELSEWHERE)


def unknown_variables(env: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """(name, the closest known name or None) for each DATASET_MOUNT_* variable in `env`
    that blobmount does not read, sorted by name."""
    known = known_variables()
    # compared without their prefixes, which every name shares and would make any two alike
    by_stem = {_stem(name): name for name in sorted(known)}
    out = []
    for name in sorted(env):
        if name.startswith(OWN_PREFIX) and name not in known:
            close = difflib.get_close_matches(_stem(name), list(by_stem), n=1, cutoff=0.75)
            out.append((name, by_stem[close[0]] if close else None))
    return out


def _stem(name: str) -> str:
    for prefix in ("AZUREML_DATASET_", OWN_PREFIX, "DATASET_", "RSLEX_"):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _warn_unknown(env: Mapping[str, str]) -> None:
    for name, close in unknown_variables(env):
        if name in _warned:
            continue
        _warned.add(name)
        hint = f"; did you mean {close}?" if close else ""
        log.warning("%s is not a blobmount setting and is ignored%s", name, hint)


# ---------------------------------------------------------------------------------------------
# `blobmount config --json`

#: parts of a variable's name that mark its value as a secret
_SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|SAS|CONNECTION_STRING|CREDENTIAL")
MASK = "***"


def _json_value(name: str, value: object) -> object:
    """A setting's value as JSON: numbers, booleans and None as they are, paths and the rest as
    text; a secret's masked (by its name), and any text through the log redaction."""
    if value is None or isinstance(value, bool | int | float):
        return MASK if value is not None and _SECRET_NAME.search(name) else value
    if _SECRET_NAME.search(name):
        return MASK
    return redact(str(value))


def describe_json(settings: Settings, env: Mapping[str, str] | None = None) -> str:
    """The effective settings as a JSON object, for `blobmount config --json`.

    ``settings``: each variable's ``value`` (bytes, seconds, etc. as numbers; paths as text;
    null where the default has a meaning of its own), ``text`` (as `blobmount config` shows it)
    and ``source``. ``credentials``: the credential variables set in `env` (default:
    os.environ), each masked, so a script can see which one will be used without seeing it.
    ``unknown``: the DATASET_MOUNT_* variables blobmount ignores.
    """
    environ = os.environ if env is None else env
    rows = {name: (text, source) for name, text, source in describe(settings)}
    out: dict[str, object] = {}
    for field, name in ENV_VARS.items():
        text, source = rows[name]
        masked = _SECRET_NAME.search(name) is not None
        out[name] = {
            "value": _json_value(name, getattr(settings, field)),
            "text": MASK if masked else redact(text),
            "source": source,
        }
    credentials = {
        name: MASK
        for name in sorted(environ)
        if name.startswith("AZURE_") and _SECRET_NAME.search(name) and environ[name].strip()
    }
    unknown = [name for name, _ in unknown_variables(environ)]
    return json.dumps({"settings": out, "credentials": credentials, "unknown": unknown}, indent=2)
