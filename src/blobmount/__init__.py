"""blobmount: a read-only FUSE mount of Azure Blob Storage for training jobs.

The Python API (see `blobmount.api` and the README)::

    import blobmount

    with blobmount.mount("az://datasets/imagenet", read_buffer_block_count=80) as data:
        ...
    blobmount.download("az://datasets/mnist", "/tmp/mnist")

Importing the package must stay cheap and must not import pyfuse3 or the Azure SDK, so the
Python API and the CLI's argument parsing work on machines without FUSE: the API functions are
loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blobmount._version import __version__

__all__ = [
    "__version__",
    "create_snapshot",
    "diff_snapshots",
    "download",
    "mount",
    "mount_stats",
    "snapshot_info",
    "unmount",
]

if TYPE_CHECKING:
    from blobmount.api import create_snapshot as create_snapshot
    from blobmount.api import diff_snapshots as diff_snapshots
    from blobmount.api import download as download
    from blobmount.api import mount as mount
    from blobmount.api import mount_stats as mount_stats
    from blobmount.api import snapshot_info as snapshot_info
    from blobmount.api import unmount as unmount

_LAZY = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        # lazy: the API loads pydantic and trio, which `import blobmount` must not pay for
        from blobmount import api

        return getattr(api, name)
    raise AttributeError(f"module 'blobmount' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
