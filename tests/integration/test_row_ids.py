"""The user's row ids and source names survive the pipeline: a row's `id` (or the field named
by `--id-field`) is the shards' `source_id`, `source` is the source's file name (never the
publishing machine's path), and a completion written before `source_id` existed still becomes
a sample (with a null id)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from producers.publish import publish
from producers.sources import parse_source_spec
from sinks.reader import DatasetReader
from streams.core.settings import COMPLETIONS, KafkaSettings
from tests.bad_records import completion_dict

pytestmark = pytest.mark.integration


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


def _row(text: str, **extra: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": text}], **extra}


async def _send_old_completion(kafka: KafkaSettings, prompt_id: str) -> None:
    old = completion_dict(prompt_id)
    del old["source_id"]  # as written before the field existed
    producer = AIOKafkaProducer(**kafka.aiokafka_kwargs())
    await producer.start()
    try:
        await producer.send_and_wait(
            kafka.topic(COMPLETIONS), key=prompt_id.encode(), value=orjson.dumps(old)
        )
    finally:
        await producer.stop()


def test_row_ids_and_source_names_reach_the_shards(pipeline, tmp_path: Path) -> None:
    by_id = _write(
        tmp_path / "by_id.jsonl",
        [_row(f"Question number {i}?", id=f"user-{i}") for i in range(6)]
        + [_row("A question with an integer id?", id=41), _row("A question without an id?")],
    )
    by_uid = _write(
        tmp_path / "by_uid.jsonl",
        [_row(f"Another question {i}?", uid=f"u{i}", id="not this one") for i in range(4)],
    )
    url, _ = pipeline.emulator()
    workers = [pipeline.generate(url), pipeline.tokenize()]
    kafka = pipeline.kafka
    first = asyncio.run(publish(kafka, [parse_source_spec(str(by_id))], progress=False))
    second = asyncio.run(
        publish(kafka, [parse_source_spec(f"{by_uid}:1")], progress=False, id_field="uid")
    )
    asyncio.run(_send_old_completion(kafka, "old-completion"))
    expected = set(first.prompt_ids) | set(second.prompt_ids) | {"old-completion"}
    pipeline.wait(expected, workers)
    pipeline.assert_exactly_once(expected)

    rows = (
        DatasetReader(pipeline.store())
        .table()
        .select(["prompt_id", "source", "source_id"])
        .to_pylist()
    )
    got = {(row["source"], row["source_id"]) for row in rows}
    want = {("by_id.jsonl", f"user-{i}") for i in range(6)}
    want |= {("by_id.jsonl", "41"), ("by_id.jsonl", None)}
    want |= {("by_uid.jsonl", f"u{i}") for i in range(4)}
    want |= {("tests", None)}  # the old completion's own source, no id
    assert got == want
    assert not any(str(tmp_path) in str(row["source"]) for row in rows)
    # the completions topic (the source of truth) carries them too
    completions = pipeline.completions()
    assert {c.source_id for c in completions.values()} == {s for _, s in want}
