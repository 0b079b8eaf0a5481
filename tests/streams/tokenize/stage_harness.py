"""The tokenize stage's test harness: in-memory events, a fake sample builder, and the stage
over a store on the local filesystem (no Kafka, no S3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from sinks.reader import DatasetReader
from sinks.shards import ShardStore
from streams.core.crash_guard import CrashGuard
from streams.core.records import CompletionRecord, DeadLetter
from streams.core.retry import Backoff
from streams.core.settings import KafkaSettings
from streams.tokenize.samples import DriftCause, Sample, SampleBuilder, SampleError
from streams.tokenize.stage import TokenizeStage
from tests.fakes import TP, FakeEvent, Message
from tests.ids import as_list


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
        epoch: int = 0,
        guard: CrashGuard | None = None,
        prompts: frozenset[str] | None = None,
        tokenized_with: dict[str, str] | None = None,
        **settings: Any,
    ):
        self.log: list[tuple[Any, ...]] = []
        self.values: list[bytes] = []  # the dead letters as sent
        self.values_added: list[bytes] = []  # the records consumed
        self.now = 0.0
        self.store = ShardStore(str(tmp_path), "v1")
        self.builder = FakeBuilder()
        self.worker = TokenizeStage(
            cast(Any, Settings(**settings)),
            cast(SampleBuilder, self.builder),
            self.store,
            self.send,
            dead_letters_topic="dead-letters",
            backoff=Backoff(initial_s=0.0, max_s=0.0),
            clock=self.clock,
            epoch=lambda: epoch,
            guard=guard,
            prompts=prompts,
            tokenized_with=tokenized_with,
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
        tp = TP("completions", partition)
        event = FakeEvent(Message(tp, self.offset), value, self.log, key=key)
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
        return [entry[2] for entry in self.log if entry[0] == "ack"]
