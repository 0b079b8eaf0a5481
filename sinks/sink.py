"""The shard sink: per-partition windows of consumed events → Arrow shard + commit marker → acks.

The sink owns the output's delivery protocol (windows, adoption from markers, the committed ids
used for dedup, retries, acks); the stage that feeds it decides what an event becomes
(`SinkStage`). The guarantee is stated on `ShardSink`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from sinks.shards import SampleRow, ShardMarker, ShardStore
from streams.core.faust_app import Event
from streams.core.retry import Backoff, until_done

log = logging.getLogger(__name__)

T = TypeVar("T")

# waits out a storage outage: 1 s, 2 s, … up to a minute between attempts
STORAGE_BACKOFF = Backoff(initial_s=1.0, max_s=60.0)


@dataclass(frozen=True)
class Admitted(Generic[T]):
    """What an event contributes to its window."""

    item: T
    # the id written at most once per dataset version (None: not deduplicated, e.g. a dead letter)
    key: str | None = None
    # counted against the window's token budget
    tokens: int = 0


class SinkStage(Protocol[T]):
    """What the sink asks of the stage that feeds it. Called with the sink's lock held."""

    def admit(self, tp: Hashable, event: Event) -> Admitted[T] | None:
        """The event's item, or None to skip it (a duplicate: see `ShardSink.seen`). Either way
        the event belongs to the window and is acked with it."""
        ...

    async def prepare(self, items: list[T]) -> list[SampleRow]:
        """At flush: the window's rows. Whatever does not become a row (dead letters) must be
        durable when this returns, since the window's offsets may be committed after it."""
        ...

    def committed(self, marker: ShardMarker, items: list[T]) -> None:
        """The window's marker is durable and its partition still ours; its events are acked
        right after this returns."""
        ...


@dataclass
class _Window(Generic[T]):
    partition: int
    start_offset: int
    opened_at: float
    end_offset: int = -1
    events: list[Event] = field(default_factory=list)
    items: list[T] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)
    tokens: int = 0


class ShardSink(Generic[T]):
    """Windows of contiguous offsets of one partition, written as a shard and a commit marker.

    Guarantee, with one writer per dataset version: an offset is committed only after the shard
    and marker of its window are durable, and each key is in at most one committed shard.

    - A window is flushed at `max_records` events, `max_tokens` tokens, or `idle_flush_s` after
      it opened. A flush makes the stage's dead letters durable (`prepare`), writes the shard,
      then its marker (each one durable write), then calls `committed`, then acks the window's
      events; only acked offsets are committed. Storage I/O is retried with backoff until it
      succeeds; the window stays unacked meanwhile.
    - A shard's key is its partition and start offset. A crash between shard and marker leaves
      a shard without a marker, which readers ignore; a crash between marker and acks (or
      before the acked offsets are committed) leaves a marker at or after the committed offset,
      removed on adoption (below). Either way the partition is consumed again from the
      committed offset, and a window starting at the same offset is rewritten under the same
      key; dead letters may be sent twice.
    - A partition is adopted on its first event after assignment, whose offset is the
      committed position: markers at or after it (never committed) are deleted with their
      shards; the keys of the markers before it are committed, and `seen` reports them.
    - On revoke, open windows are dropped unacked; the new owner consumes them again.
    - Readers trust only shards that have a marker.
    - Known limit: run one writer (tokenize worker) per dataset version. With two, a window
      being written when its partition is revoked can race its new owner on the same key
      (last write wins) and leave overlapping windows.
    """

    def __init__(
        self,
        store: ShardStore,
        stage: SinkStage[T],
        *,
        max_records: int,
        max_tokens: int,
        idle_flush_s: float,
        backoff: Backoff = STORAGE_BACKOFF,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.store = store
        self.stage = stage
        self.max_records = max_records
        self.max_tokens = max_tokens
        self.idle_flush_s = idle_flush_s
        self.backoff = backoff
        self.clock = clock
        self._windows: dict[Hashable, _Window[T]] = {}
        # per adopted partition: the keys of its committed windows (absent: not adopted)
        self._committed: dict[Hashable, set[str]] = {}
        self._lock = asyncio.Lock()

    async def add(self, event: Event) -> None:
        """Add a consumed event to its partition's window; flush the window when it is full."""
        tp = event.message.tp
        offset = int(event.message.offset)
        async with self._lock:
            if tp not in self._committed:
                await self._adopt(tp, offset)
            window = self._windows.get(tp)
            if window is None:
                window = _Window(tp.partition, offset, opened_at=self.clock())
                self._windows[tp] = window
            window.events.append(event)
            window.end_offset = offset
            admitted = self.stage.admit(tp, event)
            if admitted is not None:
                window.items.append(admitted.item)
                if admitted.key is not None:
                    window.keys.add(admitted.key)
                window.tokens += admitted.tokens
            if len(window.events) >= self.max_records or window.tokens >= self.max_tokens:
                await self._flush(tp)

    def seen(self, tp: Hashable, key: str) -> bool:
        """`key` is in the partition's open window or in one of its committed markers."""
        window = self._windows.get(tp)
        return (window is not None and key in window.keys) or key in self._committed.get(tp, ())

    async def flush_idle(self) -> None:
        """Flush the windows open for `idle_flush_s` or longer (called by a timer)."""
        deadline = self.clock() - self.idle_flush_s
        async with self._lock:
            for tp in [tp for tp, w in self._windows.items() if w.opened_at <= deadline]:
                await self._flush(tp)

    def on_revoked(self, partitions: Iterable[Hashable]) -> None:
        """Drop the partitions' open windows unacked (the new owner redoes them) and their
        committed keys (re-read from the markers if they come back)."""
        for tp in partitions:
            self._windows.pop(tp, None)
            self._committed.pop(tp, None)

    # -- the protocol --------------------------------------------------------------------------

    async def _adopt(self, tp: Any, first_offset: int) -> None:
        """First event of a partition since (re)assignment: `first_offset` is the committed
        position. Markers at or past it are from windows written but never committed: they are
        removed, since they are about to be rewritten, possibly with other window bounds.
        Markers before it hold the keys to skip."""
        markers = await self._io("reading markers", self.store.markers, tp.partition)
        committed: set[str] = set()
        for marker in markers:
            if marker.start_offset >= first_offset:
                await self._io(
                    "removing an uncommitted shard",
                    self.store.delete_window,
                    marker.partition,
                    marker.start_offset,
                )
            else:
                committed.update(marker.prompt_ids)
        self._committed[tp] = committed
        log.info(
            "partition %s: %d prompt ids already committed, resuming at offset %d",
            tp.partition,
            len(committed),
            first_offset,
        )

    async def _flush(self, tp: Hashable) -> None:
        window = self._windows.pop(tp, None)
        if window is None:
            return
        rows = await self.stage.prepare(window.items)
        marker = await self._io(
            "writing a shard",
            self.store.write_shard,
            window.partition,
            window.start_offset,
            window.end_offset,
            rows,
        )
        committed = self._committed.get(tp)
        if committed is None:
            return  # revoked while writing: its new owner re-adopts it from the markers
        committed.update(window.keys)
        self.stage.committed(marker, window.items)
        for event in window.events:
            event.ack()

    async def _io(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Blocking storage I/O in a thread, waiting out outages with backoff."""
        return await until_done(what, lambda: asyncio.to_thread(fn, *args), self.backoff, log)
