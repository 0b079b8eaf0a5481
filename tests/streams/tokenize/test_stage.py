"""The tokenize stage on its shard sink: dead letters, recorded drops, latest answer wins,
stats, the memory budget and the crash point (no Kafka, no S3; stage_harness.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from streams.core.faults import AFTER_MARKER
from tests.faults import armed
from tests.streams.tokenize.stage_harness import (
    CAUSE,
    Stage,
)


def test_an_undecodable_record_is_a_dead_letter_and_a_drop_under_its_key(
    tmp_path: Path,
) -> None:
    stage = Stage(tmp_path, shard_max_records=3)

    async def run() -> None:
        await stage.add(b"{not json", key=b"p1")
        await stage.add(b"\xff\xfe")  # no key: a dead letter, but no prompt to record it for
        await stage.complete("p2")

    asyncio.run(run())
    assert stage.letters() == [
        ("dead_letter", "dead-letters", b"p1", "not_json", "p1", []),
        ("dead_letter", "dead-letters", b"", "invalid_utf8", None, []),
    ]
    [marker] = stage.store.markers()
    assert (marker.prompt_ids, marker.drops) == (["p2"], {"p1": "not_json"})
    assert stage.outcomes() == ([("p2", 5)], {"p1": "not_json"})
    assert stage.acks() == [0, 1, 2]
    assert stage.worker.stats.dead_letters == 2


def test_a_later_completion_replaces_the_earlier_one_in_its_window(tmp_path: Path) -> None:
    stage = Stage(tmp_path, shard_max_records=3)

    async def run() -> None:
        await stage.complete("a", last=10)
        await stage.complete("b")
        await stage.complete("a", last=11)  # a regenerated answer, or a redelivery

    asyncio.run(run())
    assert stage.builder.batches == [["a", "b"]]  # built once, the earlier one never
    assert [m.prompt_ids for m in stage.store.markers()] == [["a", "b"]]
    assert stage.outcomes() == ([("a", 11), ("b", 5)], {})
    assert stage.worker.sink.stats.duplicates == 1
    assert stage.acks() == [0, 1, 2]


def test_a_later_completion_in_a_later_window_is_written_and_wins(tmp_path: Path) -> None:
    stage = Stage(tmp_path, shard_max_records=2)

    async def run() -> None:
        await stage.complete("a", last=10)
        await stage.complete("b")  # the window is full: committed
        await stage.complete("a", last=11)
        await stage.complete("c")

    asyncio.run(run())
    assert [m.prompt_ids for m in stage.store.markers()] == [["a", "b"], ["a", "c"]]
    assert stage.outcomes() == ([("b", 5), ("a", 11), ("c", 5)], {})
    assert stage.worker.sink.stats.duplicates == 0
    assert stage.acks() == [0, 1, 2, 3]


def test_a_regeneration_after_a_restart_is_written_and_wins(tmp_path: Path) -> None:
    earlier = Stage(tmp_path, epoch=1, shard_max_records=2)

    async def first_run() -> None:
        await earlier.complete("a")
        await earlier.complete("b", last=10)

    asyncio.run(first_run())
    restarted = Stage(tmp_path, epoch=2, shard_max_records=2)
    restarted.offset = 2  # the committed position

    async def second_run() -> None:
        await restarted.complete("b", last=11)  # a regeneration of a committed prompt
        await restarted.complete("c")

    asyncio.run(second_run())
    assert [(m.epoch, m.prompt_ids) for m in restarted.store.markers()] == [
        (1, ["a", "b"]),
        (2, ["b", "c"]),
    ]
    assert restarted.outcomes() == ([("a", 5), ("b", 11), ("c", 5)], {})


def test_a_sample_error_is_a_recorded_drop_and_a_dead_letter_sent_before_the_marker(
    tmp_path: Path,
) -> None:
    stage = Stage(tmp_path, shard_max_records=4)

    async def run() -> None:
        await stage.complete("a")
        await stage.complete("b", content="bad")
        await stage.complete("l", content="long")
        await stage.add(b"[]", key=b"x")  # the wrong shape: a dead letter before the samples'

    asyncio.run(run())
    assert stage.letters() == [  # no marker yet when each was sent
        ("dead_letter", "dead-letters", b"x", "bad_shape", "x", []),
        ("dead_letter", "dead-letters", b"b", "template_error", "b", []),
        ("dead_letter", "dead-letters", b"l", "policy_length", "l", []),
    ]
    [marker] = stage.store.markers()
    assert marker.prompt_ids == ["a"]
    drops = {"b": "template_error", "l": "policy_length", "x": "bad_shape"}
    assert marker.drops == drops
    assert stage.outcomes() == ([("a", 5)], drops)
    assert stage.worker.stats.errors == {"template_error": 1, "policy_length": 1}
    assert stage.worker.stats.dead_letters == 3


def test_a_drop_then_a_later_successful_completion_resolves_to_the_sample(
    tmp_path: Path,
) -> None:
    stage = Stage(tmp_path, shard_max_records=1)

    async def run() -> None:
        await stage.complete("a", content="long")
        await stage.complete("a", last=12)  # regenerated, within the policy this time

    asyncio.run(run())
    assert [(m.prompt_ids, m.drops) for m in stage.store.markers()] == [
        ([], {"a": "policy_length"}),
        (["a"], {}),
    ]
    assert stage.outcomes() == ([("a", 12)], {})
    assert [entry[3] for entry in stage.letters()] == ["policy_length"]


def test_a_sample_then_a_later_drop_resolves_to_the_drop(tmp_path: Path) -> None:
    stage = Stage(tmp_path, shard_max_records=1)

    async def run() -> None:
        await stage.complete("a")
        await stage.complete("a", content="bad")

    asyncio.run(run())
    assert stage.outcomes() == ([], {"a": "template_error"})


def test_stats_count_a_window_once_it_is_committed(tmp_path: Path) -> None:
    stage = Stage(tmp_path, shard_max_records=100, idle_flush_s=10.0)
    stats = stage.worker.stats

    async def run() -> None:
        await stage.complete("a", server="d")  # drifted, but replaced below
        await stage.complete("b", server="d")  # drifted
        await stage.complete("c", content="bad")
        await stage.complete("a")
        assert (stats.samples, stats.shards, stats.dead_letters) == (0, 0, 0)
        assert stage.worker.sink.stats.duplicates == 1
        await stage.idle_flush()

    asyncio.run(run())
    assert (stats.samples, stats.tokens, stats.loss_tokens, stats.shards) == (2, 10, 6, 1)
    assert (stats.dead_letters, stats.drift_compared, stats.drifted) == (1, 2, 1)
    assert stage.acks() == [0, 1, 2, 3]
    # the marker counts the causes of the rows it holds (the replaced answer is not one)
    assert [m.drift_causes for m in stage.store.markers()] == [{CAUSE.key: 1}]


def test_open_windows_are_flushed_to_stay_within_the_memory_budget(tmp_path: Path) -> None:
    stage = Stage(tmp_path, shard_max_records=100)
    sink = stage.worker.sink

    async def run() -> None:
        await stage.complete("a")
        record_size = sink.stats.open_bytes  # a completion counts its bytes and decoded form
        assert record_size == 2 * len(stage.values_added[0])
        sink.max_open_bytes = 2 * record_size + record_size // 2
        await stage.complete("b")
        assert stage.acks() == []
        await stage.complete("c")  # 3 records open: over the budget

    asyncio.run(run())
    assert sink.stats.budget_flushes == 1
    assert stage.acks() == [0, 1, 2]  # without waiting for the idle flush
    assert [m.prompt_ids for m in stage.store.markers()] == [["a", "b", "c"]]
    assert sink.stats.open_bytes == 0


def test_the_crash_point_fires_after_the_marker_and_before_the_acks(tmp_path: Path) -> None:
    class Killed(BaseException):
        pass

    def exit_now(code: int) -> None:
        raise Killed(code)

    stage = Stage(tmp_path, shard_max_records=2)

    async def run() -> None:
        await stage.complete("a")
        await stage.complete("b")

    with armed({AFTER_MARKER: 1}, exit_now), pytest.raises(Killed):
        asyncio.run(run())
    assert [m.prompt_ids for m in stage.store.markers()] == [["a", "b"]]
    assert stage.acks() == []


def test_a_worker_given_its_prompts_writes_only_theirs_and_acks_the_others(
    tmp_path: Path,
) -> None:
    # what `run` gives its workers: the version holds the run's prompts, not the whole topic
    stage = Stage(tmp_path, shard_max_records=6, prompts=frozenset({"a", "conv"}))

    async def run() -> None:
        await stage.complete("a")
        await stage.complete("other")  # another source's prompt, stored before
        await stage.complete("conv-t1of2")  # a turn of a conversation of the run
        await stage.add(b"{not json", key=b"stranger")  # not ours: not even its dead letter
        await stage.add(b"\xff\xfe")  # no key: no prompt of the run
        await stage.complete("a", last=9)  # latest answer wins, as without a filter

    asyncio.run(run())
    assert stage.outcomes() == ([("a", 9), ("conv-t1of2", 5)], {})
    assert stage.letters() == []
    assert stage.acks() == [0, 1, 2, 3, 4, 5]
    assert stage.worker.stats.samples == 2 and stage.worker.stats.dead_letters == 0
