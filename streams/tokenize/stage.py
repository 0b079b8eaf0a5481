"""The tokenize stage: completions → samples → windowed Arrow shards with commit markers.

Per completions partition one open window of contiguous offsets. A window is flushed when it
reaches the record or token budget, or when it has been open `idle_flush_s`; its events are
acked only after the shard and its marker are durably written, so offsets are committed after
the data. Each prompt_id is written once per dataset version: the window dedups within itself,
and a partition's already committed ids are loaded from its markers when the partition arrives.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from sinks.shards import SampleRow, ShardStore
from streams.core.faults import AFTER_MARKER, CrashPoint
from streams.core.faust_app import Event
from streams.core.records import CompletionRecord, DeadLetter, RecordError
from streams.core.settings import TokenizeSettings
from streams.tokenize.samples import Sample, SampleBuilder, SampleError

log = logging.getLogger(__name__)

STAGE = "tokenize"
Send = Callable[[str, bytes, bytes], Awaitable[None]]


@dataclass
class Window:
    partition: int
    start_offset: int
    opened_at: float = field(default_factory=time.monotonic)
    end_offset: int = -1
    events: list[Event] = field(default_factory=list)
    completions: list[CompletionRecord] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    prompt_ids: set[str] = field(default_factory=set)
    tokens: int = 0


@dataclass
class TokenizeStats:
    samples: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    shards: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    drifted: int = 0
    compared: int = 0
    rejected: dict[str, int] = field(default_factory=dict)


class TokenizeWorker:
    def __init__(
        self,
        settings: TokenizeSettings,
        builder: SampleBuilder,
        store: ShardStore,
        send: Send,
        dead_letters_topic: str,
    ):
        self.settings = settings
        self.builder = builder
        self.store = store
        self.send = send
        self.dead_letters_topic = dead_letters_topic
        self.stats = TokenizeStats()
        self._windows: dict[Hashable, Window] = {}
        self._committed_ids: dict[Hashable, set[str]] = {}
        self._lock = asyncio.Lock()
        self._crash_after_marker = CrashPoint(AFTER_MARKER)

    # -- the agent loop ----------------------------------------------------------------------

    async def add(self, event: Event) -> None:
        tp = event.message.tp
        offset = int(event.message.offset)
        async with self._lock:
            if tp not in self._committed_ids:
                await self._adopt_partition(tp, offset)
            window = self._windows.get(tp)
            if window is None:
                window = self._windows[tp] = Window(partition=tp.partition, start_offset=offset)
            window.events.append(event)
            window.end_offset = offset
            self._accept(window, tp, event)
            if (
                len(window.events) >= self.settings.shard_max_records
                or window.tokens >= self.settings.shard_max_tokens
            ):
                await self._flush(tp)

    def _accept(self, window: Window, tp: Hashable, event: Event) -> None:
        raw = bytes(event.value)
        try:
            completion = CompletionRecord.decode(raw)
        except RecordError as err:
            key = event.key.decode("utf-8", "replace") if event.key else None
            window.dead_letters.append(
                DeadLetter.for_payload(STAGE, err.kind, err.message, raw, key)
            )
            return
        pid = completion.prompt_id
        if pid in window.prompt_ids or pid in self._committed_ids[tp]:
            self.stats.duplicates += 1  # a redelivery or a regeneration: written once
            return
        window.prompt_ids.add(pid)
        window.completions.append(completion)
        usage = completion.usage or {}
        window.tokens += int(usage.get("total_tokens") or 0) or len(completion.content) // 3

    async def flush_idle(self) -> None:
        """Flush windows open longer than `idle_flush_s` (called by a timer)."""
        deadline = time.monotonic() - self.settings.idle_flush_s
        async with self._lock:
            for tp in [tp for tp, w in self._windows.items() if w.opened_at <= deadline]:
                await self._flush(tp)

    async def flush_all(self) -> None:
        async with self._lock:
            for tp in list(self._windows):
                await self._flush(tp)

    def forget_partitions(self, partitions: Any) -> None:
        """Revoked: unflushed windows are dropped (never acked), their new owner redoes them."""
        for tp in partitions:
            self._windows.pop(tp, None)
            self._committed_ids.pop(tp, None)

    # -- partitions and windows --------------------------------------------------------------

    async def _adopt_partition(self, tp: Any, first_offset: int) -> None:
        """First event of a partition since (re)assignment: `first_offset` is the committed
        position. Markers at or past it are from windows written but never committed (a crash
        between shard and offset commit): they are removed, since they are about to be
        rewritten, possibly with other window bounds. Markers before it are the ids to skip."""
        markers = await self._retry("reading markers", self.store.markers, tp.partition)
        committed: set[str] = set()
        for marker in markers:
            if marker.start_offset >= first_offset:
                await self._retry(
                    "removing an uncommitted shard",
                    self.store.delete_window,
                    marker.partition,
                    marker.start_offset,
                )
            else:
                committed.update(marker.prompt_ids)
        self._committed_ids[tp] = committed
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
        built = await asyncio.to_thread(self.builder.build_many, window.completions)
        rows: list[SampleRow] = []
        for completion, result in zip(window.completions, built, strict=True):
            if isinstance(result, SampleError):
                window.dead_letters.append(
                    DeadLetter.for_payload(
                        STAGE,
                        result.kind,
                        result.message,
                        completion.encode(),
                        completion.prompt_id,
                    )
                )
                self.stats.rejected[result.kind] = self.stats.rejected.get(result.kind, 0) + 1
                continue
            rows.append(self._row(completion, result))
        # Dead letters first: once the marker exists the window's offsets may be committed.
        for letter in window.dead_letters:
            await self._retry_async(
                "writing a dead letter",
                self.send,
                self.dead_letters_topic,
                (letter.prompt_id or "").encode(),
                letter.encode(),
            )
        marker = await self._retry(
            "writing a shard",
            self.store.write_shard,
            window.partition,
            window.start_offset,
            window.end_offset,
            rows,
        )
        self._crash_after_marker.hit()
        committed = self._committed_ids.get(tp)
        if committed is None:
            return  # revoked while writing: its new owner re-adopts it from the markers
        committed.update(window.prompt_ids)
        for event in window.events:
            event.ack()
        self.stats.shards += 1 if rows else 0
        self.stats.samples += marker.rows
        self.stats.tokens += marker.tokens
        self.stats.loss_tokens += marker.loss_tokens
        self.stats.dead_letters += len(window.dead_letters)

    def _row(self, completion: CompletionRecord, sample: Sample) -> SampleRow:
        if sample.drift is not None:
            self.stats.compared += 1
            self.stats.drifted += int(sample.drift)
        return SampleRow(
            prompt_id=completion.prompt_id,
            source=completion.source,
            input_ids=sample.input_ids,
            loss_mask=sample.loss_mask,
            finish_reason=completion.finish_reason or "",
            token_source=sample.token_source,
            drift=sample.drift,
            conversation_id=(completion.meta or {}).get("conversation_id"),
            truncated=sample.truncated,
        )

    # -- outages -----------------------------------------------------------------------------

    async def _retry(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run blocking storage I/O in a thread, waiting out outages with backoff."""
        return await self._retry_async(what, asyncio.to_thread, fn, *args)

    async def _retry_async(self, what: str, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        delay = 1.0
        while True:
            try:
                return await fn(*args)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning(
                    "%s failed (%s: %s); retrying in %.0fs",
                    what,
                    type(err).__name__,
                    str(err).splitlines()[0][:200] if str(err) else "",
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 60.0)
