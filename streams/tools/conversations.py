"""A dataset version's samples as the regenerated conversations they came from.

`draftgen export --format conversations` writes, for each sample of the version (after the
export's filters), the completion that became it: the prompt's messages plus the target's own
assistant turn (`reasoning_content`, `content`, `tool_calls`), in OpenAI chat format. This is
what SpecForge's conversation paths take (`scripts/regenerate_train_data.py` writes it;
`scripts/prepare_hidden_states.py` and `specforge train` with a raw JSONL read it):
`{"id", "conversations": [messages], "tools"}` a line, plus `source`, `source_id` (the source
row's own id, as the `hf` and `parquet` exports carry it; null when it had none) and
`finish_reason`.

Which completion: the completions topic is the source of truth. Each shard of the version (the
sealed manifest's, or the committed windows that count) covers one offset window of one
partition, and its rows are the latest completion of their prompt within that window (the sink
keeps a window's last item per prompt id; sinks/sink.py), so the row of prompt P in a window
[first, last] of partition p is the last record keyed P in that range. Shards are read one at
a time and only the window's records whose key is one of its kept rows are held.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from sinks.reader import ShardRef
from streams.core.range_reader import RangeReader
from streams.core.records import CompletionRecord, RecordError
from streams.core.settings import COMPLETIONS, KafkaSettings
from streams.core.topic_reader import ConsumerRecord
from streams.tools.export_parts import JsonlPart, ParquetPart, Part
from streams.tools.export_writers import Writer

_TOOL_CALL = pa.struct(
    [
        ("id", pa.string()),
        ("type", pa.string()),
        ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
    ]
)
MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("reasoning_content", pa.string()),
        ("tool_calls", pa.list_(_TOOL_CALL)),
        ("tool_call_id", pa.string()),
        ("name", pa.string()),
    ]
)
# Parquet: messages as structs; tools as a JSON string (their parameter schemas differ from
# tool to tool; SpecForge parses a string `tools` column)
CONVERSATION_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("conversations", pa.list_(MESSAGE)),
        ("tools", pa.string()),
        ("source", pa.string()),
        ("source_id", pa.string()),
        ("finish_reason", pa.string()),
        ("provenance", pa.string()),  # CompletionRecord.provenance_fields(), as JSON
    ]
)


def conversation(completion: CompletionRecord) -> dict[str, Any]:
    """One line of the export: the prompt's messages and the generated turn."""
    row: dict[str, Any] = {
        "id": completion.prompt_id,
        "conversations": [*completion.messages, completion.generated_message()],
    }
    if completion.tools:
        row["tools"] = completion.tools
    row["source"] = completion.source
    row["source_id"] = completion.source_id
    row["finish_reason"] = completion.finish_reason
    row["provenance"] = completion.provenance_fields()
    return row


def _message_for_parquet(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if calls:
        message = dict(message)
        message["tool_calls"] = [
            {
                **call,
                "function": {
                    **call.get("function", {}),
                    "arguments": _text(call.get("function", {}).get("arguments")),
                },
            }
            for call in calls
        ]
    return message


def _text(value: Any) -> str | None:
    return value if value is None or isinstance(value, str) else orjson.dumps(value).decode()


def conversations_parquet(table: pa.Table) -> pa.Table:
    """The `json` rows of a conversations table as Parquet columns."""
    rows = []
    for encoded in table["json"].to_pylist():
        row = orjson.loads(encoded)
        row["conversations"] = [_message_for_parquet(m) for m in row["conversations"]]
        row["tools"] = _text(row.get("tools"))
        row["provenance"] = _text(row.get("provenance"))
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=CONVERSATION_SCHEMA)


class ConversationsWriter(Writer):
    """JSON lines of the joined rows' `json`, or Parquet for an `--to` ending in .parquet."""

    def __init__(self, name: str, output: Path):
        super().__init__(name, output)
        self.parquet = output.suffix == ".parquet"
        self.suffix = ".parquet" if self.parquet else ".jsonl"

    def open_part(self, path: Path) -> Part:
        if self.parquet:
            return ParquetPart(path, CONVERSATION_SCHEMA, conversations_parquet)
        return JsonlPart(path)


class CompletionsJoin:
    """For each exported shard, the completions that became its rows (`__call__`): a table of
    `json` (the encoded conversation) and the row's counts, in the shard's row order. A row whose
    completion cannot be found (deleted by a retention the topic must not have) is left out and
    counted as dropped `no_completion`."""

    def __init__(self, kafka: KafkaSettings):
        self.reader = RangeReader(kafka, kafka.topic(COMPLETIONS))
        self.loop = asyncio.new_event_loop()
        self.started = False

    def __call__(self, ref: ShardRef, table: pa.Table, summary: Any) -> pa.Table:
        if not self.started:
            self.loop.run_until_complete(self.reader.start())
            self.started = True
        wanted = set(table["prompt_id"].to_pylist())
        latest: dict[str, bytes] = {}

        def keep(record: ConsumerRecord) -> None:
            key = record.key.decode("utf-8", "replace") if record.key else ""
            if key in wanted and record.value is not None:
                latest[key] = record.value

        self.loop.run_until_complete(
            self.reader.read(ref.partition, ref.start_offset, ref.end_offset, keep)
        )
        encoded: list[bytes | None] = []
        for prompt_id in table["prompt_id"].to_pylist():
            raw = latest.get(prompt_id)
            completion = None
            if raw is not None:
                try:
                    completion = CompletionRecord.decode(raw)
                except RecordError:
                    completion = None
            if completion is None or completion.prompt_id != prompt_id:
                encoded.append(None)
                continue
            encoded.append(
                orjson.dumps(conversation(completion), option=orjson.OPT_SERIALIZE_NUMPY)
            )
        found = np.array([e is not None for e in encoded], dtype=bool)
        if not found.all():
            summary.dropped["no_completion"] += int((~found).sum())
        kept = table.filter(pa.array(found))
        return pa.table(
            {
                "json": pa.array([e for e in encoded if e is not None], pa.binary()),
                "num_tokens": kept["num_tokens"],
                "num_loss_tokens": kept["num_loss_tokens"],
                "truncated": kept["truncated"],
            }
        )

    def close(self) -> None:
        if self.started:
            self.loop.run_until_complete(self.reader.stop())
        self.loop.close()
