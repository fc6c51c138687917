"""The typed stats snapshot of a live mount: what `blobmount stats`, the metrics endpoint, warm and
the Python API read, by attribute.

`MountSnapshot` holds the components' own `statistics()` dataclasses. Its JSON (`to_json`) is the
stats socket's wire form, unversioned and unchanged: the field order and names of these
dataclasses are the keys. `from_json` rebuilds a snapshot from that form and is strict where
silence would mislead: a missing figure or one of the wrong type raises `SnapshotFormatError`
naming its key (a reader must never see a made-up zero). Keys it does not know are ignored, so a
newer daemon may add figures without breaking an older reader; a missing `disk` or `whole_file`
section reads as off (None), as the daemon itself sends when the tier is not in use.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from blobmount.blocks.disk_tier import DiskTierStats
from blobmount.blocks.manager import BlockManagerStats
from blobmount.errors import BlobmountError
from blobmount.fs.filesystem import NamespaceStats
from blobmount.hints.coordinator import HintStats
from blobmount.process_figures import ProcessFigures
from blobmount.storage.counting import StorageStats
from blobmount.storage.flow import FlowStats
from blobmount.storage.retry import RetryStatistics
from blobmount.wholefile.cache import WholeFileStats

log = logging.getLogger(__name__)

#: sections a daemon leaves out (or sends as null) when the part is not in use
OPTIONAL_SECTIONS = ("disk", "whole_file")
#: lists an older daemon does not send: read as empty
OPTIONAL_LISTS = ("processes",)


class SnapshotFormatError(BlobmountError):
    """A stats snapshot lacks a figure, or has one of the wrong type (a different version of
    blobmount answered)."""


@dataclass(frozen=True, slots=True)
class MountSnapshot:
    """One moment of a live mount: its identity, a few gauges, and each component's statistics.

    The field order is the JSON's key order; keep it when adding a field."""

    source: str  # the source's display form: never a secret
    mountpoint: str
    pid: int
    uptime_s: float
    throughput_bytes_per_s: float  # served to readers, over the last few seconds
    open_files: int
    inodes: int
    namespace: NamespaceStats
    storage: StorageStats
    retry: RetryStatistics
    blocks: BlockManagerStats
    disk: DiskTierStats | None  # None: the disk tier is off
    hints: HintStats
    whole_file: WholeFileStats | None  # None: block mode
    flow: FlowStats  # the storage account's flow controller and circuit breaker
    #: each live process of the mount (one, unless DATASET_MOUNT_WORKER_PROCESSES is above 1)
    processes: tuple[ProcessFigures, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The stats socket's JSON: nested plain values, keys in field order."""
        data = dataclasses.asdict(self)
        data["processes"] = list(data["processes"])  # as JSON gives it back
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MountSnapshot:
        """Rebuild a snapshot from `to_json`'s form (see the module docstring for what is
        tolerated).

        Raises:
            SnapshotFormatError: a figure is missing or has the wrong type; names its key.
        """
        data = {
            **{name: None for name in OPTIONAL_SECTIONS if name not in data},
            **{name: [] for name in OPTIONAL_LISTS if name not in data},
            **data,
        }
        snapshot = _build(cls, data, "")
        assert isinstance(snapshot, cls)
        return snapshot


def _build(cls: type, data: object, path: str) -> object:
    """An instance of the dataclass `cls` from the mapping at `path` (dotted, for messages)."""
    if not isinstance(data, Mapping):
        raise SnapshotFormatError(_wrong(path or "snapshot", "an object", data))
    values = {}
    for name, hint in _fields(cls):
        key = f"{path}.{name}" if path else name
        if name not in data:
            raise SnapshotFormatError(
                f"the mount's stats lack {key!r} (is the daemon a different blobmount version?)"
            )
        values[name] = _value(hint, data[name], key)
    return cls(**values)


def _value(hint: Any, value: object, key: str) -> object:
    if typing.get_origin(hint) in (types.UnionType, typing.Union):  # `X | None`, the only kind
        if value is None:
            return None
        (hint,) = (arg for arg in typing.get_args(hint) if arg is not type(None))
    if dataclasses.is_dataclass(hint):
        assert isinstance(hint, type)
        return _build(hint, value, key)
    if typing.get_origin(hint) is tuple:  # `tuple[Section, ...]`: one section per item
        (item, _) = typing.get_args(hint)
        if not isinstance(value, list | tuple):
            raise SnapshotFormatError(_wrong(key, "a list", value))
        return tuple(_value(item, one, f"{key}[{i}]") for i, one in enumerate(value))
    if typing.get_origin(hint) is dict:  # counts by name, e.g. storage errors by kind
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and _is_int(v) for k, v in value.items()
        ):
            raise SnapshotFormatError(_wrong(key, "an object of counts", value))
        return dict(value)
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)  # a float figure may be sent as a whole number (a 0 never added to)
    if hint is int and _is_int(value):
        return value
    if hint in (str, bool) and isinstance(value, hint):
        return value
    raise SnapshotFormatError(_wrong(key, getattr(hint, "__name__", str(hint)), value))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _wrong(key: str, expected: str, value: object) -> str:
    return f"the mount's stats have {key!r} = {value!r}, expected {expected}"


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Any], ...]:
    # resolved once per class: the stats modules use `from __future__ import annotations`
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))


# -- taking a snapshot of the live components -----------------------------------------------------

T_co = TypeVar("T_co", covariant=True)


class Reports(Protocol[T_co]):
    """A component that reports through `statistics()`."""

    def statistics(self) -> T_co: ...


@dataclass(frozen=True, slots=True)
class LiveMount:
    """The running parts of a mount, and how to take their snapshot (on the trio thread: the
    components' `statistics()` read state only that thread may touch)."""

    source: str
    mountpoint: str
    pid: int
    started: float  # time.monotonic() when the mount started
    throughput: Callable[[], float]  # bytes served per second, recently
    fs: Reports[NamespaceStats]
    storage: Reports[StorageStats]
    retry: Reports[RetryStatistics]
    blocks: Reports[BlockManagerStats]
    #: `blocks.fetcher.DiskTier` says only `object`: the stats are checked to be DiskTierStats
    disk: Reports[object] | None
    hints: Reports[HintStats]
    whole_file: Reports[WholeFileStats] | None
    flow: Reports[FlowStats]
    #: this process's own figures
    process: Callable[[], ProcessFigures]

    def snapshot(self) -> MountSnapshot:
        namespace = self.fs.statistics()
        return MountSnapshot(
            source=self.source,
            mountpoint=self.mountpoint,
            pid=self.pid,
            uptime_s=time.monotonic() - self.started,
            throughput_bytes_per_s=self.throughput(),
            open_files=namespace.open_files,
            inodes=namespace.inodes,
            namespace=namespace,
            storage=self.storage.statistics(),
            retry=self.retry.statistics(),
            blocks=self.blocks.statistics(),
            disk=None if self.disk is None else _disk_stats(self.disk.statistics()),
            hints=self.hints.statistics(),
            whole_file=None if self.whole_file is None else self.whole_file.statistics(),
            flow=self.flow.statistics(),
            processes=(self.process(),),
        )


def _disk_stats(stats: object) -> DiskTierStats:
    if not isinstance(stats, DiskTierStats):
        raise TypeError(f"the disk tier reported {type(stats).__name__}, not DiskTierStats")
    return stats
