"""`draftgen export --format conversations` on real Kafka and S3: the test publishes completions
(multi-turn, reasoning, tool calls and tools), a tokenize worker builds the version, then some
prompts are answered again (a later answer wins) and some end as a drop (cut by length); the
export must hold exactly the version's samples, each as the conversation of the completion that
became it, with the other formats' filters, split or not, unsealed and sealed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from aiokafka import AIOKafkaProducer

from sinks.reader import DatasetReader
from streams.cli.main import main
from streams.core.records import CompletionRecord
from streams.core.settings import COMPLETIONS, KafkaSettings
from streams.core.topics import ensure_topics
from streams.tools.progress import dataset_figures
from tests.integration.conftest import TOOLS
from tests.polling import wait_for

pytestmark = pytest.mark.integration

COUNT = 48
AGAIN = {i for i in range(COUNT) if i % 7 == 3}  # answered a second time: the later one wins
# answered again, cut by length: now a drop
CUT = {i for i in range(COUNT) if i % 11 == 5} - AGAIN


def completion(index: int, round_: int = 1, finish: str = "stop") -> CompletionRecord:
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Question {index}?"}]
    if index % 3 == 0:  # multi-turn, with an earlier answer's reasoning
        messages = [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": f"First question {index}?"},
            {"role": "assistant", "content": "Earlier.", "reasoning_content": "Thought."},
            *messages,
        ]
    record = CompletionRecord(
        prompt_id=f"c{index:03d}",
        messages=messages,
        source="even" if index % 2 == 0 else "odd",
        reasoning_content=f"Round {round_}: thinking about {index} " + "step " * (index % 9),
        content=f"Answer {index}, round {round_}. " + "more " * (index % 13),
        finish_reason=finish,
        source_id=f"row-{index}" if index % 4 else None,  # the user's row id, when it had one
    )
    if index % 5 == 0:  # a tool call, with the tools declared
        arguments = json.dumps({"command": f"ls /tmp/{index}"})
        record.tools = TOOLS
        record.tool_calls = [
            {
                "id": f"call_{index}_{round_}",
                "type": "function",
                "function": {"name": "run_shell", "arguments": arguments},
            }
        ]
        record.finish_reason = "tool_calls" if finish == "stop" else finish
    return record


async def _produce(kafka: KafkaSettings, records: Iterable[CompletionRecord]) -> None:
    await ensure_topics(kafka)
    producer = AIOKafkaProducer(**kafka.aiokafka_kwargs(), acks="all")
    await producer.start()
    try:
        for record in records:
            await producer.send_and_wait(
                kafka.topic(COMPLETIONS), record.encode(), key=record.prompt_id.encode()
            )
    finally:
        await producer.stop()


def expected_line(record: CompletionRecord) -> dict[str, Any]:
    """What SpecForge's conversation readers take: the prompt's messages and the turn."""
    turn: dict[str, Any] = {"role": "assistant", "content": record.content}
    turn["reasoning_content"] = record.reasoning_content
    if record.tool_calls:
        turn["tool_calls"] = record.tool_calls
    line: dict[str, Any] = {"id": record.prompt_id, "conversations": [*record.messages, turn]}
    if record.tools:
        line["tools"] = record.tools
    return {
        **line,
        "source": record.source,
        "source_id": record.source_id,
        "finish_reason": record.finish_reason,
        "provenance": record.provenance_fields(),
    }


def lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_conversations_are_the_completions_that_became_the_samples(
    pipeline: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in pipeline.env.items():
        monkeypatch.setenv(name, value)
    first = [completion(i) for i in range(COUNT)]
    asyncio.run(_produce(pipeline.kafka, first))
    worker = pipeline.tokenize("--shard-records", "10")
    store = pipeline.store()
    wait_for(lambda: dataset_figures(store).samples == COUNT, 180, "the first answers")
    second = [completion(i, 2) for i in sorted(AGAIN)]
    second += [completion(i, 2, finish="length") for i in sorted(CUT)]
    asyncio.run(_produce(pipeline.kafka, second))

    def caught_up() -> bool:
        figures = dataset_figures(store)
        return figures.replaced == len(AGAIN) + len(CUT) and set(figures.drops) == {
            f"c{i:03d}" for i in CUT
        }

    wait_for(caught_up, 180, lambda: f"the second answers: {dataset_figures(store)}")
    latest = {r.prompt_id: r for r in first + second}
    samples = DatasetReader(store).table()["prompt_id"].to_pylist()
    assert set(samples) == {f"c{i:03d}" for i in range(COUNT) if i not in CUT}

    where = ["--out", pipeline.out, "--dataset", pipeline.dataset]
    kafka = ["--bootstrap", pipeline.bootstrap, "--topic-prefix", pipeline.prefix]

    def export(name: str, *flags: str, fmt: str = "conversations") -> Path:
        path = tmp_path / name
        assert main(["export", *where, "--format", fmt, "--to", str(path), *flags]) == 0
        return path

    # the version's samples, one line each, in the version's order, from the latest answer
    whole = lines(export("conversations.jsonl", *kafka))
    assert [line["id"] for line in whole] == samples
    assert whole == [expected_line(latest[pid]) for pid in samples]
    assert any("tool_calls" in line["conversations"][-1] for line in whole)
    assert {line["conversations"][-1]["content"].split(", ")[1][:7] for line in whole} == {
        "round 1",
        "round 2",
    }

    # without a broker: one line, no traceback
    monkeypatch.delenv("DRAFTGEN_BOOTSTRAP", raising=False)
    assert main(["export", *where, "--format", "conversations", "--to",
                 str(tmp_path / "nobroker.jsonl")]) == 2  # fmt: skip

    # the same filters as the token formats keep the same prompts
    flags = ("--source", "even", "--max-seq-len", "40", "--min-loss-run", "2")
    filtered = lines(export("even.jsonl", *kafka, *flags))
    tokens = lines(export("even-tokens.jsonl", *flags, fmt="specforge"))
    assert [line["id"] for line in filtered] == [row["prompt_id"] for row in tokens]
    assert 0 < len(filtered) < len(whole)
    assert all(line["source"] == "even" for line in filtered)

    # Parquet: the same conversations
    table = pq.read_table(export("conversations.parquet", *kafka))
    assert table["id"].to_pylist() == samples
    assert table["source_id"].to_pylist() == [line["source_id"] for line in whole]
    for row, line in zip(table.to_pylist(), whole, strict=True):
        turn, want = row["conversations"][-1], line["conversations"][-1]
        assert turn["content"] == want["content"]
        assert turn["reasoning_content"] == want["reasoning_content"]
        calls = turn["tool_calls"] or None
        assert calls == want.get("tool_calls")
        assert (json.loads(row["tools"]) if row["tools"] else None) == line.get("tools")

    # split: files of at most 7 rows that together are the unsplit export
    split = export("split", *kafka, "--rows-per-file", "7")
    parts = sorted(split.iterdir())
    assert all(len(lines(part)) <= 7 for part in parts)
    assert [line for part in parts for line in lines(part)] == whole

    # sealed: read through the manifest, the same lines
    worker.stop()
    assert main(["seal", *where, *kafka]) == 0
    assert store.sealed() is not None
    assert lines(export("sealed.jsonl", *kafka)) == whole
