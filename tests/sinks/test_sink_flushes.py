"""The shard sink's writes in flight: intake beside them, their order, failures and retries,
revocation while writing, and the memory budget (tests/sinks/sink_harness.py)."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from sinks.reader import DatasetReader
from sinks.shards import ShardMarker, ShardStore, WindowRows
from sinks.sink import Prepared
from tests.polling import wait_for_async
from tests.sinks.sink_harness import (
    TP,
    FakeEvent,
    IdStage,
    harness,
    rows,
    windows,
)


class SlowStore(ShardStore):
    """Blocks the chosen calls until released (the test's event loop keeps running)."""

    def __init__(self, *args: Any, block: str, partition: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.block, self.partition = block, partition
        self.entered, self.release = threading.Event(), threading.Event()
        self.fenced_calls, self.fenced_free = 0, 0

    def _wait(self, what: str, partition: int | None) -> None:
        if what == self.block and self.partition in (None, partition):
            self.entered.set()
            assert self.release.wait(timeout=30)

    def write_windows(self, windows: Sequence[WindowRows]) -> list[ShardMarker]:
        for partition in {window.partition for window in windows}:
            self._wait("write", partition)
        return super().write_windows(windows)

    def markers(self, partition: int | None = None) -> list[ShardMarker]:
        self._wait("markers", partition)
        return super().markers(partition)

    def fenced(self) -> bool:
        self.fenced_calls += 1
        if self.fenced_calls > self.fenced_free:  # the sink asks before a write and after it
            self._wait("fenced", None)
        return super().fenced()


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
    written = store.write_windows

    def write_windows(windows: Sequence[WindowRows]) -> list[ShardMarker]:
        for window in windows:
            if window.start_offset == 1:
                stage.go.set()  # releases the first window early, if the second came first
            h.log.append(("write", window.start_offset))
        return written(windows)

    store.write_windows = write_windows  # type: ignore[method-assign]

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


@pytest.mark.parametrize(
    ("block", "free"),
    # the shard's write; then the seal's check after it (a revocation there raised LeaseError
    # in the worker's agent, which crashed and restarted): the sink asks before a write too
    [("write", 0), ("fenced", 1)],
    ids=["while-written", "while-the-seal-is-checked"],
)
def test_a_window_revoked_between_its_write_and_its_acks_is_not_acked(
    tmp_path: Path, block: str, free: int
) -> None:
    store = SlowStore(str(tmp_path), "v1", block=block)
    store.fenced_free = free
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
    h = harness(store, max_records=2, epoch=1)

    async def run() -> tuple[list[FakeEvent], list[FakeEvent]]:
        first = [await h.add(0, 0, "a=first")]
        first.append(h.event(0, 1, "b=first"))
        flushing = asyncio.create_task(h.sink.add(first[1]))
        await asyncio.to_thread(store.entered.wait, 30)
        # a rebalance while the window is written: partition 0 comes back in epoch 2,
        # from the committed offset 0
        h.sink.on_revoked([TP("completions", 0)])
        h.epoch.value = 2
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
    assert windows(h.store.markers()) == [(0, 0, 1, 2)]  # epoch 1's removed at adoption
    assert (h.sink.stats.adopted, h.sink.stats.removed) == (2, 1)
    assert DatasetReader(h.store).table()["source"].to_pylist() == ["again", "again"]


@pytest.mark.parametrize("rejoined", [False, True], ids=["revoked", "revoked-and-rejoined"])
def test_an_event_delivered_before_its_partition_was_revoked_is_dropped(
    tmp_path: Path, rejoined: bool
) -> None:
    # partition 1's flush holds the sink while an event of partition 0 waits for it; both are
    # revoked meanwhile (and the group may already have its next epoch)
    store = SlowStore(str(tmp_path), "v1", block="write", partition=1)
    h = harness(store, max_records=1, epoch=1)

    async def run() -> FakeEvent:
        flushing = asyncio.create_task(h.add(1, 0, "p"))
        await asyncio.to_thread(store.entered.wait, 30)
        stale = h.event(0, 0, "a=stale")
        waiting = asyncio.create_task(h.sink.add(stale))
        await asyncio.sleep(0)  # one turn of the loop: delivered, it waits for the sink
        h.sink.on_revoked([TP("completions", 0), TP("completions", 1)])
        if rejoined:
            h.epoch.value = 2
        store.release.set()
        await flushing
        await waiting
        h.epoch.value = 2
        await h.add(0, 0, "a=again")  # partition 0 assigned again, in epoch 2
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
    h = harness(store, max_records=1, epoch=1)

    async def run() -> FakeEvent:
        stale = h.event(0, 5, "a=stale")
        adopting = asyncio.create_task(h.sink.add(stale))
        await asyncio.to_thread(store.entered.wait, 30)
        h.sink.on_revoked([TP("completions", 0)])
        store.release.set()
        await adopting
        assert h.sink.stats.adopted == 0
        h.epoch.value = 2
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
    # the group's epoch may move on without this partition being revoked (a rebalance
    # that keeps it, under a cooperative protocol): its open window stays in its epoch
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=2, epoch=3)

    async def run() -> None:
        await h.add(0, 0, "a")
        h.epoch.value = 4
        await h.add(0, 1, "b")

    asyncio.run(run())
    assert windows(h.store.markers()) == [(0, 0, 1, 3)]
    assert h.acks() == [(0, 0), (0, 1)]


def test_a_failed_storage_write_is_retried_and_nothing_is_acked_before_it_succeeds(
    tmp_path: Path,
) -> None:
    attempts: list[int] = []

    class FlakyStore(ShardStore):
        def write_windows(self, windows: Sequence[WindowRows]) -> list[ShardMarker]:
            attempts.append(len(h.acks()))
            if len(attempts) == 1:
                raise OSError("S3 is down")
            return super().write_windows(windows)

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
