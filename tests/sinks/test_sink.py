"""The shard sink's protocol on the local filesystem, with in-memory events (no Kafka, no S3):
windows, keys, drops, adoption and revocation (tests/sinks/sink_harness.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sinks.reader import DatasetReader
from sinks.shards import ShardStore
from tests.sinks.sink_harness import (
    TP,
    FakeEvent,
    harness,
    rows,
    windows,
)


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


def test_an_idle_window_is_flushed_after_the_timeout_with_every_open_window_in_one_shard(
    tmp_path: Path,
) -> None:
    h = harness(ShardStore(str(tmp_path), "v1"), max_records=100)

    async def run() -> None:
        await h.add(0, 5, "a")
        h.clock.now += 5.0
        await h.add(1, 7, "b")  # opened later, flushed with the first
        await h.add(0, 6, "c")  # a new event does not make the window younger
        h.clock.now += 4.9
        await h.flush_idle()
        assert h.acks() == []
        h.clock.now += 0.1
        await h.flush_idle()
        assert h.acks() == [(0, 5), (0, 6), (1, 7)]
        await h.add(2, 0, "d")
        h.clock.now += 9.9
        await h.flush_idle()  # nothing open for 10 s yet

    asyncio.run(run())
    assert h.acks() == [(0, 5), (0, 6), (1, 7)]
    markers = h.store.markers()
    assert [(m.partition, m.prompt_ids) for m in markers] == [(0, ["a", "c"]), (1, ["b"])]
    # one file for the flush: a marker per window, each with its rows' place in it
    assert [p.name for p in (tmp_path / "v1" / "data").iterdir()] == [markers[0].shard]
    assert (markers[1].shard, markers[1].row_start) == (markers[0].shard, 2)
    assert [h.store.read_shard(m)["prompt_id"].to_pylist() for m in markers] == [
        ["a", "c"],
        ["b"],
    ]
    table = DatasetReader(h.store).table()
    assert table["prompt_id"].to_pylist() == ["a", "c", "b"]


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
    assert h.sink.stats.duplicates == 1
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
    store.write_shard(0, 0, 9, rows("a", "b"), epoch=1)  # committed: before offset 10
    store.write_shard(0, 10, 14, rows("x"), epoch=1)  # written, never committed
    store.write_shard(0, 15, 19, rows("y"), epoch=2)  # ours, before a restart
    store.write_shard(0, 20, 25, rows("z"), epoch=3)  # a newer writer's: not ours
    store.write_shard(1, 10, 30, rows("p"), epoch=1)  # another partition: not adopted
    h = harness(store, max_records=3, epoch=2)

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
    # two workers on one dataset version; partition 0 moved from the zombie (epoch 1) to
    # the new owner (epoch 2), and the zombie has not noticed yet
    zombie = harness(ShardStore(str(tmp_path), "v1"), max_records=100, epoch=1)
    owner = harness(ShardStore(str(tmp_path), "v1"), max_records=3, epoch=2)

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
