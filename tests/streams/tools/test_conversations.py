"""The conversations export's join, on a stand-in for the topic (the real one:
tests/integration/test_export_conversations.py): each row is the latest completion of its
prompt within its shard's offset window, in the shard's row order; Parquet keeps the turns."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pyarrow.parquet as pq

from sinks.reader import DatasetReader
from sinks.shards import SampleRow, ShardStore
from streams.core.records import CompletionRecord
from streams.core.settings import KafkaSettings
from streams.tools.conversations import CompletionsJoin
from streams.tools.export import ExportRules, FileSplit, export
from streams.tools.export_formats import open_writer


class Topic:
    """Records by partition, read by offset range as RangeReader does."""

    def __init__(self, partitions: dict[int, list[CompletionRecord | bytes]]):
        self.partitions = partitions
        self.reads: list[tuple[int, int, int]] = []

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def read(self, partition: int, first: int, last: int, handle: Callable[..., None]) -> int:
        self.reads.append((partition, first, last))
        for offset, record in enumerate(self.partitions.get(partition, [])):
            if first <= offset <= last:
                if isinstance(record, bytes):
                    handle(SimpleNamespace(offset=offset, key=b"c0", value=record))
                else:
                    key = record.prompt_id.encode()
                    handle(SimpleNamespace(offset=offset, key=key, value=record.encode()))
        return last + 1


def answer(pid: str, text: str, **extra: Any) -> CompletionRecord:
    return CompletionRecord(
        prompt_id=pid,
        messages=[{"role": "user", "content": f"about {pid}"}],
        reasoning_content=f"thinking {text}",
        content=text,
        finish_reason="stop",
        **extra,
    )


def row(pid: str) -> SampleRow:
    return SampleRow(pid, "src", [1, 2, 3, 4], [0, 0, 1, 1], "stop", "rendered")


CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def test_rows_are_the_latest_completion_of_their_window(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path / "out"), "v1")
    store.write_manifest({"dataset": "v1"})
    store.write_shard(0, 0, 3, [row("c1"), row("c0"), row("c2")])
    store.write_shard(0, 4, 5, [row("c5")])
    store.write_shard(1, 0, 1, [row("c3"), row("c4")])
    topic = Topic(
        {
            0: [
                answer("c0", "first"),
                answer("c1", "one"),
                answer("c0", "second", tool_calls=[CALL], tools=TOOLS),
                answer("c2", "two"),
                answer("c0", "after the window"),  # a later window's: not this row's
                answer("c5", "five"),
            ],
            1: [answer("c3", "three"), b"not json"],  # c4's completion is not in the topic
        }
    )
    join = CompletionsJoin(KafkaSettings(bootstrap="127.0.0.1:9"))
    join.reader = topic  # type: ignore[assignment]
    output = tmp_path / "conversations.jsonl"
    reader = DatasetReader(store)
    try:
        summary = export(
            reader, open_writer("conversations", output), ExportRules(), FileSplit(), join
        )
    finally:
        join.close()
    assert topic.reads == [(0, 0, 3), (0, 4, 5), (1, 0, 1)]
    lines = [orjson.loads(line) for line in output.read_bytes().splitlines()]
    assert [line["id"] for line in lines] == ["c1", "c0", "c2", "c5", "c3"]
    c0 = lines[1]
    assert c0["conversations"] == [
        {"role": "user", "content": "about c0"},
        {
            "role": "assistant",
            "content": "second",
            "reasoning_content": "thinking second",
            "tool_calls": [CALL],
        },
    ]
    assert c0["tools"] == TOOLS and "tools" not in lines[0]
    assert summary.written == 5 and summary.dropped == {"no_completion": 1}

    parquet = tmp_path / "conversations.parquet"
    join = CompletionsJoin(KafkaSettings(bootstrap="127.0.0.1:9"))
    join.reader = topic  # type: ignore[assignment]
    try:
        export(reader, open_writer("conversations", parquet), ExportRules(), FileSplit(), join)
    finally:
        join.close()
    table = pq.read_table(parquet).to_pylist()
    assert [r["id"] for r in table] == ["c1", "c0", "c2", "c5", "c3"]
    turn = table[1]["conversations"][-1]
    assert (turn["content"], turn["reasoning_content"]) == ("second", "thinking second")
    assert turn["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a":1}'}
    assert orjson.loads(table[1]["tools"]) == TOOLS and table[0]["tools"] is None


def test_each_row_carries_its_source_rows_id_as_every_format_does(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path / "out"), "v1")
    store.write_manifest({"dataset": "v1"})
    store.write_shard(0, 0, 1, [row("c0"), row("c1")])
    topic = Topic({0: [answer("c0", "zero", source_id="row-7"), answer("c1", "one")]})
    reader = DatasetReader(store)
    for name in ("conversations.jsonl", "conversations.parquet"):
        join = CompletionsJoin(KafkaSettings(bootstrap="127.0.0.1:9"))
        join.reader = topic  # type: ignore[assignment]
        try:
            writer = open_writer("conversations", tmp_path / name)
            export(reader, writer, ExportRules(), FileSplit(), join)
        finally:
            join.close()
    lines = [orjson.loads(x) for x in (tmp_path / "conversations.jsonl").read_bytes().splitlines()]
    assert [(line["id"], line["source_id"]) for line in lines] == [("c0", "row-7"), ("c1", None)]
    table = pq.read_table(tmp_path / "conversations.parquet")
    assert table.column("source_id").to_pylist() == ["row-7", None]
