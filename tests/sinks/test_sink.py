"""The shard sink's protocol on the local filesystem, with in-memory events (no Kafka, no S3)."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sinks.reader import DatasetReader
from sinks.shards import SampleRow, ShardMarker, ShardStore
from sinks.sink import Admitted, Prepared, ShardSink
from streams.core.retry import Backoff
from tests.polling import wait_for_async

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
    acked: int = 0

    def ack(self) -> bool:
        if self.on_ack is not None:
            self.on_ack(self)
        self.acked += 1
        self.log.append(("ack", self.message.tp.partition, self.message.offset))
        return True


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


class Generation:
    """The consumer group's generation as the worker sees it; a test moves it."""

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
    generation: Generation
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

    def marker_exists(self, partition: int, start_offset: int, generation: int = 0) -> bool:
        return Path(self.store.layout.marker(partition, start_offset, generation)).exists()

    def shard_exists(self, partition: int, start_offset: int, generation: int = 0) -> bool:
        return Path(self.store.layout.shard(partition, start_offset, generation)).exists()


def harness(
    store: ShardStore,
    *,
    max_records: int = 3,
    max_tokens: int = 1000,
    tokens: int = 1,
    max_open_bytes: int = 1 << 30,
    generation: int = 0,
) -> Harness:
    log: list[tuple[Any, ...]] = []
    stage = IdStage(log, tokens=tokens)
    clock = Clock()
    current = Generation(generation)
    sink = ShardSink(
        store,
        stage,
        max_records=max_records,
        max_tokens=max_tokens,
        idle_flush_s=10.0,
        max_open_bytes=max_open_bytes,
        generation=current,
        backoff=NO_WAIT,
        clock=clock,
    )
    return Harness(store, stage, sink, clock, current, log)


def windows(markers: Sequence[ShardMarker]) -> list[tuple[int, int, int, int]]:
    return [(m.partition, m.start_offset, m.end_offset, m.generation) for m in markers]


def rows(*ids: str) -> list[SampleRow]:
    return [SampleRow(pid, "earlier", [1, 2], [0, 1], "stop", "server") for pid in ids]


def test_events_are_acked_only_after_shard_and_marker_are_durable(tmp_path: Path) -> None:
    h = harness(ShardStore(f"file://{tmp_path}", "v1"), max_records=3)

    def marker_written(event: FakeEvent) -> None:
        assert h.marker_exists(0, 10) and h.shard_exists(0, 10)
        assert ("committed", 0, 10, 12) in h.log  # the stage's hook ran before any ack

    async def run() -> None:
        for offset, pid in ((10, "a"), (11, "b"), (12, "c")):
            event = h.event(0, offset, pid)
            event.on_ack = marker_written
            await h.add_event(event)

    asyncio.run(run())
    assert h.acks() == [(0, 10), (0, 11), (0, 12)]
    assert [m.prompt_ids for m in h.store.markers()] == [["a", "b", "c"]]
    assert DatasetReader(h.store).table().column("prompt_id").to_pylist() == ["a", "b", "c"]


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
        await h.flush_idle()
        assert h.acks() == []
        h.clock.now += 0.1
        await h.flush_idle()
        assert h.acks() == [(0, 5), (0, 6)]
        h.clock.now += 5.0
        await h.flush_idle()

    asyncio.run(run())
    assert h.acks() == [(0, 5), (0, 6), (1, 7)]
    assert [(m.partition, m.prompt_ids) for m in h.store.markers()] == [(0, ["a", "c"]), (1, ["b"])]


def test_a_later_item_of_the_same_key_replaces_the_earlier_one_in_its_window(
    tmp_path: Path,
) -> None:
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=3)

    async def run() -> None:
        await h.add(0, 0, "a=first")
        await h.add(0, 1, "b")
        await h.add(0, 2, "a=second")  # a regenerated answer, in the same window
        await h.add(0, 3, "a=third")  # in the next window: written again
        h.clock.now += 10.0
        await h.flush_idle()

    asyncio.run(run())
    assert ("prepare", "a=second", "b") in h.log  # one item per key, where the first one was
    assert h.sink.stats.replaced == 1
    assert [m.prompt_ids for m in h.store.markers()] == [["a", "b"], ["a"]]
    assert h.acks() == [(0, 0), (0, 1), (0, 2), (0, 3)]  # the replaced event is acked too
    table = DatasetReader(h.store).table()
    assert list(zip(table["prompt_id"].to_pylist(), table["source"].to_pylist(), strict=True)) == [
        ("b", "src"),
        ("a", "third"),  # the latest answer; the window's earlier row is left out
    ]


def test_the_stage_s_drops_are_recorded_in_the_marker(tmp_path: Path) -> None:
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=3)

    async def run() -> None:
        await h.add(0, 0, "a")
        await h.add(0, 1, "b!policy_length")
        await h.add(0, 2, "c!template_error")

    asyncio.run(run())
    [marker] = h.store.markers()
    assert (marker.prompt_ids, marker.drops) == (
        ["a"],
        {"b": "policy_length", "c": "template_error"},
    )
    assert h.store.committed().drops == {"b": "policy_length", "c": "template_error"}
    assert h.acks() == [(0, 0), (0, 1), (0, 2)]


def test_adoption_removes_uncommitted_windows_of_older_generations_only(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), "v1")
    store.write_shard(0, 0, 9, rows("a", "b"), generation=1)  # committed: before offset 10
    store.write_shard(0, 10, 14, rows("x"), generation=1)  # written, never committed
    store.write_shard(0, 15, 19, rows("y"), generation=2)  # ours, before a restart
    store.write_shard(0, 20, 25, rows("z"), generation=3)  # a newer writer's: not ours
    store.write_shard(1, 10, 30, rows("p"), generation=1)  # another partition: not adopted
    h = harness(store, max_records=3, generation=2)

    async def run() -> None:
        await h.add(0, 10, "a=again")  # adopted on its first event, at the committed offset
        assert not h.marker_exists(0, 10, 1) and not h.shard_exists(0, 10, 1)
        assert not h.marker_exists(0, 15, 2) and not h.shard_exists(0, 15, 2)
        assert h.marker_exists(0, 0, 1) and h.marker_exists(0, 20, 3)
        assert h.marker_exists(1, 10, 1)
        assert (h.sink.stats.adopted, h.sink.stats.removed) == (1, 2)
        await h.add(0, 11, "x")
        await h.add(0, 12, "y")

    asyncio.run(run())
    assert windows(store.markers()) == [
        (0, 0, 9, 1),
        (0, 10, 12, 2),
        (0, 20, 25, 3),
        (1, 10, 30, 1),
    ]
    assert h.acks() == [(0, 10), (0, 11), (0, 12)]
    table = DatasetReader(
        store
    ).table()  # nothing skipped: the later answer of "a" replaces the first
    assert list(zip(table["prompt_id"].to_pylist(), table["source"].to_pylist(), strict=True)) == [
        ("b", "earlier"),
        ("a", "again"),
        ("x", "src"),
        ("y", "src"),
        ("z", "earlier"),
        ("p", "earlier"),
    ]


def test_a_zombie_s_write_after_the_new_owner_s_adoption_is_superseded(tmp_path: Path) -> None:
    # two workers on one dataset version; partition 0 moved from the zombie (generation 1) to
    # the new owner (generation 2), and the zombie has not noticed yet
    zombie = harness(ShardStore(str(tmp_path), "v1"), max_records=100, generation=1)
    owner = harness(ShardStore(str(tmp_path), "v1"), max_records=3, generation=2)

    async def run() -> None:
        for offset, pid in enumerate("abcd"):
            await zombie.add(0, offset, f"{pid}=zombie")  # its open window: [0, 3]
        for offset, pid in enumerate("abc"):
            await owner.add(0, offset, f"{pid}=owner")  # from the committed offset, 0
        assert windows(owner.store.markers()) == [(0, 0, 2, 2)]
        zombie.clock.now += 10.0
        await zombie.flush_idle()  # written after the owner's window, longer than it
        resolution = ShardStore(str(tmp_path), "v1").committed()
        assert windows(resolution.windows) == [(0, 0, 2, 2)]
        assert windows(resolution.superseded) == [(0, 0, 3, 1)]
        await owner.add(0, 3, "d=owner")
        owner.clock.now += 10.0
        await owner.flush_idle()

    asyncio.run(run())
    store = ShardStore(str(tmp_path), "v1")  # a reader
    resolution = store.committed()
    assert windows(resolution.windows) == [(0, 0, 2, 2), (0, 3, 3, 2)]
    assert windows(resolution.superseded) == [(0, 0, 3, 1)]
    assert resolution.superseded[0].written_at > resolution.windows[0].written_at
    table = DatasetReader(store).table()
    assert table["prompt_id"].to_pylist() == ["a", "b", "c", "d"]
    assert set(table["source"].to_pylist()) == {"owner"}


def test_revoke_drops_the_open_window_unacked(tmp_path: Path) -> None:
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=3)
    tp = TP("completions", 0)

    async def run() -> None:
        await h.add(0, 0, "a")
        await h.add(0, 1, "b")
        await h.add(1, 0, "qq")
        h.sink.on_revoked([tp])
        assert h.sink.stats.open_bytes == 2  # partition 1's window only
        h.clock.now += 60.0
        await h.flush_idle()  # flushes partition 1 only

    asyncio.run(run())
    assert h.acks() == [(1, 0)]
    assert [(m.partition, m.prompt_ids) for m in h.store.markers()] == [(1, ["qq"])]
    assert not any(entry[0] == "prepare" and "a" in entry for entry in h.log)
    assert h.sink.stats.open_bytes == 0


class SlowStore(ShardStore):
    """Blocks the chosen calls until released (the test's event loop keeps running)."""

    def __init__(self, *args: Any, block: str, partition: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.block, self.partition = block, partition
        self.entered, self.release = threading.Event(), threading.Event()

    def _wait(self, what: str, partition: int | None) -> None:
        if what == self.block and self.partition in (None, partition):
            self.entered.set()
            assert self.release.wait(timeout=30)

    def write_shard(self, partition: int, *args: Any, **kwargs: Any) -> ShardMarker:
        self._wait("write", partition)
        return super().write_shard(partition, *args, **kwargs)

    def markers(self, partition: int | None = None) -> list[ShardMarker]:
        self._wait("markers", partition)
        return super().markers(partition)


def test_intake_goes_on_while_a_window_is_written(tmp_path: Path) -> None:
    store = SlowStore(str(tmp_path), "v1", block="write", partition=0)
    h = harness(store, max_records=1)

    async def run() -> None:
        await h.sink.add(h.event(0, 0, "a"))  # its write blocks in the store
        await asyncio.to_thread(store.entered.wait, 30)
        for offset, pid in enumerate("bcd"):  # another partition's windows, written meanwhile
            await h.sink.add(h.event(1, offset, pid))

        async def three_acks() -> bool:
            return len(h.acks()) == 3

        await wait_for_async(three_acks, 10, "partition 1's windows acked")
        assert h.acks() == [(1, 0), (1, 1), (1, 2)]  # partition 0's window is still unacked
        store.release.set()
        await h.sink.drain()

    asyncio.run(run())
    assert h.acks()[-1] == (0, 0)
    assert h.sink.stats.open_bytes == 0


class HeldStage(IdStage):
    """`prepare` of an item named "slow" waits for `go` (at most `hold_s`)."""

    def __init__(self, log: list[tuple[Any, ...]], hold_s: float):
        super().__init__(log)
        self.go, self.hold_s, self.held = asyncio.Event(), hold_s, False

    async def prepare(self, items: list[str]) -> Prepared:
        if "slow" in items:
            try:
                await asyncio.wait_for(self.go.wait(), self.hold_s)
            except TimeoutError:
                self.held = True
        return await super().prepare(items)


def test_a_partition_s_windows_are_written_and_acked_in_offset_order(tmp_path: Path) -> None:
    # the first window is still being prepared when the second is ready: the second waits,
    # since a marker or an ack must never pass an earlier window of its partition
    store = ShardStore(str(tmp_path), "v1")
    h = harness(store, max_records=1)
    stage = HeldStage(h.log, hold_s=2.0)
    h.sink.stage = stage
    written = store.write_shard

    def write_shard(partition: int, start: int, *args: Any, **kwargs: Any) -> ShardMarker:
        if start == 1:
            stage.go.set()  # releases the first window early, if the second came first
        h.log.append(("write", start))
        return written(partition, start, *args, **kwargs)

    store.write_shard = write_shard  # type: ignore[method-assign]

    async def run() -> None:
        await h.sink.add(h.event(0, 0, "slow"))
        await h.sink.add(h.event(0, 1, "b"))
        await h.sink.drain()

    asyncio.run(run())
    assert stage.held  # the second window did not write while the first was prepared
    assert [entry for entry in h.log if entry[0] in ("write", "ack")] == [
        ("write", 0),
        ("ack", 0, 0),
        ("write", 1),
        ("ack", 0, 1),
    ]


class FailingStage(IdStage):
    async def prepare(self, items: list[str]) -> Prepared:
        if "boom" in items:
            raise RuntimeError("a bug in the stage")
        return await super().prepare(items)


def test_a_failed_flush_stops_intake_and_nothing_after_it_in_its_partition_is_acked(
    tmp_path: Path,
) -> None:
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=1)
    h.sink.stage = FailingStage(h.log)

    async def run() -> None:
        await h.sink.add(h.event(0, 0, "boom"))
        await h.sink.add(h.event(0, 1, "b"))  # may be flushed before the failure is seen
        with pytest.raises(RuntimeError, match=r"a bug in the stage|an earlier write failed"):
            await h.sink.drain()
        with pytest.raises(RuntimeError):  # the agent stops at its next event at the latest
            await h.sink.add(h.event(0, 2, "c"))
            await h.sink.drain()

    asyncio.run(run())
    assert h.acks() == []
    assert h.store.markers() == []


def test_a_window_revoked_while_it_is_written_is_not_acked(tmp_path: Path) -> None:
    store = SlowStore(str(tmp_path), "v1", block="write")
    h = harness(store, max_records=2)

    async def run() -> None:
        await h.add(0, 0, "a")
        flushing = asyncio.create_task(h.add(0, 1, "b"))
        await asyncio.to_thread(store.entered.wait, 30)
        h.sink.on_revoked([TP("completions", 0)])
        store.release.set()
        await flushing

    asyncio.run(run())
    assert h.marker_exists(0, 0)  # the new owner removes it on adoption and redoes the window
    assert h.acks() == []
    assert not any(entry[0] == "committed" for entry in h.log)


def test_a_window_revoked_and_readopted_in_a_new_generation_while_written_is_not_acked(
    tmp_path: Path,
) -> None:
    store = SlowStore(str(tmp_path), "v1", block="write")
    h = harness(store, max_records=2, generation=1)

    async def run() -> tuple[list[FakeEvent], list[FakeEvent]]:
        first = [await h.add(0, 0, "a=first")]
        first.append(h.event(0, 1, "b=first"))
        flushing = asyncio.create_task(h.sink.add(first[1]))
        await asyncio.to_thread(store.entered.wait, 30)
        # a rebalance while the window is written: partition 0 comes back in generation 2,
        # from the committed offset 0
        h.sink.on_revoked([TP("completions", 0)])
        h.generation.value = 2
        again = [h.event(0, 0, "a=again"), h.event(0, 1, "b=again")]
        readopting = asyncio.create_task(h.sink.add(again[0]))
        store.release.set()
        await flushing
        await readopting
        await h.add_event(again[1])
        return first, again

    first, again = asyncio.run(run())
    assert [event.acked for event in first] == [0, 0]
    assert [event.acked for event in again] == [1, 1]
    assert [entry for entry in h.log if entry[0] == "committed"] == [("committed", 0, 0, 1)]
    assert windows(h.store.markers()) == [(0, 0, 1, 2)]  # generation 1's removed at adoption
    assert (h.sink.stats.adopted, h.sink.stats.removed) == (2, 1)
    assert DatasetReader(h.store).table()["source"].to_pylist() == ["again", "again"]


@pytest.mark.parametrize("rejoined", [False, True], ids=["revoked", "revoked-and-rejoined"])
def test_an_event_delivered_before_its_partition_was_revoked_is_dropped(
    tmp_path: Path, rejoined: bool
) -> None:
    # partition 1's flush holds the sink while an event of partition 0 waits for it; both are
    # revoked meanwhile (and the group may already have its next generation)
    store = SlowStore(str(tmp_path), "v1", block="write", partition=1)
    h = harness(store, max_records=1, generation=1)

    async def run() -> FakeEvent:
        flushing = asyncio.create_task(h.add(1, 0, "p"))
        await asyncio.to_thread(store.entered.wait, 30)
        stale = h.event(0, 0, "a=stale")
        waiting = asyncio.create_task(h.sink.add(stale))
        await asyncio.sleep(0)  # one turn of the loop: delivered, it waits for the sink
        h.sink.on_revoked([TP("completions", 0), TP("completions", 1)])
        if rejoined:
            h.generation.value = 2
        store.release.set()
        await flushing
        await waiting
        h.generation.value = 2
        await h.add(0, 0, "a=again")  # partition 0 assigned again, in generation 2
        return stale

    stale = asyncio.run(run())
    assert stale.acked == 0
    assert windows(h.store.markers()) == [(0, 0, 0, 2), (1, 0, 0, 1)]
    assert h.acks() == [(0, 0)]  # partition 1's window was revoked while written
    assert DatasetReader(h.store).table()["source"].to_pylist() == ["again", "src"]


def test_a_partition_revoked_while_it_is_adopted_is_adopted_again_in_the_next_generation(
    tmp_path: Path,
) -> None:
    store = SlowStore(str(tmp_path), "v1", block="markers")
    h = harness(store, max_records=1, generation=1)

    async def run() -> FakeEvent:
        stale = h.event(0, 5, "a=stale")
        adopting = asyncio.create_task(h.sink.add(stale))
        await asyncio.to_thread(store.entered.wait, 30)
        h.sink.on_revoked([TP("completions", 0)])
        store.release.set()
        await adopting
        assert h.sink.stats.adopted == 0
        h.generation.value = 2
        await h.add(0, 5, "a=again")
        return stale

    stale = asyncio.run(run())
    assert stale.acked == 0
    assert h.sink.stats.adopted == 1
    assert windows(h.store.markers()) == [(0, 5, 5, 2)]
    assert DatasetReader(h.store).table()["source"].to_pylist() == ["again"]


def test_open_windows_stay_within_the_memory_budget(tmp_path: Path) -> None:
    budget = 400
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=10_000, max_tokens=10**9)
    h.sink.max_open_bytes = budget
    rng = random.Random(7)
    offsets = dict.fromkeys(range(12), 0)
    events: list[FakeEvent] = []

    async def run() -> None:
        for n in range(600):  # a backlog many times the budget, over 12 partitions
            partition = rng.randrange(12)
            value = f"p{n:04d}=" + "x" * rng.randrange(1, 40)
            events.append(await h.add(partition, offsets[partition], value))
            offsets[partition] += 1
            assert h.sink.stats.open_bytes <= budget
        h.clock.now += 60.0
        await h.flush_idle()

    asyncio.run(run())
    largest = max(len(event.value) for event in events)
    assert sum(len(event.value) for event in events) > 10 * budget
    assert h.sink.stats.peak_open_bytes <= budget + largest
    assert h.sink.stats.budget_flushes > 0
    assert h.sink.stats.open_bytes == 0
    assert [event.acked for event in events] == [1] * len(events)
    prompt_ids = DatasetReader(h.store).table()["prompt_id"].to_pylist()
    assert sorted(prompt_ids) == [f"p{n:04d}" for n in range(600)]


def test_the_memory_budget_flushes_the_largest_window_first(tmp_path: Path) -> None:
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=100, max_open_bytes=100)

    async def run() -> None:
        await h.add(0, 0, "a=" + "x" * 28)  # 30 bytes
        await h.add(1, 0, "b=" + "x" * 38)  # 40 bytes: the largest window
        await h.add(2, 0, "c=" + "x" * 8)
        await h.add(0, 1, "d=xxx")  # partition 0: 35 bytes
        assert h.acks() == []
        await h.add(2, 1, "e=" + "x" * 23)  # 110 bytes open: partition 1's 40 goes first
        assert h.acks() == [(1, 0)]
        assert (h.sink.stats.open_bytes, h.sink.stats.budget_flushes) == (70, 1)

    asyncio.run(run())
    assert h.sink.stats.peak_open_bytes == 110


def test_a_window_keeps_the_generation_of_its_adoption(tmp_path: Path) -> None:
    # the group's generation may move on without this partition being revoked (a rebalance
    # that keeps it, under a cooperative protocol): its open window stays in its generation
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=2, generation=3)

    async def run() -> None:
        await h.add(0, 0, "a")
        h.generation.value = 4
        await h.add(0, 1, "b")

    asyncio.run(run())
    assert windows(h.store.markers()) == [(0, 0, 1, 3)]
    assert h.acks() == [(0, 0), (0, 1)]


def test_a_failed_storage_write_is_retried_and_nothing_is_acked_before_it_succeeds(
    tmp_path: Path,
) -> None:
    attempts: list[int] = []

    class FlakyStore(ShardStore):
        def write_shard(self, *args: Any, **kwargs: Any) -> ShardMarker:
            attempts.append(len(h.acks()))
            if len(attempts) == 1:
                raise OSError("S3 is down")
            return super().write_shard(*args, **kwargs)

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
    seed.write_shard(0, 1, 4, rows("a"))  # at the committed offset: never committed
    store = FlakyStore(str(tmp_path), "v1")
    h = harness(store, max_records=1)

    asyncio.run(h.add(0, 1, "b"))
    assert store.failures == 0
    assert (h.sink.stats.adopted, h.sink.stats.removed) == (1, 1)
    assert [m.prompt_ids for m in store.markers()] == [["b"]]


@pytest.mark.parametrize("budget", ["records", "idle"])
def test_the_stage_is_prepared_then_committed_then_acked(tmp_path: Path, budget: str) -> None:
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=2 if budget == "records" else 100)

    async def run() -> None:
        await h.add(3, 40, "a")
        await h.add(3, 41, "b")
        h.clock.now += 10.0
        await h.flush_idle()

    asyncio.run(run())
    assert h.log == [
        ("prepare", "a", "b"),
        ("committed", 3, 40, 41),
        ("ack", 3, 40),
        ("ack", 3, 41),
    ]


# -- sealed means sealed -------------------------------------------------------------------


def test_a_window_after_the_seal_is_not_written_nor_acked_and_the_sink_says_so_once(
    tmp_path: Path,
) -> None:
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=2)
    said: list[str] = []
    h.sink.on_sealed = said.append

    async def run() -> None:
        await h.add(0, 0, "a")
        await h.add(0, 1, "b")  # a full window, committed before the seal
        h.store.seal({0: 2})
        for offset, pid in ((2, "c"), (3, "d"), (4, "e"), (5, "f")):
            await h.add(0, offset, pid)
        await h.flush_idle()

    asyncio.run(run())
    assert h.acks() == [(0, 0), (0, 1)]
    assert windows(h.store.markers()) == [(0, 0, 1, 0)]
    # the window was refused before it was prepared (no dead letter sent for it)
    assert [e for e in h.log if e[0] == "prepare"] == [("prepare", "a", "b")]
    assert len(said) == 1 and "v1 is sealed" in said[0] and "partition 0 offset 2" in said[0]
    assert h.sink.sealed == said[0]


def test_a_window_written_while_the_seal_lands_is_removed_and_not_acked(tmp_path: Path) -> None:
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=2)
    said: list[str] = []
    h.sink.on_sealed = said.append
    prepare = h.stage.prepare

    async def fence_while_preparing(items: list[str]) -> Prepared:
        prepared = await prepare(items)
        if "c" in items:  # `draftgen seal` fences the version while this window is built
            h.store.write_fence()
        return prepared

    h.stage.prepare = fence_while_preparing  # type: ignore[method-assign]

    async def run() -> None:
        for offset, pid in ((0, "a"), (1, "b"), (2, "c"), (3, "d")):
            await h.add(0, offset, pid)

    asyncio.run(run())
    assert h.acks() == [(0, 0), (0, 1)]
    assert windows(h.store.markers()) == [(0, 0, 1, 0)]
    assert not h.marker_exists(0, 2) and not h.shard_exists(0, 2)
    assert len(said) == 1
    # sealed at the committed offsets, the version is the first window only
    manifest = h.store.seal({0: 2})
    assert manifest.samples == 2
    assert sorted(DatasetReader(h.store).table()["prompt_id"].to_pylist()) == ["a", "b"]


def test_windows_checked_against_the_seal_at_once_say_it_once(tmp_path: Path) -> None:
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=1)
    said: list[str] = []
    h.sink.on_sealed = said.append
    h.store.write_fence()

    async def run() -> None:
        # two windows flushed together (the sink writes up to two at a time)
        await h.sink.add(h.event(0, 0, "a"))
        await h.sink.add(h.event(1, 0, "b"))
        await h.sink.drain()

    asyncio.run(run())
    assert h.acks() == [] and h.store.markers() == []
    assert len(said) == 1
