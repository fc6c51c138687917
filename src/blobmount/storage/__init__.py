"""Storage clients: the interface, an in-memory store, wrappers, and Azure (imported lazily)."""

from blobmount.storage.base import MAX_LIST_PAGE, BlobProps, ListPage, StorageClient

__all__ = ["MAX_LIST_PAGE", "BlobProps", "ListPage", "StorageClient"]
