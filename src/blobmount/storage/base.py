"""The one small interface between blobmount and a blob store.

Three data operations (list a prefix page by page, get a blob's properties, get a byte range of a
pinned blob version, whole or cut into parts, or with the version's properties from the same
answer) plus `aclose`. Implementations raise only
`blobmount.errors` exceptions, so nothing above this layer knows which HTTP stack (or none) is
underneath. All methods are trio coroutines.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from blobmount.errors import BlobChanged
from blobmount.storage.body_parts import split_parts

#: Azure returns at most this many items per list request.
MAX_LIST_PAGE = 5000


@dataclass(frozen=True, slots=True)
class BlobProps:
    """What the mount needs to know about one blob (one version of it)."""

    name: str
    size: int
    etag: str
    last_modified: float  # seconds since the epoch
    content_md5: bytes | None = None
    #: a zero-length blob with metadata hdi_isfolder=true stands for a folder
    is_dir_marker: bool = False


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of a listing: blobs, folder prefixes (ending in the delimiter), and a token for
    the next page (None on the last page)."""

    blobs: tuple[BlobProps, ...]
    prefixes: tuple[str, ...]
    continuation: str | None


@dataclass(frozen=True, slots=True)
class RangeWithProps:
    """A range of a blob version, and that version's properties from the same answer."""

    data: bytes
    props: BlobProps


class StorageClient(ABC):
    """A read-only view of one container."""

    #: identifies the container across mounts and processes (used to key the disk cache);
    #: must not contain secrets
    location: str = ""

    @abstractmethod
    async def list_page(
        self,
        prefix: str,
        *,
        delimiter: str | None = "/",
        continuation: str | None = None,
        max_results: int = MAX_LIST_PAGE,
    ) -> ListPage:
        """List blobs whose names start with `prefix`, in name order.

        With a delimiter, names that continue past the next delimiter are folded into
        `prefixes`. Raises ContainerNotFound, CredentialError, StorageUnavailable.
        """

    @abstractmethod
    async def get_properties(self, name: str) -> BlobProps:
        """Properties of the current version of `name`. Raises BlobNotFound."""

    @abstractmethod
    async def get_range(self, name: str, etag: str, start: int, length: int) -> bytes:
        """Bytes [start, start+length) of blob `name`, only if its ETag is still `etag`.

        Returns fewer bytes only when the blob ends first; never a mix of versions.
        Raises BlobChanged if the ETag differs, BlobNotFound if the blob is gone.
        """

    async def get_range_parts(
        self, name: str, etag: str, start: int, lengths: Sequence[int]
    ) -> list[bytes]:
        """`get_range` of `sum(lengths)` bytes, as consecutive parts of `lengths` (one request).

        As with `get_range`, the parts end early only when the blob does: the last one returned
        is then short. This default slices one `get_range` (a copy); a client that can cut the
        answer as it arrives overrides it.
        """
        data = await self.get_range(name, etag, start, sum(lengths))
        return split_parts(data, lengths)

    async def get_range_with_props(
        self, name: str, etag: str, start: int, length: int
    ) -> RangeWithProps:
        """`get_range`, with the properties of the whole blob version taken from the same
        answer: its size, ETag, last-modified time and Content-MD5 (of the whole blob, when it
        has one). `length` 0 asks for the properties alone.

        One request in every client that can read them from a GET's answer; this default, for
        one that cannot, makes two (the range, then the properties, checked to be that version).
        """
        data = await self.get_range(name, etag, start, length) if length > 0 else b""
        props = await self.get_properties(name)
        if props.etag != etag:
            raise BlobChanged(f"blob changed: {name}")
        return RangeWithProps(data, props)

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most clients hold nothing
        """Release connections. The client must not be used afterwards."""
