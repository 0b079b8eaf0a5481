"""The shard sink's storage calls: each in a thread, an outage waited out with backoff."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from sinks.shards import ShardMarker, ShardStore, WindowRows
from streams.core.retry import Backoff, until_done


class SinkStorage:
    """A `ShardStore` as the sink uses it: every call retried until it succeeds, so a storage
    outage delays a window's acks and never loses it."""

    def __init__(self, store: ShardStore, backoff: Backoff, log: logging.Logger):
        self.store = store
        self.backoff = backoff
        self.log = log  # the sink's: its outage lines keep their logger

    async def io(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Blocking storage I/O in a thread, waiting out outages with backoff."""
        return await until_done(what, lambda: asyncio.to_thread(fn, *args), self.backoff, self.log)

    async def remove_uncommitted(self, partition: int, first_offset: int, epoch: int) -> int:
        """Remove the partition's windows at or after `first_offset` of an older or equal
        epoch (never committed, about to be rewritten); how many there were."""
        markers = await self.io("reading markers", self.store.markers, partition)
        stale = [m for m in markers if m.start_offset >= first_offset and m.epoch <= epoch]
        for marker in stale:
            await self.remove(
                "removing an uncommitted shard",
                marker.partition,
                marker.start_offset,
                marker.epoch,
            )
        return len(stale)

    async def remove(self, what: str, partition: int, start_offset: int, epoch: int) -> None:
        await self.io(what, self.store.delete_window, partition, start_offset, epoch)

    async def write(self, windows: list[WindowRows]) -> list[ShardMarker]:
        """One shard for all the windows, then a marker per window (`ShardStore.write_windows`)."""
        return await self.io("writing a shard", self.store.write_windows, windows)

    async def fenced(self, ends: list[tuple[int, int]]) -> list[bool]:
        """Per window, given as (partition, end offset): whether the version is sealed (or being
        sealed) past it."""
        if not await self.io("checking the seal", self.store.fenced):
            return [False] * len(ends)
        offsets = await self.io("reading the sealed offsets", self.store.sealed_offsets)
        # a window covered by the seal (its offsets were committed before it) is not fenced
        return [offsets is None or offsets.get(partition, 0) <= end for partition, end in ends]
