"""The commit marker of a shard: what the window holds, so readers and restarts need not open it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import orjson

# the most frequent drift causes a marker keeps: enough to name a template bug, bounded in size
MAX_DRIFT_CAUSES = 20

# The group epoch of a window: the consumer group's generation id (Kafka's word) in which its
# writer was assigned the partition, the fencing token of what it writes. Markers and manifests
# store it under the key it had before it was named apart from an LLM's generation, so readers
# and writers of either version agree.
EPOCH_KEY = "generation"


def epoch_stored(value: dict[str, Any]) -> dict[str, Any]:
    """A marker's or manifest entry's fields as stored: `epoch` under EPOCH_KEY."""
    return {EPOCH_KEY if k == "epoch" else k: v for k, v in value.items()}


def epoch_read(stored: dict[str, Any]) -> dict[str, Any]:
    """The stored fields as the dataclass names them."""
    return {"epoch" if k == EPOCH_KEY else k: v for k, v in stored.items()}


@dataclass(frozen=True)
class ShardMarker:
    """The commit marker: what a shard holds, so readers and restarts need not open it."""

    partition: int
    start_offset: int
    end_offset: int
    rows: int
    tokens: int
    loss_tokens: int
    sha256: str
    prompt_ids: list[str]
    written_at: float
    # drift report: samples whose rendering was compared with the server's ids, and how many
    # of those differ; samples cut to --max-seq-len. Defaults let older markers decode.
    compared: int = 0
    drifted: int = 0
    truncated: int = 0
    # the writer's group epoch: a newer writer's window supersedes an overlapping older one
    # (sinks/resolve.py). Stored under EPOCH_KEY.
    epoch: int = 0
    # the window's prompt ids that ended as a recorded drop, with the reason kind (policy_* or
    # an error): with the rows, each prompt id of the window has exactly one outcome here
    drops: dict[str, str] = field(default_factory=dict)
    # per row (same order as prompt_ids), so figures can leave out superseded rows
    row_tokens: list[int] = field(default_factory=list)
    row_loss_tokens: list[int] = field(default_factory=list)
    # drift cause (side and first differing tokens, samples.py's DriftCause.key) → samples, the
    # MAX_DRIFT_CAUSES most frequent of the window
    drift_causes: dict[str, int] = field(default_factory=dict)
    # per row (same order as prompt_ids): the SGLang preprocessing profile its prompt was
    # rendered with (streams/core/serving/; "" for completions written before profiles)
    row_normalizations: list[str] = field(default_factory=list)
    # the shard file (in the data directory) when the window shares one with the other windows
    # of its flush, and where its rows start in it; "": the window's own file
    # (`DatasetLayout.shard`), from row 0. `sha256` is the file's.
    shard: str = ""
    row_start: int = 0
    # rows in that file, all windows' (0: the window's own file, `rows`)
    shard_rows: int = 0
    # the sample policy's verdicts in the window (streams/tokenize/policies.py): "drop:RULE" or
    # "flag:RULE" → source → completions, and a few examples of each ("prompt_id: text")
    gate: dict[str, dict[str, int]] = field(default_factory=dict)
    gate_examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def file_rows(self) -> int:
        return self.shard_rows or self.rows

    @staticmethod
    def top_causes(causes: Iterable[str | None]) -> dict[str, int]:
        return dict(Counter(c for c in causes if c).most_common(MAX_DRIFT_CAUSES))

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.partition, self.start_offset, self.epoch)

    def encode(self) -> bytes:
        return orjson.dumps(epoch_stored(self.__dict__))

    @classmethod
    def decode(cls, raw: bytes) -> ShardMarker:
        # Fields a newer writer added are ignored, so a reader may be older than the writer.
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in epoch_read(orjson.loads(raw)).items() if k in known})
