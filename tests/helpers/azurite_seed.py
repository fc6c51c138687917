"""Fill an on-disk Azurite with hundreds of thousands of small blobs in seconds.

Azurite stores each uploaded blob with an insert that costs O(n) (here ~200 blobs/s at first,
~70 blobs/s by 50,000), so the listing tests and benchmarks of issue #8 (100,000 blobs in one
folder; 50,000 in 5,000 folders) cannot upload their datasets. Azurite run with `--location DIR`
keeps its metadata in two LokiJS databases (JSON files) and blob bytes in "extent" files;
`seed_location` writes those directly, from a template Azurite itself made:

1. a real Azurite on DIR creates the containers and uploads one template blob, and is stopped
   (it saves its databases on SIGTERM);
2. the template blob's document is cloned for every seeded blob: name, container, length, MD5,
   a deterministic ETag, and an offset into ONE new extent file that holds every seeded blob's
   bytes back to back; the template blob and its extent go;
3. LokiJS itself (Azurite's own copy, run by node) rebuilds and checks every collection index
   and writes the databases back in its own format.

Then `AzuriteServer(location=DIR)` serves the seeded blobs like uploaded ones: listed, HEAD and
ranged GET (`verify_seeded` checks some). `SeededAzurite` does all of it in a folder of its own.
The document shapes are Azurite 3.37.0's, so seeding refuses any other version
(SEED_AZURITE_VERSION) instead of writing a database it may misread.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import random
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blobmount.testing.azurite import AzuriteServer, find_azurite

log = logging.getLogger(__name__)

SEED_AZURITE_VERSION = "3.37.0"
BLOB_DB = "__azurite_db_blob__.json"
EXTENT_DB = "__azurite_db_blob_extent__.json"
EXTENT_DIR = "__blobstorage__"
BLOBS = "$BLOBS_COLLECTION$"
EXTENTS = "$EXTENTS_COLLECTION$"
TEMPLATE_BLOB = "blobmount-seed-template"
TEMPLATE_BYTES = b"template"
#: what a blob document must hold for the clone to be right (Azurite 3.37.0's BlobModel)
_BLOB_KEYS = {
    "accountName",
    "containerName",
    "name",
    "properties",
    "snapshot",
    "isCommitted",
    "persistency",
    "meta",
    "$loki",
}
_PROPERTY_KEYS = {"contentLength", "contentMD5", "etag", "blobType", "lastModified"}

# Rebuilds every binary index of a LokiJS database file with LokiJS's own comparator, checks
# them, and saves the file back (argv: lokijs module path, database files).
_REINDEX_JS = r"""
const Loki = require(process.argv[1]);
const files = process.argv.slice(2);
let pending = files.length;
for (const file of files) {
  const db = new Loki(file, { persistenceMethod: "fs" });
  db.loadDatabase({}, (err) => {
    if (err) { console.error(`${file}: ${err}`); process.exit(1); }
    for (const coll of db.collections) {
      for (const key of Object.keys(coll.binaryIndices)) coll.ensureIndex(key, true);
      const bad = coll.checkAllIndexes();
      if (bad.length) { console.error(`${file}: ${coll.name}: bad index ${bad}`); process.exit(1); }
    }
    db.saveDatabase((err) => {
      if (err) { console.error(`${file}: ${err}`); process.exit(1); }
      if (--pending === 0) process.exit(0);
    });
  });
}
"""


class SeedError(RuntimeError):
    """The databases are not what this seeder was written for."""


@dataclass(frozen=True)
class Seeded:
    blobs: int
    bytes: int
    seconds: float


def azurite_package(executable: str | None = None) -> Path:
    """The folder of the azurite npm package the executable belongs to."""
    exe = Path(os.path.realpath(executable or find_azurite()))
    for folder in exe.parents:
        manifest = folder / "package.json"
        if manifest.is_file() and json.loads(manifest.read_text()).get("name") == "azurite":
            return folder
    raise SeedError(f"no azurite package.json above {exe}")


def _node_and_lokijs(package: Path) -> tuple[str, str]:
    node = shutil.which("node")
    if node is None:
        raise SeedError("node is not on PATH (Azurite needs it too: run `make setup`)")
    script = "console.log(require.resolve('lokijs', { paths: [process.argv[1]] }))"
    found = subprocess.run(
        [node, "-e", script, str(package)], capture_output=True, text=True, check=True
    )
    return node, found.stdout.strip()


def etag_for(container: str, name: str, data: bytes) -> str:
    """A deterministic ETag in Azurite's shape ("0x" and 15 hex digits, quoted)."""
    digest = hashlib.blake2b(f"{container}/{name}".encode() + b"\0" + data, digest_size=8).digest()
    return f'"0x{int.from_bytes(digest, "big") >> 4:015X}"'


def seed_location(
    location: str | os.PathLike[str],
    datasets: Mapping[str, Iterable[tuple[str, bytes]]],
    *,
    executable: str | None = None,
) -> Seeded:
    """Make `location` (a new or empty folder) hold containers named by `datasets`' keys with
    their (name, bytes) blobs, for `AzuriteServer(location=...)`. Names must be unique within a
    container."""
    started = time.monotonic()
    location = Path(location)
    package = azurite_package(executable)
    version = json.loads((package / "package.json").read_text())["version"]
    if version != SEED_AZURITE_VERSION:
        raise SeedError(
            f"seeding writes Azurite {SEED_AZURITE_VERSION}'s database format; found {version} "
            f"at {package} (pin it in the Makefile, or check the document shapes and update)"
        )
    node, lokijs = _node_and_lokijs(package)
    location.mkdir(parents=True, exist_ok=True)
    if any(location.iterdir()):
        raise SeedError(f"{location} is not empty")

    # 1. Azurite makes the containers and a template blob, and saves its databases
    first = next(iter(datasets))
    with AzuriteServer(executable=executable, location=location) as az:
        for container in datasets:
            az.create_container(container)
        az.upload(first, TEMPLATE_BLOB, TEMPLATE_BYTES)
    blob_db = json.loads((location / BLOB_DB).read_text())
    extent_db = json.loads((location / EXTENT_DB).read_text())
    blobs = _collection(blob_db, BLOBS)
    extents = _collection(extent_db, EXTENTS)
    template = _template(blobs)
    template_extent = _one(extents["data"], "extent document")

    # 2. one document per blob, every blob's bytes in one new extent
    extent_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"blobmount-seed:{location.resolve()}"))
    storage = location / EXTENT_DIR
    created_ms = int(time.time() * 1000)
    docs: list[dict[str, Any]] = []
    offset = 0
    with open(storage / extent_id, "wb") as extent:
        for container, items in datasets.items():
            for name, data in items:
                docs.append(_blob_doc(template, len(docs) + 1, container, name, data, created_ms))
                docs[-1]["persistency"] = {"id": extent_id, "offset": offset, "count": len(data)}
                extent.write(data)
                offset += len(data)
    blobs["data"] = docs
    blobs["maxId"] = len(docs)
    for old in extents["data"]:  # the template's extent: nothing refers to it any more
        (storage / old["path"]).unlink(missing_ok=True)
    extents["data"] = [
        {
            **template_extent,
            "id": extent_id,
            "path": extent_id,
            "size": offset,
            "lastModifiedInMS": created_ms,
            "LastModifyInMS": created_ms,
            "meta": {"revision": 0, "created": created_ms, "version": 0},
            "$loki": 1,
        }
    ]
    extents["maxId"] = 1
    for collection in (blobs, extents):
        for index in collection["binaryIndices"].values():
            index["values"], index["dirty"] = [], True
    for db, file in ((blob_db, BLOB_DB), (extent_db, EXTENT_DB)):
        (location / file).write_text(json.dumps(db, separators=(",", ":")))

    # 3. LokiJS builds its indexes
    subprocess.run(
        [node, "-e", _REINDEX_JS, lokijs, str(location / BLOB_DB), str(location / EXTENT_DB)],
        check=True,
        capture_output=True,
    )
    seconds = time.monotonic() - started
    log.info("seeded %d blobs (%d bytes) in %.1f s", len(docs), offset, seconds)
    return Seeded(len(docs), offset, seconds)


def _collection(db: dict[str, Any], name: str) -> dict[str, Any]:
    if db.get("databaseVersion") != 1.5:
        raise SeedError(f"LokiJS database version {db.get('databaseVersion')}, expected 1.5")
    for collection in db["collections"]:
        if collection["name"] == name:
            found: dict[str, Any] = collection
            return found
    raise SeedError(f"no {name} in Azurite's database")


def _one(docs: list[dict[str, Any]], what: str) -> dict[str, Any]:
    if len(docs) != 1:
        raise SeedError(f"expected one {what}, found {len(docs)}")
    return docs[0]


def _template(blobs: dict[str, Any]) -> dict[str, Any]:
    doc = _one(blobs["data"], "template blob")
    missing = (_BLOB_KEYS - doc.keys()) | (_PROPERTY_KEYS - doc["properties"].keys())
    if doc["name"] != TEMPLATE_BLOB or missing:
        raise SeedError(f"unexpected blob document (missing {sorted(missing)}): {doc}")
    if doc["properties"]["contentLength"] != len(TEMPLATE_BYTES):
        raise SeedError(f"unexpected template blob: {doc}")
    return doc


def _blob_doc(
    template: dict[str, Any],
    loki_id: int,
    container: str,
    name: str,
    data: bytes,
    created_ms: int,
) -> dict[str, Any]:
    doc = copy.deepcopy(template)
    doc["containerName"] = container
    doc["name"] = name
    properties = doc["properties"]
    properties["contentLength"] = len(data)
    properties["contentMD5"] = {str(i): b for i, b in enumerate(hashlib.md5(data).digest())}
    properties["etag"] = etag_for(container, name, data)
    doc["meta"] = {"revision": 0, "created": created_ms, "version": 0}
    doc["$loki"] = loki_id
    return doc


def verify_seeded(
    az: AzuriteServer, container: str, items: Sequence[tuple[str, bytes]], samples: int = 5
) -> None:
    """GET a few seeded blobs (the first, the last and some in between) through Azurite's API
    and compare bytes and ETag; raise AssertionError on any difference."""
    if not items:
        return
    picks = random.Random(0).sample(range(len(items)), min(samples, len(items)))
    for i in sorted({0, len(items) - 1, *picks}):
        name, data = items[i]
        got, etag = az.download(container, name)
        if (got, etag) != (data, etag_for(container, name, data)):
            raise AssertionError(f"seeded {container}/{name}: got {got!r} {etag}, not {data!r}")


class SeededAzurite(AzuriteServer):
    """An on-disk Azurite in a temporary folder of its own, seeded with `datasets` (container ->
    [(name, bytes)]) before it starts, and checked (`verify_seeded`) once it runs; stop()
    removes the folder.

        with SeededAzurite({"data": [("a/b.bin", b"...")]}) as az:
            ...
    """

    def __init__(
        self,
        datasets: Mapping[str, Sequence[tuple[str, bytes]]],
        *,
        executable: str | None = None,
    ) -> None:
        self._folder = Path(tempfile.mkdtemp(prefix="blobmount-seeded-"))
        super().__init__(executable=executable, location=self._folder / "azurite")
        self._datasets = datasets
        self.seeded: Seeded | None = None

    def start(self) -> SeededAzurite:
        if self.running:
            return self
        assert self._location is not None
        try:
            if self.seeded is None:
                self.seeded = seed_location(
                    self._location, self._datasets, executable=self._executable
                )
            super().start()
            for container, items in self._datasets.items():
                verify_seeded(self, container, items)
        except BaseException:
            self.stop()
            raise
        self._datasets = {}  # the caller keeps its own copy if it needs one
        return self

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self._folder, ignore_errors=True)
