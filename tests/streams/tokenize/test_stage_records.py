"""The tokenize stage with bad and large records: batches of bounded tokens, a dead letter per
wrong field, exceptions while admitting or building, the crash guard, the row's source
(no Kafka, no S3; stage_harness.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from sinks.reader import DatasetReader
from streams.core.crash_guard import CrashGuard
from streams.core.records import CompletionRecord, DeadLetter
from streams.tokenize.stage import BUILD_TOKENS
from tests.bad_records import BAD_SHAPES, COMPLETION_FIELDS, completion_dict, with_field
from tests.streams.tokenize.stage_harness import (
    SMALL_KAFKA,
    Stage,
)


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


def test_a_sample_row_says_what_made_it(tmp_path: Path) -> None:
    hashes = {"chat_template_sha256": "t" * 64, "tokenizer_sha256": "k" * 64}
    stage = Stage(tmp_path, shard_max_records=1, tokenized_with=hashes)
    sampling = {"temperature": 0.6, "chat_template_kwargs": {"thinking": False}}
    served = {"kind": "sglang", "version": "0.5.9", "model_revision": "abc123"}
    record = CompletionRecord(
        prompt_id="a~1",
        messages=[{"role": "user", "content": "hi"}],
        content="ok",
        prompt_token_ids=[1, 2],
        output_token_ids=[3, 4],
        model="kimi-k2.6",
        sampling=sampling,
        recipe="k26-mix",
        served=served,
        normalization="kimi_k26",
    )
    asyncio.run(stage.add(record.encode(), key=b"a~1"))
    [row] = DatasetReader(stage.store).table().to_pylist()
    assert orjson.loads(row["provenance"]) == {
        "model": "kimi-k2.6",
        "served": served,
        "recipe": "k26-mix",
        "sampling": sampling,
        "thinking": False,
        "normalization": "kimi_k26",
        **hashes,
    }
