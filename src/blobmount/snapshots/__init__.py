"""Dataset snapshots: one recorded version of a prefix (names, sizes, ETags, times, MD5s), so
every node of a job mounts the same bytes without listing (docs/SNAPSHOTS.md).

`table` holds the compact in-memory form and answers listings from it, `format` is the file
format, `client` the StorageClient that serves a namespace from a table and pins every read to
the recorded ETag, `files` reads and writes local snapshot files atomically, `diff` compares
two snapshots. Reading and writing snapshots in blob storage is the composition layer's
(`blobmount.compose.snapshots`), which has the storage stack.
"""
