"""Disk tier: a persistent, verified, bounded block cache (issue 3; being built)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from blobmount.blocks.fetcher import DiskTier


@asynccontextmanager
async def open_disk_tier(settings: object, location: str) -> AsyncIterator[DiskTier | None]:
    yield None
