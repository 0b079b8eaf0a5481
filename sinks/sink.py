"""The shard sink: per-partition windows of consumed events → Arrow shard + commit marker → acks.

The sink owns the output's delivery protocol (windows, adoption from markers, the committed ids
used for dedup, retries, acks); the stage that feeds it decides what an event becomes
(`SinkStage`). The guarantee is stated on `ShardSink`; its storage calls, each retried until it
succeeds, are `SinkStorage`'s (sinks/sink_storage.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Hashable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

from sinks.shards import SampleRow, ShardMarker, ShardStore, WindowRows
from sinks.sink_storage import SinkStorage
from streams.core.events import Event
from streams.core.leases import Lease, Leases, Verdict
from streams.core.retry import Backoff, backoff

log = logging.getLogger(__name__)

T = TypeVar("T")

# waits out a storage outage: 1 s, 2 s, … up to a minute between attempts
STORAGE_BACKOFF = backoff("outage")
# windows flushed at once: one building while the next is prepared (the encoder is parallel
# already); intake waits beyond this, so memory stays bounded
MAX_FLUSHING = 2


def sealed_line(dataset: str, partition: int, offset: int) -> str:
    """The one line a writer stops with when its version was sealed under it."""
    return (
        f"dataset version {dataset} is sealed: this worker stops without writing to it "
        f"(completions from partition {partition} offset {offset} on stay out of it; "
        f"`draftgen replay --dataset NEW` builds a version that includes them)"
    )


def _log_sealed(line: str) -> None:
    log.error("%s", line)


@dataclass(frozen=True)
class Admitted(Generic[T]):
    """What an event contributes to its window."""

    item: T
    # the prompt id: a later item of the same key in the window replaces the earlier one
    # (latest answer wins); None: not keyed (an undecodable record without a key)
    key: str | None = None
    # counted against the window's token budget
    tokens: int = 0
    # counted against the memory budget of all open windows (the record's size is a proxy)
    size: int = 0


@dataclass
class Prepared:
    """A window's content at flush: its rows, and the keys that ended as a recorded drop."""

    rows: list[SampleRow]
    drops: dict[str, str] = field(default_factory=dict)
    # the sample policy's verdicts: "drop:RULE"/"flag:RULE" → source → count, and examples
    gate: dict[str, dict[str, int]] = field(default_factory=dict)
    gate_examples: dict[str, list[str]] = field(default_factory=dict)


class SinkStage(Protocol[T]):
    """What the sink asks of the stage that feeds it: `admit` with the sink's lock held; the
    others from a window's flush, which runs beside intake (one event loop, no lock)."""

    def admit(self, tp: Hashable, event: Event) -> Admitted[T]:
        """The event's item; the event belongs to the window and is acked with it."""
        ...

    async def prepare(self, items: list[T]) -> Prepared:
        """At flush: the window's rows and drops. Dead letters sent to Kafka for the drops must
        be durable when this returns, since the window's offsets may be committed after it."""
        ...

    def committed(self, marker: ShardMarker, items: list[T]) -> None:
        """The window's marker is durable and its partition still ours; its events are acked
        right after this returns."""
        ...


@dataclass
class SinkStats:
    duplicates: int = 0  # items replaced by a later one of the same key in their window
    open_bytes: int = 0  # held by all open windows now
    peak_open_bytes: int = 0
    budget_flushes: int = 0  # windows flushed early to stay within the memory budget
    adopted: int = 0  # partitions adopted
    removed: int = 0  # uncommitted windows removed at adoption

    def grow(self, size: int) -> None:
        """Open windows took `size` more bytes (less, when negative)."""
        self.open_bytes += size
        self.peak_open_bytes = max(self.peak_open_bytes, self.open_bytes)


@dataclass
class _Window(Generic[T]):
    lease: Lease  # of the partition's assignment it was opened under
    partition: int
    start_offset: int
    epoch: int
    opened_at: float
    end_offset: int = -1
    events: list[Event] = field(default_factory=list)
    items: list[T] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)  # key → position in items
    tokens: int = 0
    size: int = 0

    def add(self, event: Event, offset: int, admitted: Admitted[T]) -> bool:
        """Add the event and its item; True when the item replaced an earlier one of its key."""
        self.events.append(event)
        self.end_offset = offset
        self.tokens += admitted.tokens
        self.size += admitted.size
        at = self.index.get(admitted.key) if admitted.key is not None else None
        if at is not None:
            self.items[at] = admitted.item
            return True
        if admitted.key is not None:
            self.index[admitted.key] = len(self.items)
        self.items.append(admitted.item)
        return False

    def rows(self, prepared: Prepared) -> WindowRows:
        """The window as written, with what the stage prepared for it."""
        return WindowRows(
            self.partition,
            self.start_offset,
            self.end_offset,
            prepared.rows,
            self.epoch,
            prepared.drops,
            prepared.gate,
            prepared.gate_examples,
        )


class _Flushes:
    """Window writes in flight, oldest first (at most `MAX_FLUSHING`), the bytes they hold, and
    per partition the latest one (the partition's next write waits on it)."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []
        self.bytes = 0
        self.last: dict[Hashable, asyncio.Task[None]] = {}

    async def start(
        self,
        tps: list[Hashable],
        size: int,
        write: Callable[[list[asyncio.Task[None]]], Coroutine[Any, Any, None]],
    ) -> None:
        """Start `write(the partitions' previous writes)`; waits only while `MAX_FLUSHING` are
        busy."""
        self.bytes += size
        while len(self.tasks) >= MAX_FLUSHING:
            await self.wait_any()
        previous = [self.last[tp] for tp in tps if tp in self.last]
        task = asyncio.create_task(write(previous))
        self.tasks.append(task)
        for tp in tps:
            self.last[tp] = task

    def ended(self, tps: list[Hashable], size: int) -> None:
        """Called by a write as it ends, whatever the outcome."""
        self.bytes -= size
        for tp in tps:
            if self.last.get(tp) is asyncio.current_task():
                del self.last[tp]

    async def wait_any(self) -> None:
        """Until a flush in flight ends (a cancelled caller does not cancel the writes)."""
        await asyncio.wait(self.tasks, return_when=asyncio.FIRST_COMPLETED)
        self.raise_failed()

    def raise_failed(self) -> None:
        """A flush that failed (a bug: storage I/O is retried) stops the agent, as before."""
        for task in [t for t in self.tasks if t.done()]:
            self.tasks.remove(task)
            task.result()  # raises what the flush raised


class ShardSink(Generic[T]):
    """Windows of contiguous offsets of one partition, written as a shard and a commit marker.

    Guarantee, with any number of writers per dataset version (each partition is owned by one
    consumer of the group at a time, and a revoked one may still be finishing a write): every
    offset is covered by exactly one window that counts, an offset is committed only after its
    window's shard and marker are durable, and every prompt id has one outcome (a row or a
    recorded drop), the one of its latest completion.

    - Writing. A window is flushed at `max_records` events, `max_tokens` tokens, or when all
      open windows together hold more than `max_open_bytes` (the largest is flushed first);
      and once a window has been open `idle_flush_s` (continuous ingestion must not wait for
      the next record), every open window is flushed with it, into one shard, so that a slow
      stream over many partitions writes a shard per `idle_flush_s`, not one per partition. A
      flush asks the stage for each window's rows and drops (`prepare`, which makes its dead
      letters durable), writes the shard, then a marker per window, each one durable write
      (`ShardStore.write_windows`), then per window calls `committed` and acks its events;
      faust commits acked offsets. Storage I/O (`SinkStorage`) is
      retried with backoff until it succeeds; the window stays unacked meanwhile. Flushes run
      in the background while intake goes on (the build and the write of one window overlap
      the decoding of the next), at most `MAX_FLUSHING` at a time; a partition's windows are
      written and acked in offset order (faust may commit past an unacked offset once a later
      one is acked, faust#606; and a marker never lands before its predecessor's).
    - Keys and fencing. A window's key is (partition, start offset, the group
      epoch in which the partition was adopted). Window bounds depend on timing (idle and
      memory flushes), so a rewrite after a crash or a rebalance may end elsewhere than the
      first write; instead of relying on equal bounds, readers resolve (sinks/resolve.py): a
      window overlapping one of a newer epoch (or of the same epoch, written later)
      does not count. The partition's new owner rewrites from the committed offset, so a
      zombie's late write, whatever its bounds, is always overlapped and ignored.
    - Leases (streams/core/leases.py). Each assignment of a partition is a lease, taken as its
      first event is delivered: it admits offsets from the group's committed offset on, in
      order (a hole is sought back to), acks go through it in offset order, and the commit
      guard in faust's consumer thread commits no further than its acked run.
    - Adoption. A partition is adopted on its first event after assignment, at its lease's
      start: the committed position (checked against the group's, not assumed). Markers at or
      after it of an older or equal epoch were never committed and are about to be
      rewritten: they are removed (an optimisation; resolution would ignore them anyway).
      Nothing before it is read: dedup is by resolution, not here.
    - Latest answer wins. Within a window a later item of the same key replaces the earlier
      one; across windows the reader keeps the prompt's last outcome in offset order.
    - Crashes. Between shard and marker: a shard without a marker, which readers ignore.
      Between marker and acks: a marker at or after the committed offset, rewritten by the next
      owner under its own epoch. Dead letters sent in `prepare` may then be sent twice;
      the recorded drop in the marker that counts is one.
    - Revoke. Open windows are dropped unacked; the new owner consumes them again. A window
      being written when its partition is revoked is never acked (its lease ended). An event
      delivered before its partition was revoked (the agent waited for the lock, or was
      adopting) is dropped unacked: it must neither adopt the partition in the next epoch
      nor join a window of it.
    - Memory. Open windows and those being written hold at most `max_open_bytes` of records
      (plus the one being added): intake waits for writes when they would exceed it.
    - Sealed means sealed. `draftgen seal` writes a fence (`_sealing.json`) once the group has
      caught up, before it reads the offsets it seals at. A window is checked against the
      fence (or `sealed.json`) before it is prepared (no dead letter is sent for it) and again
      after its marker is written: fenced, it is not acked, a written window is removed
      (marker first; it is past the committed offset, so no seal covers it), and the sink
      stops for good: `on_sealed` gets one line, later events are dropped unacked.
    """

    def __init__(
        self,
        store: ShardStore,
        stage: SinkStage[T],
        *,
        max_records: int,
        max_tokens: int,
        idle_flush_s: float,
        max_open_bytes: int = 256 * 1024 * 1024,
        epoch: Callable[[], int] = lambda: 0,
        backoff: Backoff = STORAGE_BACKOFF,
        clock: Callable[[], float] = time.monotonic,
        on_sealed: Callable[[str], None] = _log_sealed,
    ):
        self.store = store
        self.on_sealed = on_sealed
        # the line this sink stopped with when its version was sealed under it
        self.sealed: str | None = None
        self.stage = stage
        self.max_records = max_records
        self.max_tokens = max_tokens
        self.idle_flush_s = idle_flush_s
        self.max_open_bytes = max_open_bytes
        self.epoch = epoch
        self._storage = SinkStorage(store, backoff, log)
        self.clock = clock
        self.stats = SinkStats()
        self._windows: dict[Hashable, _Window[T]] = {}
        # per adopted partition: the epoch it was adopted in (absent: not adopted)
        self._adopted: dict[Hashable, int] = {}
        # one per partition assignment: an event delivered before its partition's revocation is
        # stale, and an adoption the partition was revoked during does not hold
        self.leases = Leases()
        self._lock = asyncio.Lock()
        self._flushes = _Flushes()

    async def add(self, event: Event) -> None:
        """Add a consumed event to its partition's window; flush what is full."""
        tp = event.message.tp
        offset = int(event.message.offset)
        lease = self.leases.lease(tp)  # as delivered, before any wait
        self._flushes.raise_failed()
        if self.sealed is not None:
            return  # the version was sealed: nothing more is written or acked
        async with self._lock:
            if await self.leases.admit(lease, offset) is not Verdict.ADMIT:
                return  # stale, again, or past a hole: unacked, consumed again in order
            if tp not in self._adopted:
                assert lease.start is not None  # set by its first admission
                await self._adopt(tp, lease)
            if not self.leases.holds(lease):
                return  # revoked since delivered (waiting or adopting): unacked, consumed again
            window = self._windows.get(tp)
            if window is None:
                epoch = self._adopted[tp]
                window = _Window(lease, tp.partition, offset, epoch, opened_at=self.clock())
                self._windows[tp] = window
            admitted = self.stage.admit(tp, event)
            if window.add(event, offset, admitted):
                self.stats.duplicates += 1  # a later answer of the same prompt
            self.stats.grow(admitted.size)
            if len(window.events) >= self.max_records or window.tokens >= self.max_tokens:
                await self._flush(tp)
            while self.stats.open_bytes > self.max_open_bytes and self._windows:
                largest = max(self._windows, key=lambda key: self._windows[key].size)
                self.stats.budget_flushes += 1
                await self._flush(largest)
            # windows being written count too: intake waits for them to free their bytes
            while self._flushes.bytes + self.stats.open_bytes > self.max_open_bytes:
                if not self._flushes.tasks:
                    break
                await self._flushes.wait_any()

    async def flush_idle(self) -> None:
        """Once a window has been open for `idle_flush_s`, flush every open window, into one
        shard (called by a timer)."""
        deadline = self.clock() - self.idle_flush_s
        async with self._lock:
            if any(w.opened_at <= deadline for w in self._windows.values()):
                await self._flush(*self._windows)

    async def drain(self) -> None:
        """Wait for every flush in flight (a failed one raises here)."""
        while self._flushes.tasks:
            await self._flushes.wait_any()

    def on_revoked(self, partitions: Iterable[Hashable]) -> None:
        """Drop the partitions' open windows unacked (the new owner redoes them)."""
        partitions = list(partitions)
        for tp in partitions:
            window = self._windows.pop(tp, None)
            if window is not None:
                self.stats.grow(-window.size)
            self._adopted.pop(tp, None)
        self.leases.revoke(partitions)

    # -- the protocol --------------------------------------------------------------------------

    async def _adopt(self, tp: Any, lease: Lease) -> None:
        """First event of a partition since (re)assignment: the lease's start is the committed
        position, `epoch()` the group epoch of this assignment."""
        epoch = self.epoch()
        first_offset = lease.start
        assert first_offset is not None
        if (writing := self._flushes.last.get(tp)) is not None:
            # this worker's own write of the partition (before a revocation) lands first, so
            # that the markers read next include it
            await asyncio.wait([writing])
        removed = await self._storage.remove_uncommitted(tp.partition, first_offset, epoch)
        if not self.leases.holds(lease):
            return  # revoked meanwhile: not ours in this epoch
        self._adopted[tp] = epoch
        self.stats.adopted += 1
        self.stats.removed += removed
        log.info(
            "partition %s: adopted at offset %d in epoch %d (%d uncommitted windows removed)",
            tp.partition,
            first_offset,
            epoch,
            removed,
        )

    async def _flush(self, *tps: Hashable) -> None:
        """Start writing the partitions' windows, into one shard (`_Flushes.start`)."""
        batch = [(tp, w) for tp in tps if (w := self._windows.pop(tp, None)) is not None]
        if not batch:
            return
        size = sum(window.size for _, window in batch)
        self.stats.grow(-size)
        await self._flushes.start([tp for tp, _ in batch], size, partial(self._write, batch))

    async def _write(
        self, batch: list[tuple[Hashable, _Window[T]]], previous: list[asyncio.Task[None]]
    ) -> None:
        try:
            fenced = await self._fenced([window for _, window in batch])
            live = [entry for entry, fence in zip(batch, fenced, strict=True) if not fence]
            if not live:
                return
            prepared = [await self.stage.prepare(window.items) for _, window in live]
            if previous:
                await asyncio.wait(previous)
                if any(p.cancelled() or p.exception() is not None for p in previous):
                    # acking past an unacked window would commit its offsets (faust#606)
                    partitions = ", ".join(str(window.partition) for _, window in live)
                    raise RuntimeError(f"partitions {partitions}: an earlier write failed")
            await self._commit(live, prepared)
        finally:
            self._flushes.ended([tp for tp, _ in batch], sum(w.size for _, w in batch))

    async def _commit(
        self, batch: list[tuple[Hashable, _Window[T]]], prepared: list[Prepared]
    ) -> None:
        windows = [w.rows(p) for (_, w), p in zip(batch, prepared, strict=True)]
        markers = await self._storage.write(windows)
        for (_, window), marker in zip(batch, markers, strict=True):
            if not self.leases.holds(window.lease):
                continue  # revoked while writing (maybe re-adopted since): never acked, redone
            if (await self._fenced([window]))[0]:
                # sealed while writing: never acked, so past the sealed offsets; not left behind
                await self._storage.remove(
                    "removing a window written after the seal",
                    window.partition,
                    window.start_offset,
                    window.epoch,
                )
                continue
            if not self.leases.holds(window.lease):
                continue  # revoked while the seal was checked: as above (no await from here on)
            self.stage.committed(marker, window.items)
            for event in window.events:
                # in offset order, from the lease's start: raises on anything else (a bug)
                self.leases.acked(window.lease, int(event.message.offset))
                event.ack()

    async def _fenced(self, windows: list[_Window[T]]) -> list[bool]:
        """Per window, whether the version is sealed (or being sealed) past it: then the sink
        stops, saying so once."""
        if self.sealed is not None:
            return [True] * len(windows)
        fenced = await self._storage.fenced([(w.partition, w.end_offset) for w in windows])
        first = next((w for w, fence in zip(windows, fenced, strict=True) if fence), None)
        if first is not None and self.sealed is None:  # not said by a write checked meanwhile
            self.sealed = sealed_line(
                self.store.layout.dataset, first.partition, first.start_offset
            )
            self.on_sealed(self.sealed)
        return fenced
