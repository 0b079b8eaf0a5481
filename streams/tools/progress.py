"""Where a run stands: which prompt ids became committed samples or dead letters."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from sinks.shards import ShardStore
from streams.core.records import DeadLetter, RecordError, is_policy_drop
from streams.core.settings import DEAD_LETTERS, KafkaSettings
from streams.core.topic_reader import TopicReader
from streams.tools.seal import group_offsets


@dataclass
class DatasetFigures:
    """A dataset version as its readers see it now (sinks/resolve.py): each prompt id once."""

    samples: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    shards: int = 0  # files holding kept rows (a flush's windows share one)
    prompt_ids: set[str] = field(default_factory=set)  # with an outcome: a sample or a drop
    drops: dict[str, str] = field(default_factory=dict)  # recorded drops: prompt id → kind
    replaced: int = 0  # rows written, then replaced by a later answer of the same prompt
    superseded_windows: int = 0  # windows of a revoked writer, rewritten by the new owner
    # drift report: samples whose rendering was compared with the server's ids, and differed
    compared: int = 0
    drifted: int = 0
    # drift cause → samples, summed over the markers (each keeps its window's most frequent)
    drift_causes: Counter[str] = field(default_factory=Counter)
    truncated: int = 0
    # samples by the SGLang preprocessing profile their prompt was rendered with ("" before
    # profiles were recorded), replaced rows left out
    normalizations: Counter[str] = field(default_factory=Counter)


def dataset_figures(store: ShardStore, *, keep_ids: bool = True) -> DatasetFigures:
    """`keep_ids`: also the prompt ids with an outcome (what `run` waits for); without them
    memory does not grow with the version (`status`). A sealed version is what its manifest
    says: the windows settled below its offsets, as the readers see it."""
    resolution = store.committed(store.sealed_offsets(), keep_ids=keep_ids)
    figures = DatasetFigures(
        samples=resolution.sample_count,
        prompt_ids=resolution.prompt_ids if keep_ids else set(),
        drops=dict(resolution.drops),
        superseded_windows=len(resolution.superseded),
    )
    files: set[str | tuple[int, int, int]] = set()
    for marker in resolution.windows:
        excluded = resolution.exclude.get(marker.key, [])
        figures.replaced += len(excluded)
        if marker.rows > len(excluded):
            files.add(marker.shard or marker.key)
        figures.tokens += marker.tokens - sum(marker.row_tokens[i] for i in excluded)
        figures.loss_tokens += marker.loss_tokens - sum(marker.row_loss_tokens[i] for i in excluded)
        # counted over the rows written (a replaced answer was compared too)
        figures.compared += marker.compared
        figures.drifted += marker.drifted
        figures.drift_causes.update(marker.drift_causes)
        figures.truncated += marker.truncated
        if marker.row_normalizations:
            left_out = set(excluded)
            figures.normalizations.update(
                name for i, name in enumerate(marker.row_normalizations) if i not in left_out
            )
    figures.shards = len(files)
    return figures


@dataclass
class DeadLetterTally:
    by_reason: Counter[tuple[str, str]] = field(default_factory=Counter)
    prompt_ids: set[str] = field(default_factory=set)
    # the subset the sample policy dropped (kind policy_*): deliberate, not failures
    policy_ids: set[str] = field(default_factory=set)
    # prompt ids by the stage that dead-lettered them
    stage_ids: dict[str, set[str]] = field(default_factory=dict)
    # each prompt id's (stage, kind) of its letters: what one run's summary counts
    reasons: dict[str, set[tuple[str, str]]] = field(default_factory=dict)

    def ids_before(self, stage: str) -> set[str]:
        """Prompt ids dead-lettered by any stage but `stage` (a dataset version records the
        tokenize stage's drops in its markers: those are its outcomes, once each)."""
        return set().union(*(ids for name, ids in self.stage_ids.items() if name != stage))

    def reasons_of(self, prompt_ids: set[str]) -> Counter[tuple[str, str]]:
        """(stage, kind) → how many of these prompts have such a letter."""
        return Counter(
            reason for prompt_id in prompt_ids for reason in self.reasons.get(prompt_id, ())
        )

    letters: list[DeadLetter] = field(default_factory=list)


class DeadLetterReader:
    """Reads the dead-letters topic from the start, without a consumer group, incrementally."""

    def __init__(
        self,
        kafka: KafkaSettings,
        keep_letters: bool = False,
        on_letter: Callable[[DeadLetter], None] | None = None,
    ):
        self.kafka = kafka
        self.keep_letters = keep_letters
        # sees each letter once, as it is read (the report notes its source, not its payload)
        self.on_letter = on_letter
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
            self.tally.stage_ids.setdefault(letter.stage, set()).add(letter.prompt_id)
            self.tally.reasons.setdefault(letter.prompt_id, set()).add((letter.stage, letter.kind))
            if is_policy_drop(letter.kind):
                self.tally.policy_ids.add(letter.prompt_id)
        if self.keep_letters:
            self.tally.letters.append(letter)
        if self.on_letter is not None:
            self.on_letter(letter)

    async def close(self) -> None:
        await self._reader.close()


class GroupProgress:
    """How far a consumer group has got through a topic, against the topic's end when the
    progress started: `done` of `total` records lie below the group's committed offsets (what
    a tokenize worker commits only once their shards are). Joins no group."""

    def __init__(self, kafka: KafkaSettings, group: str, topic: str):
        self.kafka = kafka
        self.group = group
        self.topic = kafka.topic(topic)
        self._reader = TopicReader(kafka, self.topic)
        self._ends: dict[int, int] = {}
        self._starts: dict[int, int] = {}
        self._done = 0

    async def start(self) -> None:
        try:
            if await self._reader.open():  # no topic yet: nothing to catch up on
                starts = await self._reader.starts()
                self._starts = {tp.partition: at for tp, at in starts.items()}
                self._ends = {tp.partition: at for tp, at in self._reader.ends_at_open.items()}
        finally:
            await self._reader.close()

    @property
    def total(self) -> int:
        return sum(max(end - self._starts.get(p, 0), 0) for p, end in self._ends.items())

    async def done(self) -> int:
        """Records of the topic (up to its end at start) the group has committed past."""
        if not self._ends:
            return 0
        try:
            committed, _ = await group_offsets(self.kafka, self.group, self.topic)
        except Exception as err:
            # a group not coordinated yet (its first join) or a broker moving leaders: as far
            # as the last look said; the caller looks again
            if getattr(err, "retriable", False):
                return self._done
            raise
        done = 0
        for partition, end in self._ends.items():
            start = self._starts.get(partition, 0)
            at = max(committed.get(partition, start), start)
            done += min(at - start, end - start)
        self._done = done
        return done

    async def close(self) -> None:
        await self._reader.close()
