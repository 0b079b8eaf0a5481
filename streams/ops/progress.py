"""Where a run stands: which prompt ids became committed samples or dead letters."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from sinks.shards import ShardStore
from streams.core.records import DeadLetter, RecordError, is_policy_drop
from streams.core.settings import DEAD_LETTERS, KafkaSettings
from streams.core.topic_reader import TopicReader


@dataclass
class DatasetFigures:
    samples: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    shards: int = 0
    prompt_ids: set[str] = field(default_factory=set)
    duplicate_ids: int = 0
    # drift report: samples whose rendering was compared with the server's ids, and differed
    compared: int = 0
    drifted: int = 0
    truncated: int = 0


def dataset_figures(store: ShardStore) -> DatasetFigures:
    figures = DatasetFigures()
    for marker in store.markers():
        figures.samples += marker.rows
        figures.tokens += marker.tokens
        figures.loss_tokens += marker.loss_tokens
        figures.shards += 1 if marker.rows else 0
        figures.compared += marker.compared
        figures.drifted += marker.drifted
        figures.truncated += marker.truncated
        before = len(figures.prompt_ids)
        figures.prompt_ids.update(marker.prompt_ids)
        figures.duplicate_ids += marker.rows - (len(figures.prompt_ids) - before)
    return figures


@dataclass
class DeadLetterTally:
    by_reason: Counter[tuple[str, str]] = field(default_factory=Counter)
    prompt_ids: set[str] = field(default_factory=set)
    # the subset the sample policy dropped (kind policy_*): deliberate, not failures
    policy_ids: set[str] = field(default_factory=set)
    letters: list[DeadLetter] = field(default_factory=list)


class DeadLetterReader:
    """Reads the dead-letters topic from the start, without a consumer group, incrementally."""

    def __init__(self, kafka: KafkaSettings, keep_letters: bool = False):
        self.kafka = kafka
        self.keep_letters = keep_letters
        self.tally = DeadLetterTally()
        self._reader = TopicReader(kafka, kafka.topic(DEAD_LETTERS))

    async def poll(self) -> DeadLetterTally:
        """Read whatever is new, up to the current end of the topic (none before it exists)."""
        if await self._reader.open():
            await self._reader.read_to_end(lambda record: self._count(record.value))
        return self.tally

    def _count(self, raw: bytes | None) -> None:
        try:
            letter = DeadLetter.decode(raw or b"")
        except RecordError:
            self.tally.by_reason[("?", "undecodable_dead_letter")] += 1
            return
        self.tally.by_reason[(letter.stage, letter.kind)] += 1
        if letter.prompt_id:
            self.tally.prompt_ids.add(letter.prompt_id)
            if is_policy_drop(letter.kind):
                self.tally.policy_ids.add(letter.prompt_id)
        if self.keep_letters:
            self.tally.letters.append(letter)

    async def close(self) -> None:
        await self._reader.close()
