"""The tokenize stage on its shard sink: dead letters, dedup, stats (no Kafka, no S3)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import orjson
import pytest

from sinks.shards import ShardStore
from streams.core.crash_guard import CrashGuard
from streams.core.records import CompletionRecord, DeadLetter
from streams.core.retry import Backoff
from streams.tokenize.samples import Sample, SampleBuilder, SampleError
from streams.tokenize.stage import TokenizeWorker
from tests.bad_records import BAD_SHAPES, COMPLETION_FIELDS, completion_dict, with_field


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
    message: Message
    key: bytes | None
    value: bytes
    log: list[tuple[Any, ...]]

    def ack(self) -> bool:
        self.log.append(("ack", self.message.offset))
        return True


@dataclass
class Settings:
    """The part of TokenizeSettings the stage reads."""

    shard_max_records: int = 3
    shard_max_tokens: int = 1_000_000
    idle_flush_s: float = 10.0


class FakeBuilder:
    """Server ids as the sample; a completion whose content is "bad" cannot be built."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def build_many(self, completions: Sequence[CompletionRecord]) -> list[Sample | SampleError]:
        self.batches.append([c.prompt_id for c in completions])
        results: list[Sample | SampleError] = []
        for completion in completions:
            if completion.content == "bad":
                results.append(SampleError("template_error", "the template raised"))
                continue
            if completion.content == "raise":
                raise RuntimeError("a bug in the builder")
            prompt, output = completion.prompt_token_ids or [], completion.output_token_ids or []
            mask = [0] * len(prompt) + [1] * len(output)
            results.append(Sample(prompt + output, mask, "server", drift=completion.server == "d"))
        return results


class Stage:
    def __init__(self, tmp_path: Path, guard: CrashGuard | None = None, **settings: Any):
        self.log: list[tuple[Any, ...]] = []
        self.store = ShardStore(str(tmp_path), "v1")
        self.builder = FakeBuilder()
        self.worker = TokenizeWorker(
            cast(Any, Settings(**settings)),
            cast(SampleBuilder, self.builder),
            self.store,
            self.send,
            dead_letters_topic="dead-letters",
            backoff=Backoff(initial_s=0.0, max_s=0.0),
            guard=guard,
        )
        self.offset = 0

    async def send(self, topic: str, key: bytes, value: bytes) -> None:
        letter = DeadLetter.decode(value)
        markers = [m.start_offset for m in self.store.markers()]
        self.log.append(("dead_letter", topic, key, letter.kind, letter.prompt_id, markers))

    async def add(self, value: bytes, key: bytes | None = None, partition: int = 0) -> None:
        event = FakeEvent(Message(TP("completions", partition), self.offset), key, value, self.log)
        self.offset += 1
        await self.worker.sink.add(event)

    async def complete(self, pid: str, content: str = "ok", server: str = "s") -> None:
        record = CompletionRecord(
            prompt_id=pid,
            messages=[{"role": "user", "content": "hi"}],
            content=content,
            prompt_token_ids=[1, 2],
            output_token_ids=[3, 4, 5],
            server=server,
            usage={"total_tokens": 5},
        )
        await self.add(record.encode(), key=pid.encode())

    def letters(self) -> list[tuple[Any, ...]]:
        return [entry for entry in self.log if entry[0] == "dead_letter"]

    def acks(self) -> list[int]:
        return [entry[1] for entry in self.log if entry[0] == "ack"]


def test_an_undecodable_record_becomes_one_dead_letter(tmp_path: Path) -> None:
    stage = Stage(tmp_path, shard_max_records=2)

    async def run() -> None:
        await stage.add(b"{not json", key=b"p1")
        await stage.complete("p2")

    asyncio.run(run())
    assert stage.letters() == [("dead_letter", "dead-letters", b"p1", "not_json", "p1", [])]
    assert stage.store.read_table().column("prompt_id").to_pylist() == ["p2"]
    assert stage.acks() == [0, 1]
    assert stage.worker.stats.dead_letters == 1


def test_duplicates_in_the_window_and_across_a_committed_marker_are_skipped(
    tmp_path: Path,
) -> None:
    stage = Stage(tmp_path, shard_max_records=3)

    async def run() -> None:
        await stage.complete("a")
        await stage.complete("a")  # a redelivery within the window
        await stage.complete("b")  # the window is full: committed
        await stage.complete("b")  # after its marker
        await stage.complete("c")
        await stage.complete("a")

    asyncio.run(run())
    assert [m.prompt_ids for m in stage.store.markers()] == [["a", "b"], ["c"]]
    assert stage.builder.batches == [["a", "b"], ["c"]]
    assert stage.worker.stats.duplicates == 3
    assert stage.acks() == [0, 1, 2, 3, 4, 5]


def test_ids_of_an_earlier_run_are_skipped(tmp_path: Path) -> None:
    earlier = Stage(tmp_path, shard_max_records=2)

    async def first_run() -> None:
        await earlier.complete("a")
        await earlier.complete("b")

    asyncio.run(first_run())
    restarted = Stage(tmp_path, shard_max_records=2)
    restarted.offset = 2  # the committed position

    async def second_run() -> None:
        await restarted.complete("b")  # a regeneration of a committed prompt
        await restarted.complete("c")

    asyncio.run(second_run())
    assert [m.prompt_ids for m in restarted.store.markers()] == [["a", "b"], ["c"]]
    assert restarted.worker.stats.duplicates == 1


def test_a_sample_error_is_a_dead_letter_sent_before_the_marker(tmp_path: Path) -> None:
    stage = Stage(tmp_path, shard_max_records=3)

    async def run() -> None:
        await stage.complete("a")
        await stage.complete("b", content="bad")
        await stage.add(b"[]", key=b"x")  # the wrong shape: a dead letter before the sample's

    asyncio.run(run())
    assert stage.letters() == [
        ("dead_letter", "dead-letters", b"x", "bad_shape", "x", []),
        ("dead_letter", "dead-letters", b"b", "template_error", "b", []),  # no marker yet
    ]
    assert [m.prompt_ids for m in stage.store.markers()] == [["a"]]
    assert stage.worker.stats.rejected == {"template_error": 1}
    assert stage.worker.stats.dead_letters == 2


def test_stats_count_a_window_once_it_is_committed(tmp_path: Path) -> None:
    stage = Stage(tmp_path, shard_max_records=100, idle_flush_s=10.0)
    clock = [0.0]
    stage.worker.sink.clock = lambda: clock[0]
    stats = stage.worker.stats

    async def run() -> None:
        await stage.complete("a", server="d")  # drifted
        await stage.complete("b")
        await stage.complete("c", content="bad")
        await stage.complete("a")
        assert (stats.samples, stats.shards, stats.dead_letters, stats.duplicates) == (0, 0, 0, 1)
        clock[0] = 10.0
        await stage.worker.sink.flush_idle()

    asyncio.run(run())
    assert (stats.samples, stats.tokens, stats.loss_tokens, stats.shards) == (2, 10, 6, 1)
    assert (stats.dead_letters, stats.compared, stats.drifted) == (1, 2, 1)
    assert stage.acks() == [0, 1, 2, 3]


def test_the_crash_point_fires_after_the_marker_and_before_the_acks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Killed(BaseException):
        pass

    def exit_now(code: int) -> None:
        raise Killed(code)

    monkeypatch.setenv("DRAFTGEN_FAULT_AFTER_MARKER", "1")
    monkeypatch.setattr(os, "_exit", exit_now)
    stage = Stage(tmp_path, shard_max_records=2)

    async def run() -> None:
        await stage.complete("a")
        await stage.complete("b")

    with pytest.raises(Killed):
        asyncio.run(run())
    assert [m.prompt_ids for m in stage.store.markers()] == [["a", "b"]]
    assert stage.acks() == []


def test_a_window_is_built_in_one_batch(tmp_path: Path) -> None:
    stage = Stage(tmp_path, shard_max_records=4)

    async def run() -> None:
        for pid in "abcd":
            await stage.complete(pid)

    asyncio.run(run())
    assert stage.builder.batches == [["a", "b", "c", "d"]]
    row = stage.store.read_table().to_pylist()[0]
    assert (row["input_ids"], row["loss_mask"]) == ([1, 2, 3, 4, 5], [0, 0, 1, 1, 1])
    assert orjson.loads(Path(stage.store.layout.marker(0, 0)).read_bytes())["rows"] == 4


def test_each_wrong_field_and_shape_is_one_dead_letter_and_the_rest_is_written(
    tmp_path: Path,
) -> None:
    """A completion with any field of the wrong type, or of any malformed shape, is one dead
    letter of its kind; the valid records around it become rows and every offset is acked."""
    stage = Stage(tmp_path, shard_max_records=1000)
    cases = {
        f"field-{name}": with_field(completion_dict(f"field-{name}"), name, value)
        for name, (value, _) in COMPLETION_FIELDS.items()
        if name != "prompt_id"
    }
    cases |= {f"shape-{name}": raw for name, (raw, _) in BAD_SHAPES.items()}
    expected = {f"field-{name}": kind for name, (_, kind) in COMPLETION_FIELDS.items()}
    expected |= {f"shape-{name}": kind for name, (_, kind) in BAD_SHAPES.items()}
    expected["field-prompt_id"] = "bad_shape"
    cases["field-prompt_id"] = with_field(completion_dict("x"), "prompt_id", 7)

    async def run() -> None:
        await stage.complete("good-1")
        for key, raw in cases.items():
            await stage.add(raw, key=key.encode())
        await stage.complete("good-2")
        await stage.worker.sink._flush(TP("completions", 0))

    asyncio.run(run())
    kinds = {letter[2].decode(): letter[3] for letter in stage.letters()}
    assert kinds == expected
    assert len(stage.letters()) == len(cases)
    assert stage.store.read_table().column("prompt_id").to_pylist() == ["good-1", "good-2"]
    assert stage.acks() == list(range(len(cases) + 2))


def test_an_exception_while_building_costs_only_its_record(tmp_path: Path) -> None:
    stage = Stage(tmp_path, shard_max_records=3)

    async def run() -> None:
        await stage.complete("a")
        await stage.complete("b", content="raise")  # the batch raises: built one by one
        await stage.complete("c")

    asyncio.run(run())
    assert [letter[2:5] for letter in stage.letters()] == [(b"b", "internal_error", "b")]
    assert [m.prompt_ids for m in stage.store.markers()] == [["a", "c"]]
    assert stage.acks() == [0, 1, 2]


def test_an_exception_while_admitting_is_a_dead_letter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = Stage(tmp_path, shard_max_records=2)
    real = stage.worker.sink.seen

    def seen(tp: Any, key: str) -> bool:
        if key == "boom":
            raise KeyError("a bug in the dedup")
        return real(tp, key)

    monkeypatch.setattr(stage.worker.sink, "seen", seen)

    async def run() -> None:
        await stage.complete("boom")
        await stage.complete("a")

    asyncio.run(run())
    assert [letter[2:5] for letter in stage.letters()] == [(b"boom", "internal_error", "boom")]
    assert [m.prompt_ids for m in stage.store.markers()] == [["a"]]


def test_a_record_that_crashed_the_worker_twice_is_dead_lettered_on_the_next_start(
    tmp_path: Path,
) -> None:
    guard = CrashGuard(tmp_path / "state", "tokenize-v1")
    guard.crashed("completions", 0, 1, RuntimeError("boom"))
    guard.crashed("completions", 0, 1, RuntimeError("boom"))
    stage = Stage(
        tmp_path, guard=CrashGuard(tmp_path / "state", "tokenize-v1"), shard_max_records=3
    )

    async def run() -> None:
        await stage.complete("a")
        await stage.complete("b")  # offset 1: the crash loop's record
        await stage.complete("c")

    asyncio.run(run())
    assert [letter[2:5] for letter in stage.letters()] == [(b"b", "crash_loop", "b")]
    assert [m.prompt_ids for m in stage.store.markers()] == [["a", "c"]]
