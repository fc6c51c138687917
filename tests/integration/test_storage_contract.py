"""The StorageClient contract, one set of test bodies run against every implementation.

"memory" is InMemoryStorageClient; "azurite" is AzureStorageClient (through an AsyncioBridge)
against the session's Azurite. Both are filled with the same blobs: nested folders, a folder
marker, names with spaces and non-ASCII, a 0-byte blob and a multi-MiB one. Listing uses
max_results=3 so every listing crosses pages.

Where the backends may differ (how many items a page holds, continuation tokens), the tests
check what callers rely on: pages of at most max_results items that, concatenated, give the
full listing in name order, ending with continuation None.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from blobmount.errors import (
    BlobChanged,
    BlobNotFound,
    ContainerNotFound,
    CredentialError,
    StorageUnavailable,
)
from blobmount.storage._aio_bridge import AsyncioBridge
from blobmount.storage.azure import AzureStorageClient
from blobmount.storage.base import StorageClient
from blobmount.storage.memory import InMemoryStorageClient
from blobmount.testing.azurite import AzuriteServer, free_port
from blobmount.testing.pattern import pattern_bytes

MiB = 1024 * 1024
BIG = 5 * MiB + 123
PAGE = 3

BLOBS: dict[str, bytes] = {
    "a/b/c.txt": b"content of a/b/c.txt\n",
    "a/b/d.bin": pattern_bytes("d", 0, 70_000),
    "a/e.txt": b"e",
    "big.bin": pattern_bytes("big", 0, BIG),
    "empty.bin": b"",
    "marker/inside.txt": b"inside the marked folder\n",
    # every character here has to be percent-encoded in a URL path or a list query
    "odd/100% +plus#hash?q&a=b;c.txt": b"odd name\n",
    "top.txt": b"top\n",
    "with space/file name.txt": b"spaces\n",
    "z-last.bin": b"zzz",
    "ünïcødé/naïve 文件.txt": "unicode ✓\n".encode(),
}
MARKERS = ("marker",)  # zero-length blob with metadata hdi_isfolder=true

ALL_NAMES = sorted([*BLOBS, *MARKERS])
ROOT_LISTING = [  # delimiter "/", prefix "": blobs and folders, in name order
    "a/",
    "big.bin",
    "empty.bin",
    "marker",
    "marker/",
    "odd/",
    "top.txt",
    "with space/",
    "z-last.bin",
    "ünïcødé/",
]


@dataclass
class Backend:
    """One filled store, and how to change it the way another writer would."""

    kind: str
    client: StorageClient
    memory: InMemoryStorageClient | None = None
    azurite: AzuriteServer | None = None
    container: str = ""
    bridge: AsyncioBridge | None = None
    extra_clients: list[StorageClient] = field(default_factory=list)

    def put(self, name: str, data: bytes) -> None:
        if self.memory is not None:
            self.memory.put(name, data)
        else:
            assert self.azurite is not None
            self.azurite.upload(self.container, name, data)

    def delete(self, name: str) -> None:
        if self.memory is not None:
            self.memory.delete(name)
        else:
            assert self.azurite is not None
            self.azurite.delete_blob(self.container, name)

    def azure_client(self, *, container: str | None = None, **kwargs: object) -> StorageClient:
        """Another AzureStorageClient on the same bridge (closed by the fixture)."""
        assert self.azurite is not None, "use the service_backend fixture"
        kwargs.setdefault("credential", self.azurite.credential())
        account_url = str(kwargs.pop("account_url", self.azurite.account_url))
        client = AzureStorageClient(
            account_url,
            container or self.container,
            kwargs.pop("credential"),
            bridge=self.bridge,
            connect_timeout_s=5.0,
            read_timeout_s=10.0,
        )
        self.extra_clients.append(client)
        return client


@pytest.fixture(params=["memory", pytest.param("azurite", marks=pytest.mark.azurite)])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "memory":
        memory = InMemoryStorageClient()
        for name, data in BLOBS.items():
            memory.put(name, data)
        for name in MARKERS:
            memory.put(name, b"", dir_marker=True)
        yield Backend("memory", memory, memory=memory)
        return

    azurite: AzuriteServer = request.getfixturevalue("azurite")
    container: str = request.getfixturevalue("container")
    azurite.upload_many(container, BLOBS.items())
    for name in MARKERS:
        azurite.upload_folder_marker(container, name)
    with AsyncioBridge() as bridge:
        client = AzureStorageClient(
            azurite.account_url, container, azurite.credential(), bridge=bridge
        )
        yield Backend("azurite", client, azurite=azurite, container=container, bridge=bridge)


@pytest.fixture
def service_backend(backend: Backend) -> Backend:
    """The backend, for tests of what only a real service has (containers, auth, network)."""
    if backend.kind == "memory":
        pytest.skip("the in-memory store has one container, no credentials and no network")
    return backend


@pytest.fixture
async def storage(backend: Backend):
    """The backend's client; it and any extra clients are closed after the test."""
    try:
        yield backend.client
    finally:
        for client in [backend.client, *backend.extra_clients]:
            await client.aclose()


# -- helpers -------------------------------------------------------------------------------


async def list_all(
    client: StorageClient, prefix: str, delimiter: str | None
) -> tuple[list[str], list[list[str]]]:
    """(merged names in listing order, the names of each page)."""
    pages: list[list[str]] = []
    token: str | None = None
    while True:
        page = await client.list_page(
            prefix, delimiter=delimiter, continuation=token, max_results=PAGE
        )
        names = sorted([b.name for b in page.blobs] + list(page.prefixes))
        assert len(names) <= PAGE
        pages.append(names)
        token = page.continuation
        if token is None:
            break
        assert len(pages) < 100, "listing never ends"
    return [n for page in pages for n in page], pages


# -- listing -------------------------------------------------------------------------------


async def test_list_root_with_delimiter_across_pages(storage):
    names, pages = await list_all(storage, "", "/")
    assert names == ROOT_LISTING
    assert len(pages) >= 3
    assert pages[-1]  # no empty trailing page is needed to end the listing


async def test_list_separates_blobs_and_prefixes(storage):
    blobs, prefixes = [], []
    token = None
    while True:
        page = await storage.list_page("", continuation=token, max_results=PAGE)
        blobs += [b.name for b in page.blobs]
        prefixes += list(page.prefixes)
        token = page.continuation
        if token is None:
            break
    assert blobs == ["big.bin", "empty.bin", "marker", "top.txt", "z-last.bin"]
    assert prefixes == ["a/", "marker/", "odd/", "with space/", "ünïcødé/"]
    assert all(p.endswith("/") for p in prefixes)


async def test_list_flat_without_delimiter(storage):
    names, pages = await list_all(storage, "", None)
    assert names == ALL_NAMES
    assert len(pages) > 1


async def test_list_sub_folder(storage):
    assert (await list_all(storage, "a/", "/"))[0] == ["a/b/", "a/e.txt"]
    assert (await list_all(storage, "a/b/", "/"))[0] == ["a/b/c.txt", "a/b/d.bin"]
    assert (await list_all(storage, "a/", None))[0] == ["a/b/c.txt", "a/b/d.bin", "a/e.txt"]
    assert (await list_all(storage, "marker/", "/"))[0] == ["marker/inside.txt"]
    assert (await list_all(storage, "ünïcødé/", "/"))[0] == ["ünïcødé/naïve 文件.txt"]
    assert (await list_all(storage, "with space/", "/"))[0] == ["with space/file name.txt"]


async def test_list_partial_name_prefix(storage):
    assert (await list_all(storage, "a", "/"))[0] == ["a/"]
    assert (await list_all(storage, "ma", "/"))[0] == ["marker", "marker/"]
    # a prefix with characters that must be escaped in the list query
    assert (await list_all(storage, "odd/100% +plus#", "/"))[0] == [
        "odd/100% +plus#hash?q&a=b;c.txt"
    ]


async def test_list_missing_prefix_is_empty(storage):
    page = await storage.list_page("no/such/folder/", max_results=PAGE)
    assert page.blobs == ()
    assert page.prefixes == ()
    assert page.continuation is None


async def test_listed_properties_match_get_properties(storage):
    page = await storage.list_page("a/b/", delimiter=None)
    listed = {b.name: b for b in page.blobs}
    for name in ("a/b/c.txt", "a/b/d.bin"):
        props = await storage.get_properties(name)
        assert listed[name].size == props.size == len(BLOBS[name])
        assert listed[name].etag == props.etag
        assert listed[name].content_md5 == props.content_md5


# -- folder markers ------------------------------------------------------------------------


async def test_marker_detection(storage):
    names = {}
    token = None
    while True:
        page = await storage.list_page("", continuation=token, max_results=PAGE)
        names.update({b.name: b for b in page.blobs})
        token = page.continuation
        if token is None:
            break
    assert names["marker"].is_dir_marker
    assert names["marker"].size == 0
    assert not names["empty.bin"].is_dir_marker
    assert not names["top.txt"].is_dir_marker
    assert (await storage.get_properties("marker")).is_dir_marker
    assert not (await storage.get_properties("empty.bin")).is_dir_marker


# -- properties ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["big.bin", "empty.bin", "with space/file name.txt", "ünïcødé/naïve 文件.txt"]
)
async def test_get_properties(storage, name):
    props = await storage.get_properties(name)
    assert props.name == name
    assert props.size == len(BLOBS[name])
    assert props.etag
    assert props.content_md5 == hashlib.md5(BLOBS[name]).digest()
    assert props.last_modified > datetime(2020, 1, 1, tzinfo=UTC).timestamp()
    assert props.last_modified < (datetime.now(UTC) + timedelta(days=1)).timestamp()


async def test_get_properties_not_found(storage):
    with pytest.raises(BlobNotFound):
        await storage.get_properties("no/such/blob")
    with pytest.raises(BlobNotFound):
        await storage.get_properties("a")  # a folder is not a blob


# -- ranges --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "length"),
    [
        (0, 10),  # start
        (0, BIG),  # all of it
        (2 * MiB + 5, 2 * MiB),  # a block from the middle
        (BIG - 5, 5),  # exactly the end
        (BIG - 5, 2 * MiB),  # past the end: truncated
        (BIG, 10),  # starting at the end
        (BIG + 1000, 10),  # starting after the end
        (12345, 0),  # nothing
    ],
)
async def test_get_range_exact_bytes(storage, start, length):
    etag = (await storage.get_properties("big.bin")).etag
    data = await storage.get_range("big.bin", etag, start, length)
    assert data == BLOBS["big.bin"][start : start + length]


@pytest.mark.parametrize(
    ("start", "lengths"),
    [
        (0, [10, 20, 30]),  # small parts
        (2 * MiB + 5, [2 * MiB, 2 * MiB]),  # blocks from the middle
        (BIG - 3 * MiB, [MiB, MiB, MiB]),  # exactly to the end
        (BIG - 3 * MiB, [2 * MiB, 2 * MiB, MiB]),  # past the end: the last parts short or gone
        (BIG, [10, 10]),  # starting at the end: nothing
    ],
)
async def test_get_range_parts_are_one_range_cut(storage, start, lengths):
    etag = (await storage.get_properties("big.bin")).etag
    parts = await storage.get_range_parts("big.bin", etag, start, lengths)
    whole = BLOBS["big.bin"][start : start + sum(lengths)]
    assert b"".join(parts) == whole
    at = 0
    for part, length in zip(parts, lengths, strict=False):
        assert part == whole[at : at + length]
        at += length
    assert all(parts)
    assert len(parts) <= len(lengths)


async def test_get_range_parts_of_a_changed_blob_is_blob_changed(storage, backend):
    etag = (await storage.get_properties("a/e.txt")).etag
    backend.put("a/e.txt", b"e2")
    with pytest.raises(BlobChanged):
        await storage.get_range_parts("a/e.txt", etag, 0, [1, 1])


@pytest.mark.parametrize("name", ["empty.bin", "marker"])
async def test_get_range_of_empty_blob(storage, name):
    etag = (await storage.get_properties(name)).etag
    assert await storage.get_range(name, etag, 0, 100) == b""


@pytest.mark.parametrize(
    "name",
    [
        "with space/file name.txt",
        "ünïcødé/naïve 文件.txt",
        "a/b/d.bin",
        "odd/100% +plus#hash?q&a=b;c.txt",
    ],
)
async def test_get_range_awkward_names(storage, name):
    etag = (await storage.get_properties(name)).etag
    assert await storage.get_range(name, etag, 0, 1 << 20) == BLOBS[name]
    assert await storage.get_range(name, etag, 3, 4) == BLOBS[name][3:7]


async def test_get_range_after_overwrite_is_blob_changed(storage, backend):
    old = await storage.get_properties("top.txt")
    backend.put("top.txt", b"new content, new etag\n")
    with pytest.raises(BlobChanged):
        await storage.get_range("top.txt", old.etag, 0, 4)
    with pytest.raises(BlobChanged):
        await storage.get_range("top.txt", old.etag, 1000, 4)  # past the end, still pinned
    new = await storage.get_properties("top.txt")
    assert new.etag != old.etag
    assert await storage.get_range("top.txt", new.etag, 0, 100) == b"new content, new etag\n"


async def test_get_range_after_delete_is_blob_not_found(storage, backend):
    old = await storage.get_properties("z-last.bin")
    backend.delete("z-last.bin")
    with pytest.raises(BlobNotFound):
        await storage.get_range("z-last.bin", old.etag, 0, 3)
    with pytest.raises(BlobNotFound):
        await storage.get_properties("z-last.bin")
    assert "z-last.bin" not in (await list_all(storage, "", "/"))[0]


async def test_get_range_of_missing_blob(storage):
    with pytest.raises(BlobNotFound):
        await storage.get_range("never/existed", '"0x1"', 0, 10)


# -- a range with the version's properties from the same answer -----------------------------


@pytest.mark.parametrize(
    ("name", "start", "length"),
    [
        ("a/b/d.bin", 0, 70_000),  # a whole small blob: what a whole-file open asks for
        ("a/b/d.bin", 0, 1 << 20),  # asking for more than there is
        ("big.bin", 0, 2 * MiB),  # the first part of a big one
        ("big.bin", 3 * MiB, 2 * MiB + 123),  # a part from the middle to the end
        ("big.bin", BIG, 10),  # nothing left
        ("ünïcødé/naïve 文件.txt", 0, 100),
        ("empty.bin", 0, 100),
        ("top.txt", 0, 0),  # the properties alone
    ],
)
async def test_get_range_with_props_gives_the_whole_blobs_properties(storage, name, start, length):
    props = await storage.get_properties(name)
    got = await storage.get_range_with_props(name, props.etag, start, length)
    assert got.data == BLOBS[name][start : start + length]
    # the blob's, not the range's: size, version and MD5 of the whole blob
    assert got.props.name == name
    assert got.props.size == len(BLOBS[name])
    assert got.props.etag == props.etag
    assert got.props.content_md5 == hashlib.md5(BLOBS[name]).digest()
    assert abs(got.props.last_modified - props.last_modified) < 1.0


async def test_get_range_with_props_is_pinned(storage, backend):
    old = await storage.get_properties("top.txt")
    backend.put("top.txt", b"new content, new etag\n")
    for length in (4, 0):
        with pytest.raises(BlobChanged):
            await storage.get_range_with_props("top.txt", old.etag, 0, length)
    backend.delete("z-last.bin")
    with pytest.raises(BlobNotFound):
        await storage.get_range_with_props("z-last.bin", '"0x1"', 0, 3)
    with pytest.raises(BlobNotFound):
        await storage.get_range_with_props("never/existed", '"0x1"', 0, 10)


# -- errors only a real service has --------------------------------------------------------


async def test_missing_container(storage, service_backend):
    backend = service_backend
    client = backend.azure_client(container="no-such-container")
    with pytest.raises(ContainerNotFound):
        await client.list_page("")
    with pytest.raises(ContainerNotFound):
        await client.get_properties("top.txt")
    with pytest.raises(ContainerNotFound):
        await client.get_range("top.txt", '"0x1"', 0, 10)


async def test_wrong_account_key(storage, service_backend):
    backend = service_backend
    from azure.core.credentials import AzureNamedKeyCredential

    wrong = base64.b64encode(b"not the key" * 6).decode()
    client = backend.azure_client(credential=AzureNamedKeyCredential("devstoreaccount1", wrong))
    etag = (await storage.get_properties("top.txt")).etag
    for call in (
        lambda: client.list_page(""),
        lambda: client.get_properties("top.txt"),
        lambda: client.get_range("top.txt", etag, 0, 3),
    ):
        with pytest.raises(CredentialError) as info:
            await call()
        assert wrong not in str(info.value)
        assert "403" in str(info.value)


async def test_bad_sas_signature_is_not_leaked(storage, service_backend):
    backend = service_backend
    from azure.core.credentials import AzureSasCredential
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    sas = generate_container_sas(
        "devstoreaccount1",
        backend.container,
        account_key=base64.b64encode(b"a wrong key!" * 6).decode(),
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.now(UTC) + timedelta(hours=1),
    )
    signature = dict(p.split("=", 1) for p in sas.split("&"))["sig"]
    client = backend.azure_client(credential=AzureSasCredential(sas))
    with pytest.raises(CredentialError) as info:
        await client.list_page("")
    text = f"{info.value!s} {info.value!r}"
    assert signature not in text
    assert "sig=" not in text
    assert info.value.__cause__ is None  # the SDK's text (with the URL) is not chained


async def test_anonymous_and_sas_clients(storage, service_backend):
    """Each way a request can be authorised reads the same bytes: a public container
    anonymously, a user's SAS, and (the fixture's client) a key-derived SAS."""
    from azure.core.credentials import AzureSasCredential
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    backend = service_backend
    assert backend.azurite is not None
    public = f"public-{backend.container}"[:63]
    backend.azurite.create_container(public, public=True)
    try:
        backend.azurite.upload(public, "open.txt", b"anyone may read\n")
        anonymous = backend.azure_client(container=public, credential=None)
        assert [b.name for b in (await anonymous.list_page("")).blobs] == ["open.txt"]
        props = await anonymous.get_properties("open.txt")
        assert await anonymous.get_range("open.txt", props.etag, 0, 100) == b"anyone may read\n"
        # without credentials, a private container refuses
        with pytest.raises(CredentialError):
            await backend.azure_client(credential=None).list_page("")
    finally:
        backend.azurite.delete_container(public)

    sas = generate_container_sas(
        backend.azurite.account,
        backend.container,
        account_key=backend.azurite.account_key,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.now(UTC) + timedelta(hours=1),
    )
    for credential in (sas, AzureSasCredential(sas)):
        client = backend.azure_client(credential=credential)
        etag = (await client.get_properties("a/b/d.bin")).etag
        assert await client.get_range("a/b/d.bin", etag, 5, 10) == BLOBS["a/b/d.bin"][5:15]
        assert "top.txt" in [b.name for b in (await client.list_page("")).blobs]


async def test_unreachable_endpoint_is_unavailable(storage, service_backend):
    backend = service_backend
    client = backend.azure_client(account_url=f"http://127.0.0.1:{free_port()}/devstoreaccount1")
    with pytest.raises(StorageUnavailable):
        await client.list_page("")
