"""The open modes behind one interface: what an open file handle reads through."""

from __future__ import annotations

from typing import Protocol

from blobmount.blocks.manager import BlockHandle, BlockManager


class OpenReader(Protocol):
    async def read(self, offset: int, size: int) -> bytes | memoryview: ...

    def close(self) -> None: ...


class BlockReader:
    """Block-based mode: reads go through the block manager (RAM/disk tiers, read-ahead)."""

    def __init__(self, manager: BlockManager, handle: BlockHandle) -> None:
        self._manager = manager
        self._handle = handle

    async def read(self, offset: int, size: int) -> bytes | memoryview:
        return await self._manager.read(self._handle, offset, size)

    def close(self) -> None:
        self._manager.close(self._handle)
