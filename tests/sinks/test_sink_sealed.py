"""The shard sink when its dataset version is sealed under it: nothing written after the seal
is kept or acked, and the sink says so once (tests/sinks/sink_harness.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sinks.reader import DatasetReader
from sinks.shards import ShardStore
from sinks.sink import Prepared
from tests.sinks.sink_harness import (
    harness,
    windows,
)


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
