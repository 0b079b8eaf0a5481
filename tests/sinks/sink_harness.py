"""The shard sink's test harness: in-memory events and a stage whose items are the event
values, over a store on the local filesystem (no Kafka, no S3)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sinks.shards import SampleRow, ShardMarker, ShardStore
from sinks.sink import Admitted, Prepared, ShardSink
from streams.core.retry import Backoff
from tests.fakes import TP, FakeEvent, Message

NO_WAIT = Backoff(initial_s=0.0, max_s=0.0)


def parse(value: str) -> tuple[str, str, str | None]:
    """An event value: `pid`, `pid=content` (a row whose source is the content) or `pid!kind`
    (a recorded drop) → (pid, content, drop kind)."""
    if "!" in value:
        pid, kind = value.split("!", 1)
        return pid, "", kind
    pid, _, content = value.partition("=")
    return pid, content or "src", None


class IdStage:
    """A stage whose items are the event values, keyed by their prompt id."""

    def __init__(self, log: list[tuple[Any, ...]], tokens: int = 1):
        self.log = log
        self.tokens = tokens

    def admit(self, tp: Hashable, event: Any) -> Admitted[str]:
        value = bytes(event.value).decode()
        pid, _, _ = parse(value)
        return Admitted(value, key=pid, tokens=self.tokens, size=len(event.value))

    async def prepare(self, items: list[str]) -> Prepared:
        self.log.append(("prepare", *items))
        rows, drops = [], {}
        for pid, content, kind in map(parse, items):
            if kind is not None:
                drops[pid] = kind
            else:
                rows.append(SampleRow(pid, content, [1, 2, 3], [0, 1, 1], "stop", "server"))
        return Prepared(rows, drops)

    def committed(self, marker: ShardMarker, items: list[str]) -> None:
        self.log.append(("committed", marker.partition, marker.start_offset, marker.end_offset))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Epoch:
    """The consumer group's epoch as the worker sees it; a test moves it."""

    def __init__(self, value: int):
        self.value = value

    def __call__(self) -> int:
        return self.value


@dataclass
class Harness:
    store: ShardStore
    stage: IdStage
    sink: ShardSink[str]
    clock: Clock
    epoch: Epoch
    log: list[tuple[Any, ...]] = field(default_factory=list)

    def event(self, partition: int, offset: int, value: str) -> FakeEvent:
        return FakeEvent(Message(TP("completions", partition), offset), value.encode(), self.log)

    async def add(self, partition: int, offset: int, value: str) -> FakeEvent:
        return await self.add_event(self.event(partition, offset, value))

    async def add_event(self, event: FakeEvent) -> FakeEvent:
        """Add, then wait for a flush it started: the tests look at the store at once."""
        await self.sink.add(event)
        await self.sink.drain()
        return event

    async def flush_idle(self) -> None:
        await self.sink.flush_idle()
        await self.sink.drain()

    def acks(self) -> list[tuple[int, int]]:
        return [(entry[1], entry[2]) for entry in self.log if entry[0] == "ack"]

    def marker_exists(self, partition: int, start_offset: int, epoch: int = 0) -> bool:
        return Path(self.store.layout.marker(partition, start_offset, epoch)).exists()

    def shard_exists(self, partition: int, start_offset: int, epoch: int = 0) -> bool:
        return Path(self.store.layout.shard(partition, start_offset, epoch)).exists()


def harness(
    store: ShardStore,
    *,
    max_records: int = 3,
    max_tokens: int = 1000,
    tokens: int = 1,
    max_open_bytes: int = 1 << 30,
    epoch: int = 0,
) -> Harness:
    log: list[tuple[Any, ...]] = []
    stage = IdStage(log, tokens=tokens)
    clock = Clock()
    current = Epoch(epoch)
    sink = ShardSink(
        store,
        stage,
        max_records=max_records,
        max_tokens=max_tokens,
        idle_flush_s=10.0,
        max_open_bytes=max_open_bytes,
        epoch=current,
        backoff=NO_WAIT,
        clock=clock,
    )
    return Harness(store, stage, sink, clock, current, log)


def windows(markers: Sequence[ShardMarker]) -> list[tuple[int, int, int, int]]:
    return [(m.partition, m.start_offset, m.end_offset, m.epoch) for m in markers]


def rows(*ids: str) -> list[SampleRow]:
    return [SampleRow(pid, "earlier", [1, 2], [0, 1], "stop", "server") for pid in ids]
