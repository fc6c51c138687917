"""blobmount: a read-only FUSE mount of Azure Blob Storage for training jobs.

The Python API (see `blobmount.api` and the README)::

    import blobmount

    with blobmount.mount("az://datasets/imagenet", read_buffer_block_count=80) as data:
        ...
    blobmount.download("az://datasets/mnist", "/tmp/mnist")

Importing the package must stay cheap and must not import pyfuse3 or the Azure SDK, so the
Python API and the CLI's argument parsing work on machines without FUSE: the API functions are
loaded on first use.

`blobmount.download` is both the API function and the name of the download-mode subpackage.
Importing a subpackage rebinds its name on the parent package, so the package module's class
gets a `download` property: the function until the subpackage is imported, afterwards the
subpackage itself, made callable so that ``blobmount.download(uri, dest)`` still works.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["__version__", "download", "mount", "unmount"]

if TYPE_CHECKING:
    from blobmount.api import download as download
    from blobmount.api import mount as mount
    from blobmount.api import unmount as unmount

_LAZY = ("mount", "unmount")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from blobmount import api

        return getattr(api, name)
    raise AttributeError(f"module 'blobmount' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _CallableSubpackage(types.ModuleType):
    """The `blobmount.download` subpackage, callable as the API's `download`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from blobmount.api import download as download_function

        return download_function(*args, **kwargs)


class _Package(types.ModuleType):
    @property
    def download(self) -> Any:
        subpackage = sys.modules.get(f"{__name__}.download")
        if subpackage is not None:
            return subpackage
        from blobmount.api import download as download_function

        return download_function

    @download.setter
    def download(self, module: types.ModuleType) -> None:
        # called by the import system when it binds the subpackage; sys.modules keeps it
        module.__class__ = _CallableSubpackage


sys.modules[__name__].__class__ = _Package
