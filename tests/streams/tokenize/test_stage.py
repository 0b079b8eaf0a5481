"""The tokenize stage on its shard sink: dead letters, recorded drops, latest answer wins,
stats (no Kafka, no S3)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson
import pytest

from sinks.reader import DatasetReader
from sinks.shards import ShardStore
from streams.core.crash_guard import CrashGuard
from streams.core.faults import AFTER_MARKER
from streams.core.records import CompletionRecord, DeadLetter
from streams.core.retry import Backoff
from streams.core.settings import KafkaSettings
from streams.tokenize.samples import DriftCause, Sample, SampleBuilder, SampleError
from streams.tokenize.stage import BUILD_TOKENS, TokenizeWorker
from tests.bad_records import BAD_SHAPES, COMPLETION_FIELDS, completion_dict, with_field
from tests.faults import armed
from tests.ids import as_list


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
    max_open_bytes: int = 1 << 30
    kafka: KafkaSettings = field(default_factory=lambda: SMALL_KAFKA)


# dead letters are cut to this producer limit
SMALL_KAFKA = KafkaSettings(bootstrap="127.0.0.1:1", max_message_bytes=64 * 1024)
CAUSE = DriftCause("turn", 3, "'\\n'", "'\\n\\n'")


class FakeBuilder:
    """Server ids as the sample; a completion whose content is "bad" cannot be built, one whose
    content is "long" is dropped by the sample policy; one from server "d" drifted (CAUSE)."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def build_many(self, completions: Sequence[CompletionRecord]) -> list[Sample | SampleError]:
        self.batches.append([c.prompt_id for c in completions])
        results: list[Sample | SampleError] = []
        for completion in completions:
            if completion.content == "bad":
                results.append(SampleError("template_error", "the template raised"))
                continue
            if completion.content == "long":
                results.append(SampleError("policy_length", "longer than --max-seq-len"))
                continue
            if completion.content == "raise":
                raise RuntimeError("a bug in the builder")
            prompt, output = (
                as_list(completion.prompt_token_ids),
                as_list(completion.output_token_ids),
            )
            mask = [0] * len(prompt) + [1] * len(output)
            sample = Sample(prompt + output, mask, "server", drift=completion.server == "d")
            sample.drift_cause = CAUSE if sample.drift else None
            results.append(sample)
        return results


class Stage:
    def __init__(
        self,
        tmp_path: Path,
        generation: int = 0,
        guard: CrashGuard | None = None,
        **settings: Any,
    ):
        self.log: list[tuple[Any, ...]] = []
        self.values: list[bytes] = []  # the dead letters as sent
        self.values_added: list[bytes] = []  # the records consumed
        self.now = 0.0
        self.store = ShardStore(str(tmp_path), "v1")
        self.builder = FakeBuilder()
        self.worker = TokenizeWorker(
            cast(Any, Settings(**settings)),
            cast(SampleBuilder, self.builder),
            self.store,
            self.send,
            dead_letters_topic="dead-letters",
            backoff=Backoff(initial_s=0.0, max_s=0.0),
            clock=self.clock,
            generation=lambda: generation,
            guard=guard,
        )
        self.offset = 0

    def clock(self) -> float:
        return self.now

    async def idle_flush(self) -> None:
        self.now += 3600.0
        await self.worker.sink.flush_idle()
        await self.worker.sink.drain()

    def outcomes(self) -> tuple[list[tuple[str, int]], dict[str, str]]:
        """The version as readers see it: (prompt id, its answer's last token) per row, and
        the recorded drops."""
        table = DatasetReader(self.store).table()
        rows = [(row["prompt_id"], row["input_ids"][-1]) for row in table.to_pylist()]
        return rows, self.store.committed().drops

    async def send(self, topic: str, key: bytes, value: bytes) -> None:
        letter = DeadLetter.decode(value)
        self.values.append(value)
        markers = [m.start_offset for m in self.store.markers()]
        self.log.append(("dead_letter", topic, key, letter.kind, letter.prompt_id, markers))

    async def add(self, value: bytes, key: bytes | None = None, partition: int = 0) -> None:
        self.values_added.append(value)
        event = FakeEvent(Message(TP("completions", partition), self.offset), key, value, self.log)
        self.offset += 1
        await self.worker.sink.add(event)
        await self.worker.sink.drain()  # a flush it started is done: the tests look at once

    async def complete(
        self, pid: str, content: str = "ok", server: str = "s", last: int = 5, tokens: int = 5
    ) -> None:
        """A completion of `pid`; `last` is its answer's last token (tells answers apart)."""
        record = CompletionRecord(
            prompt_id=pid,
            messages=[{"role": "user", "content": "hi"}],
            content=content,
            prompt_token_ids=[1, 2],
            output_token_ids=[3, 4, last],
            server=server,
            usage={"total_tokens": tokens},
        )
        await self.add(record.encode(), key=pid.encode())

    def letters(self) -> list[tuple[Any, ...]]:
        return [entry for entry in self.log if entry[0] == "dead_letter"]

    def acks(self) -> list[int]:
        return [entry[1] for entry in self.log if entry[0] == "ack"]


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
    assert stage.worker.sink.stats.replaced == 1
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
    assert stage.worker.sink.stats.replaced == 0
    assert stage.acks() == [0, 1, 2, 3]


def test_a_regeneration_after_a_restart_is_written_and_wins(tmp_path: Path) -> None:
    earlier = Stage(tmp_path, generation=1, shard_max_records=2)

    async def first_run() -> None:
        await earlier.complete("a")
        await earlier.complete("b", last=10)

    asyncio.run(first_run())
    restarted = Stage(tmp_path, generation=2, shard_max_records=2)
    restarted.offset = 2  # the committed position

    async def second_run() -> None:
        await restarted.complete("b", last=11)  # a regeneration of a committed prompt
        await restarted.complete("c")

    asyncio.run(second_run())
    assert [(m.generation, m.prompt_ids) for m in restarted.store.markers()] == [
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
    assert stage.worker.stats.rejected == {"template_error": 1, "policy_length": 1}
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
        assert stage.worker.sink.stats.replaced == 1
        await stage.idle_flush()

    asyncio.run(run())
    assert (stats.samples, stats.tokens, stats.loss_tokens, stats.shards) == (2, 10, 6, 1)
    assert (stats.dead_letters, stats.compared, stats.drifted) == (1, 2, 1)
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


def test_a_window_is_built_in_one_batch(tmp_path: Path) -> None:
    stage = Stage(tmp_path, shard_max_records=4)

    async def run() -> None:
        for pid in "abcd":
            await stage.complete(pid)

    asyncio.run(run())
    assert stage.builder.batches == [["a", "b", "c", "d"]]
    row = DatasetReader(stage.store).table().to_pylist()[0]
    assert (row["input_ids"], row["loss_mask"]) == ([1, 2, 3, 4, 5], [0, 0, 1, 1, 1])
    assert orjson.loads(Path(stage.store.layout.marker(0, 0)).read_bytes())["rows"] == 4


def test_a_large_window_is_built_in_batches_of_bounded_tokens_in_order(tmp_path: Path) -> None:
    """A window's texts and encoded ids are held per batch, not for the whole window."""
    stage = Stage(tmp_path, shard_max_records=5, shard_max_tokens=10 * BUILD_TOKENS)

    async def run() -> None:
        for pid in "abcde":
            await stage.complete(pid, tokens=BUILD_TOKENS // 2 + 1)

    asyncio.run(run())
    assert stage.builder.batches == [["a", "b"], ["c", "d"], ["e"]]
    assert DatasetReader(stage.store).table().column("prompt_id").to_pylist() == list("abcde")


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
        await stage.idle_flush()

    asyncio.run(run())
    kinds = {letter[2].decode(): letter[3] for letter in stage.letters()}
    assert kinds == expected
    assert len(stage.letters()) == len(cases)
    assert DatasetReader(stage.store).table().column("prompt_id").to_pylist() == [
        "good-1",
        "good-2",
    ]
    assert stage.acks() == list(range(len(cases) + 2))


def test_a_huge_undecodable_record_is_one_dead_letter_within_the_size_limit(
    tmp_path: Path,
) -> None:
    stage = Stage(tmp_path, shard_max_records=1000)
    raw = b"\xff" * (1024 * 1024)

    async def run() -> None:
        await stage.complete("good-1")
        await stage.add(raw, key=b"huge")
        await stage.complete("good-2")
        await stage.idle_flush()

    asyncio.run(run())
    [value] = stage.values
    assert SMALL_KAFKA.too_large(b"huge", value) is None
    letter = DeadLetter.decode(value)
    assert (letter.kind, letter.prompt_id, letter.origin) == (
        "invalid_utf8",
        "huge",
        "completions-0@1",
    )
    assert (letter.payload_size, letter.payload_truncated) == (len(raw), True)
    assert raw.startswith(letter.payload_bytes())
    assert DatasetReader(stage.store).table().column("prompt_id").to_pylist() == [
        "good-1",
        "good-2",
    ]
    assert stage.acks() == [0, 1, 2]


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
    real = CompletionRecord.decode

    def decode(raw: bytes) -> CompletionRecord:
        record = real(raw)
        if record.prompt_id == "boom":
            raise KeyError("a bug while admitting")
        return record

    monkeypatch.setattr(CompletionRecord, "decode", staticmethod(decode))

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


def test_a_sample_row_keeps_its_sources_name_and_row_id(tmp_path: Path) -> None:
    stage = Stage(tmp_path, shard_max_records=2)
    for pid, source_id in (("a", "row-7"), ("b", None)):
        record = CompletionRecord(
            prompt_id=pid,
            messages=[{"role": "user", "content": "hi"}],
            source="prompts.jsonl",
            source_id=source_id,
            content="ok",
            prompt_token_ids=[1, 2],
            output_token_ids=[3, 4],
        )
        asyncio.run(stage.add(record.encode(), key=pid.encode()))
    table = DatasetReader(stage.store).table()
    assert table.select(["prompt_id", "source", "source_id"]).to_pylist() == [
        {"prompt_id": "a", "source": "prompts.jsonl", "source_id": "row-7"},
        {"prompt_id": "b", "source": "prompts.jsonl", "source_id": None},
    ]
