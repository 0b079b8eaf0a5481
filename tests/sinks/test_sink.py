"""The shard sink's protocol on the local filesystem, with in-memory events (no Kafka, no S3)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sinks.shards import SampleRow, ShardMarker, ShardStore
from sinks.sink import Admitted, ShardSink
from streams.core.retry import Backoff

NO_WAIT = Backoff(initial_s=0.0, max_s=0.0)


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


@dataclass(frozen=True)
class Message:
    tp: TP
    offset: int


@dataclass
class FakeEvent:
    """What the sink needs of a faust Event; `ack` appends to the shared log and runs a check."""

    message: Message
    value: bytes
    log: list[tuple[Any, ...]]
    on_ack: Callable[[FakeEvent], None] | None = None
    key: bytes | None = None

    def ack(self) -> bool:
        if self.on_ack is not None:
            self.on_ack(self)
        self.log.append(("ack", self.message.tp.partition, self.message.offset))
        return True


class IdStage:
    """A stage whose items are the prompt ids in the event values, skipping ids already seen."""

    def __init__(self, log: list[tuple[Any, ...]], tokens: int = 1):
        self.log = log
        self.tokens = tokens
        self.sink: ShardSink[str] | None = None

    def admit(self, tp: Hashable, event: Any) -> Admitted[str] | None:
        pid = bytes(event.value).decode()
        assert self.sink is not None
        if self.sink.seen(tp, pid):
            self.log.append(("duplicate", pid))
            return None
        return Admitted(pid, key=pid, tokens=self.tokens)

    async def prepare(self, items: list[str]) -> list[SampleRow]:
        self.log.append(("prepare", *items))
        return [SampleRow(pid, "src", [1, 2, 3], [0, 1, 1], "stop", "server") for pid in items]

    def committed(self, marker: ShardMarker, items: list[str]) -> None:
        self.log.append(("committed", marker.partition, marker.start_offset, marker.end_offset))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    store: ShardStore
    stage: IdStage
    sink: ShardSink[str]
    clock: Clock
    log: list[tuple[Any, ...]] = field(default_factory=list)

    def event(self, partition: int, offset: int, pid: str) -> FakeEvent:
        return FakeEvent(Message(TP("completions", partition), offset), pid.encode(), self.log)

    async def add(self, partition: int, offset: int, pid: str) -> FakeEvent:
        event = self.event(partition, offset, pid)
        await self.sink.add(event)
        return event

    def acks(self) -> list[tuple[int, int]]:
        return [(entry[1], entry[2]) for entry in self.log if entry[0] == "ack"]

    def marker_exists(self, partition: int, start_offset: int) -> bool:
        return Path(self.store.layout.marker(partition, start_offset)).exists()

    def shard_exists(self, partition: int, start_offset: int) -> bool:
        return Path(self.store.layout.shard(partition, start_offset)).exists()


def harness(
    store: ShardStore, *, max_records: int = 3, max_tokens: int = 1000, tokens: int = 1
) -> Harness:
    log: list[tuple[Any, ...]] = []
    stage = IdStage(log, tokens=tokens)
    clock = Clock()
    sink = ShardSink(
        store,
        stage,
        max_records=max_records,
        max_tokens=max_tokens,
        idle_flush_s=10.0,
        backoff=NO_WAIT,
        clock=clock,
    )
    stage.sink = sink
    return Harness(store, stage, sink, clock, log)


def test_events_are_acked_only_after_shard_and_marker_are_durable(tmp_path: Path) -> None:
    h = harness(ShardStore(f"file://{tmp_path}", "v1"), max_records=3)

    def marker_written(event: FakeEvent) -> None:
        assert h.marker_exists(0, 10) and h.shard_exists(0, 10)
        assert ("committed", 0, 10, 12) in h.log  # the stage's hook ran before any ack

    async def run() -> None:
        for offset, pid in ((10, "a"), (11, "b"), (12, "c")):
            event = h.event(0, offset, pid)
            event.on_ack = marker_written
            await h.sink.add(event)

    asyncio.run(run())
    assert h.acks() == [(0, 10), (0, 11), (0, 12)]
    assert [m.prompt_ids for m in h.store.markers()] == [["a", "b", "c"]]
    assert h.store.read_table().column("prompt_id").to_pylist() == ["a", "b", "c"]


def test_a_window_is_flushed_at_its_record_budget(tmp_path: Path) -> None:
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=2)

    async def run() -> None:
        await h.add(0, 0, "a")
        assert h.acks() == [] and h.store.markers() == []
        await h.add(0, 1, "b")
        assert h.acks() == [(0, 0), (0, 1)]
        for offset, pid in ((2, "c"), (3, "d"), (4, "e")):
            await h.add(0, offset, pid)

    asyncio.run(run())
    bounds = [(m.start_offset, m.end_offset, m.prompt_ids) for m in h.store.markers()]
    assert bounds == [(0, 1, ["a", "b"]), (2, 3, ["c", "d"])]
    assert h.acks() == [(0, 0), (0, 1), (0, 2), (0, 3)]  # offset 4's window is still open


def test_a_window_is_flushed_at_its_token_budget(tmp_path: Path) -> None:
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=100, max_tokens=10, tokens=4)

    async def run() -> None:
        for offset, pid in enumerate("abcd"):
            await h.add(0, offset, pid)

    asyncio.run(run())
    assert [m.prompt_ids for m in h.store.markers()] == [["a", "b", "c"]]
    assert h.acks() == [(0, 0), (0, 1), (0, 2)]


def test_an_idle_window_is_flushed_after_the_timeout(tmp_path: Path) -> None:
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=100)

    async def run() -> None:
        await h.add(0, 5, "a")
        h.clock.now += 5.0
        await h.add(1, 7, "b")  # opened later: idle later
        await h.add(0, 6, "c")  # a new event does not make the window younger
        h.clock.now += 4.9
        await h.sink.flush_idle()
        assert h.acks() == []
        h.clock.now += 0.1
        await h.sink.flush_idle()
        assert h.acks() == [(0, 5), (0, 6)]
        h.clock.now += 5.0
        await h.sink.flush_idle()

    asyncio.run(run())
    assert h.acks() == [(0, 5), (0, 6), (1, 7)]
    assert [(m.partition, m.prompt_ids) for m in h.store.markers()] == [(0, ["a", "c"]), (1, ["b"])]


def test_adoption_removes_uncommitted_windows_and_skips_committed_ids(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), "v1")

    def rows(*ids: str) -> list[SampleRow]:
        return [SampleRow(pid, "src", [1, 2], [0, 1], "stop", "server") for pid in ids]

    store.write_shard(0, 0, 9, rows("a", "b"))  # committed: before the committed offset 10
    store.write_shard(0, 10, 14, rows("x"))  # written, never committed (crash before the acks)
    store.write_shard(0, 15, 19, rows("y"))
    store.write_shard(1, 0, 30, rows("p"))  # another partition: not adopted here
    h = harness(store, max_records=4)

    async def run() -> None:
        await h.add(0, 10, "a")
        # adopted on its first event: the windows at or after offset 10 are gone
        assert not h.marker_exists(0, 10) and not h.shard_exists(0, 10)
        assert not h.marker_exists(0, 15) and not h.shard_exists(0, 15)
        assert h.marker_exists(0, 0) and h.marker_exists(1, 0)
        assert h.sink.seen(TP("completions", 0), "b")
        assert not h.sink.seen(TP("completions", 1), "p")  # not adopted yet
        await h.add(0, 11, "x")
        await h.add(0, 12, "b")
        await h.add(0, 13, "y")

    asyncio.run(run())
    assert [entry for entry in h.log if entry[0] == "duplicate"] == [
        ("duplicate", "a"),
        ("duplicate", "b"),
    ]
    markers = {(m.partition, m.start_offset): m for m in store.markers()}
    assert sorted(markers) == [(0, 0), (0, 10), (1, 0)]
    assert (markers[0, 10].end_offset, markers[0, 10].prompt_ids) == (13, ["x", "y"])
    assert h.acks() == [(0, 10), (0, 11), (0, 12), (0, 13)]  # skipped events are acked too


def test_ids_are_seen_in_the_open_window_and_after_its_commit(tmp_path: Path) -> None:
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=3)  # events, skipped ones too
    tp = TP("completions", 0)

    async def run() -> None:
        await h.add(0, 0, "a")
        assert h.sink.seen(tp, "a") and not h.sink.seen(tp, "b")
        await h.add(0, 1, "a")  # a redelivery in the same window
        await h.add(0, 2, "b")
        assert h.store.markers()[0].prompt_ids == ["a", "b"]
        await h.add(0, 3, "a")  # after the commit

    asyncio.run(run())
    assert [entry for entry in h.log if entry[0] == "duplicate"] == [
        ("duplicate", "a"),
        ("duplicate", "a"),
    ]


def test_revoke_drops_the_open_window_unacked(tmp_path: Path) -> None:
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=3)
    tp = TP("completions", 0)

    async def run() -> None:
        await h.add(0, 0, "a")
        await h.add(0, 1, "b")
        await h.add(1, 0, "q")
        h.sink.on_revoked([tp])
        assert not h.sink.seen(tp, "a")
        h.clock.now += 60.0
        await h.sink.flush_idle()  # flushes partition 1 only

    asyncio.run(run())
    assert h.acks() == [(1, 0)]
    assert [(m.partition, m.prompt_ids) for m in h.store.markers()] == [(1, ["q"])]
    assert not any(entry[0] == "prepare" and "a" in entry for entry in h.log)


def test_a_window_revoked_while_it_is_written_is_not_acked(tmp_path: Path) -> None:
    entered, release = threading.Event(), threading.Event()

    class SlowStore(ShardStore):
        def write_shard(
            self, partition: int, start_offset: int, end_offset: int, rows: Sequence[SampleRow]
        ) -> ShardMarker:
            entered.set()
            assert release.wait(timeout=30)
            return super().write_shard(partition, start_offset, end_offset, rows)

    h = harness(SlowStore(str(tmp_path), "v1"), max_records=2)

    async def run() -> None:
        await h.add(0, 0, "a")
        flushing = asyncio.create_task(h.add(0, 1, "b"))
        await asyncio.to_thread(entered.wait, 30)
        h.sink.on_revoked([TP("completions", 0)])
        release.set()
        await flushing

    asyncio.run(run())
    assert h.marker_exists(0, 0)  # the new owner removes it on adoption and redoes the window
    assert h.acks() == []
    assert not any(entry[0] == "committed" for entry in h.log)


def test_a_failed_storage_write_is_retried_and_nothing_is_acked_before_it_succeeds(
    tmp_path: Path,
) -> None:
    attempts: list[int] = []

    class FlakyStore(ShardStore):
        def write_shard(
            self, partition: int, start_offset: int, end_offset: int, rows: Sequence[SampleRow]
        ) -> ShardMarker:
            attempts.append(len(h.acks()))
            if len(attempts) == 1:
                raise OSError("S3 is down")
            return super().write_shard(partition, start_offset, end_offset, rows)

    h = harness(FlakyStore(str(tmp_path), "v1"), max_records=2)

    async def run() -> None:
        await h.add(0, 0, "a")
        await h.add(0, 1, "b")

    asyncio.run(run())
    assert attempts == [0, 0]  # nothing acked while the write had not succeeded
    assert h.acks() == [(0, 0), (0, 1)]
    assert h.store.markers()[0].prompt_ids == ["a", "b"]


def test_a_failed_marker_read_is_retried_before_the_partition_is_adopted(tmp_path: Path) -> None:
    class FlakyStore(ShardStore):
        failures = 2

        def markers(self, partition: int | None = None) -> list[ShardMarker]:
            if self.failures:
                self.failures -= 1
                raise OSError("S3 is down")
            return super().markers(partition)

    seed = ShardStore(str(tmp_path), "v1")
    seed.write_shard(0, 0, 0, [SampleRow("a", "src", [1], [1], "stop", "server")])
    h = harness(FlakyStore(str(tmp_path), "v1"), max_records=1)

    asyncio.run(h.add(0, 1, "a"))
    assert ("duplicate", "a") in h.log


@pytest.mark.parametrize("budget", ["records", "idle"])
def test_the_stage_is_prepared_then_committed_then_acked(tmp_path: Path, budget: str) -> None:
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=2 if budget == "records" else 100)

    async def run() -> None:
        await h.add(3, 40, "a")
        await h.add(3, 41, "b")
        h.clock.now += 10.0
        await h.sink.flush_idle()

    asyncio.run(run())
    assert h.log == [
        ("prepare", "a", "b"),
        ("committed", 3, 40, 41),
        ("ack", 3, 40),
        ("ack", 3, 41),
    ]
