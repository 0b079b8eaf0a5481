"""`draftgen audit`: does every published prompt have an outcome, under the dataset's
generation settings, and (with `--out`/`--dataset`) is every completion the version committed in
it? Read from the topics (and the version's markers).

A prompt's outcome is any of: a completion of it, a dead letter of the publish or generate stage
carrying its prompt id, or a mark in the `generated` ledger (``{prompt_id}@{settings}``, with
``!dead`` after it for a dead letter: streams/core/ledger.py). With `--regen every-turn` the turns
of a conversation are completed and dead-lettered under their own ids
(``{conversation}-t{t}of{n}``, streams/core/turns.py): a turn's outcome counts for the
conversation's prompt, whose ledger mark carries the conversation's id.

The settings an outcome counts under: without a version, any. With one, the settings of its
samples (audit_dataset.py): a completion or a ledger mark counts only under them (a completion's
settings are hashed from its `model`, `sampling`, thinking and regen mode as the ledger hashes
them, audit_ids.py); a dead letter carries no settings, so it counts unless the ledger marks that
prompt `!dead` under other settings only.

A copy published again to be regenerated (meta `regenerate`: `publish --regenerate`,
`dead-letters --republish`) needs its own outcome: a completion, or a generate dead letter,
made from that copy. Both carry the `published_at` of the prompt copy they answer (the
publisher's clock, copied as is: no clock of another host is compared), so the prompt's latest
such copy needs an outcome carrying its `published_at`; a later copy of it (same partition,
Kafka's order) that was answered settles it.

It streams, so memory stays bounded at the seed run's 902K prompts: the ids with an outcome are
kept as 64-bit hashes (8 bytes each, per settings; 8 more per completion for the copy it
answers), the prompts are read after them and checked a batch at a time, and only prompts
without an outcome are decoded (at most `MAX_LISTED` of them kept for the listing; the others
are counted), besides the regenerate copies without their own outcome (kept to be sent again).

The order of the reads: the prompts topic's end and start offsets and the generate group's
committed offsets first, then the dead letters, completions and ledger to their current ends,
then the prompts up to the ends noted first. An outcome written while the audit runs is seen; a
prompt published meanwhile is not judged. Retention: records before a partition's log start
offset are gone; those at or past the generate group's committed offset were never read by it,
and a ledger claim (a request started) of a prompt with no outcome that is no longer in the
topic names a prompt lost with its record.

`republish` sends each prompt without an outcome (its first copy; a regenerate copy without its
own outcome, once all are read) back to the prompts topic with its key and value unchanged.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np
from aiokafka import AIOKafkaProducer
from tqdm import tqdm

from sinks.shards import ShardStore
from streams.core.ledger import CLAIM, DEAD, outcome_key, split_key
from streams.core.records import DeadLetter, PromptRecord, RecordError
from streams.core.settings import (
    COMPLETIONS,
    DEAD_LETTERS,
    GENERATE_GROUP,
    GENERATED,
    PROMPTS,
    KafkaSettings,
)
from streams.core.topic_reader import TopicReader
from streams.core.turns import parse_turn_id
from streams.tools.audit_dataset import VersionCheck, open_version
from streams.tools.audit_ids import (
    CompletionFacts,
    HashedIds,
    completion_facts,
    published_at,
    union,
)
from streams.tools.audit_report import AuditResult, MissingPrompt, Retention, retention_of
from streams.tools.seal import group_offsets

__all__ = ["Audit", "AuditResult", "HashedIds", "MissingPrompt", "audit", "republish_command"]

# prompts without an outcome kept for the listing; more are counted (and republished)
MAX_LISTED = 10_000
# republished prompts awaiting the broker's acknowledgement
_MAX_OUTSTANDING = 1000
# the stages whose dead letter is a prompt's outcome (a tokenize letter is its completion's)
OUTCOME_STAGES = ("publish", "generate")


class Record(Protocol):
    """What the audit needs of a consumed record (aiokafka's ConsumerRecord has it)."""

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...


def republish_command(
    program: Sequence[str], kafka: KafkaSettings, version: Sequence[str] = ()
) -> str:
    """The command that republishes the prompts without an outcome; `program`: how to call
    draftgen (streams/cli/run.py's `draftgen_command()`); `version`: its --out/--dataset."""
    words = [*program, "audit", "--bootstrap", kafka.bootstrap]
    if kafka.topic_prefix:
        words += ["--topic-prefix", kafka.topic_prefix]
    return shlex.join([*words, *version, "--republish"])


def _decoded(value: bytes | None) -> PromptRecord | None:
    try:
        return PromptRecord.decode(value or b"")
    except RecordError:
        return None


def _prompt_id(record: Record) -> str:
    if record.key:
        return record.key.decode("utf-8", "replace")
    prompt = _decoded(record.value)  # a record without a key: its own prompt_id, if any
    return prompt.prompt_id if prompt is not None else ""


def _root(prompt_id: str) -> str:
    turn = parse_turn_id(prompt_id)  # a turn's outcome is its conversation's
    return turn[0] if turn is not None else prompt_id


class Audit:
    """The check itself, fed records: every outcome first, then `settle` (which settings
    count), then the prompts."""

    def __init__(self, committed: dict[int, int] | None = None, listed: int = MAX_LISTED):
        # the generate group's committed offset per partition of the prompts topic
        self.committed = committed or {}
        self.max_listed = listed
        # per settings hash: prompt ids with a completion or a ledger mark; the (prompt id,
        # published_at) of the copies its completions answer; the ids marked `!dead`
        self._settled: dict[str, HashedIds] = {}
        self._answers: dict[str, HashedIds] = {}
        self._dead: dict[str, HashedIds] = {}
        self._letters = HashedIds()  # ids with a dead letter of the publish or generate stage
        self._letter_answers = HashedIds()  # (id, published_at) of generate letters' payloads
        self._claims: dict[int, str] = {}  # claimed prompts with no outcome when read
        self.models: dict[str, str] = {}  # settings hash -> the model of its completions
        self.settings: frozenset[str] | None = None
        self.outcomes = HashedIds()
        self.answers = HashedIds()
        self._settled_yet = False
        self._prompts = HashedIds()
        self._records = 0
        self._listed: dict[int, MissingPrompt] = {}  # by hash, in the order found
        self._unlisted: dict[int, bool] = {}  # by hash: pending (latest copy)
        # by hash: a regenerate copy without its own outcome (its latest), and its record
        self._regen: dict[int, tuple[MissingPrompt, Record]] = {}

    # -- outcomes ---------------------------------------------------------------------------

    def ledger_mark(self, key: bytes | None) -> None:
        text = (key or b"").decode("utf-8", "replace")
        if outcome_key(text) is None:  # a claim: a request started, no outcome
            prompt_id = _root(split_key(text.removesuffix(CLAIM))[0])
            if prompt_id and not self._answered_any(prompt_id):
                self._claims[hash(prompt_id)] = prompt_id
            return
        prompt_id, settings = split_key(text.removesuffix(DEAD))
        if not prompt_id:
            return
        self._ids(self._settled, settings).add(_root(prompt_id))
        if text.endswith(DEAD):
            self._ids(self._dead, settings).add(_root(prompt_id))

    def completion(self, key: bytes | None, value: bytes | None) -> CompletionFacts | None:
        facts = completion_facts(key, value)
        if facts is not None:
            self._ids(self._settled, facts.settings).add(facts.prompt_id)
            self._ids(self._answers, facts.settings).add((facts.prompt_id, facts.published_at))
            self.models.setdefault(facts.settings, facts.model)
        return facts

    def dead_letter(self, value: bytes | None) -> DeadLetter | None:
        try:
            letter = DeadLetter.decode(value or b"")
        except RecordError:
            return None
        if letter.stage in OUTCOME_STAGES and letter.prompt_id:
            prompt_id = _root(letter.prompt_id)
            self._letters.add(prompt_id)
            published = published_at(letter.payload_bytes(), regenerate=False)
            if letter.stage == "generate" and published is not None:
                self._letter_answers.add((prompt_id, published))
        return letter

    def settle(self, settings: Iterable[str] | None) -> None:
        """Which settings an outcome counts under (None: any)."""
        self.settings = None if settings is None else frozenset(settings)

        def chosen(table: dict[str, HashedIds]) -> list[HashedIds]:
            return [ids for s, ids in table.items() if self.settings is None or s in self.settings]

        self.outcomes = union(chosen(self._settled))
        letters = self._letters.sorted()
        if self.settings is not None:  # a letter counts unless marked under other settings only
            other = union([ids for s, ids in self._dead.items() if s not in self.settings])
            letters = letters[~other.contains(letters)]
        self.outcomes.add_hashes(letters.copy())
        self.answers = union([*chosen(self._answers), self._letter_answers])
        self._settled_yet = True

    def _ids(self, table: dict[str, HashedIds], settings: str) -> HashedIds:
        return table.setdefault(settings, HashedIds())

    def _answered_any(self, prompt_id: str) -> bool:
        return prompt_id in self._letters or any(prompt_id in s for s in self._settled.values())

    # -- prompts ----------------------------------------------------------------------------

    def prompts(self, records: Sequence[Record]) -> list[Record]:
        """Check a batch of prompt records; returns the first copy of each prompt found
        without an outcome (what `republish` sends)."""
        if not records:
            return []
        if not self._settled_yet:
            self.settle(None)
        ids = [_prompt_id(record) for record in records]
        hashes = np.fromiter(map(hash, ids), dtype=np.int64, count=len(ids))
        self._prompts.add_hashes(hashes)
        self._records += len(records)
        missing = ~self.outcomes.contains(hashes)
        first = []
        for index, record in enumerate(records):
            digest = int(hashes[index])
            pending = record.offset >= self.committed.get(record.partition, 0)
            if not missing[index]:
                self._republished(record, ids[index], digest, pending)
            elif (earlier := self._listed.get(digest)) is not None:
                self._listed[digest] = replace(
                    earlier,
                    partition=record.partition,
                    offset=record.offset,
                    pending=pending,
                    copies=earlier.copies + 1,
                )
            elif digest in self._unlisted:
                self._unlisted[digest] = pending
            else:
                first.append(record)
                if len(self._listed) < self.max_listed:
                    self._listed[digest] = self._missing(record, ids[index], pending)
                else:
                    self._unlisted[digest] = pending
        return first

    def _republished(self, record: Record, prompt_id: str, digest: int, pending: bool) -> None:
        earlier = self._regen.get(digest)
        published = published_at(record.value, regenerate=earlier is None)
        if published is None:
            return  # not a regenerate copy, nor a later copy of one without its own outcome
        if (prompt_id, published) in self.answers:
            self._regen.pop(digest, None)  # this copy (or a later one) was answered
        elif published_at(record.value, regenerate=True) is not None:
            copies = earlier[0].copies + 1 if earlier is not None else 1
            missing = self._missing(record, prompt_id, pending)
            self._regen[digest] = (replace(missing, copies=copies, republished=True), record)

    def _missing(self, record: Record, prompt_id: str, pending: bool) -> MissingPrompt:
        prompt = _decoded(record.value)  # only the prompts without an outcome are decoded
        return MissingPrompt(
            prompt_id=prompt_id,
            source=prompt.source if prompt is not None else "",
            source_id=prompt.source_id if prompt is not None else None,
            partition=record.partition,
            offset=record.offset,
            pending=pending,
        )

    def regenerate_copies(self) -> list[Record]:
        """The regenerate copies without their own outcome, to send again."""
        return [record for _, record in self._regen.values()]

    def result(self) -> AuditResult:
        regen = [missing for missing, _ in self._regen.values()]
        room = max(0, self.max_listed - len(self._listed))
        listed = sorted(
            [*self._listed.values(), *regen[:room]], key=lambda m: (m.partition, m.offset)
        )
        everything = union([*self._settled.values(), self._letters])
        prompts = self._prompts.sorted()
        settled = union(list(self._settled.values())).sorted()
        gone = [
            prompt_id
            for digest, prompt_id in self._claims.items()
            if not everything.contains(np.array([digest]))[0]
            and not self._prompts.contains(np.array([digest]))[0]
        ]
        return AuditResult(
            prompts=len(prompts),
            records=self._records,
            missing=len(self._listed) + len(self._unlisted) + len(regen),
            pending=sum(m.pending for m in self._listed.values())
            + sum(self._unlisted.values())
            + sum(m.pending for m in regen),
            listed=listed,
            settings=None
            if self.settings is None
            else {s: self.models.get(s, "") for s in sorted(self.settings)},
            retention=Retention(
                claimed=sorted(gone)[: self.max_listed],
                answered=int((~self._prompts.contains(settled)).sum()),
            ),
        )


# -- reading the topics ---------------------------------------------------------------------


def _bar(reader: TopicReader, what: str, progress: bool) -> tqdm[Any]:
    total = sum(reader.ends_at_open.values())
    return tqdm(
        total=total, unit="record", desc=what, disable=not progress, file=sys.stderr, leave=False
    )


async def _read(
    kafka: KafkaSettings, name: str, handle: Callable[[Any], Any], progress: bool
) -> None:
    reader = TopicReader(kafka, kafka.topic(name))
    try:
        if not await reader.open():
            return  # not created yet: no outcome of that kind
        with _bar(reader, name.replace("-", " "), progress) as bar:

            def each(record: Any) -> None:
                handle(record)
                bar.update()

            await reader.read_to_end(each)
    finally:
        await reader.close()


async def _read_outcomes(
    kafka: KafkaSettings, check: Audit, version: VersionCheck | None, progress: bool
) -> None:
    """Dead letters first (the version check needs them before the completions), then the
    completions, then the ledger (a claim is kept only if no outcome was read before it)."""

    def letter(record: Any) -> None:
        found = check.dead_letter(record.value)
        if version is not None and found is not None:
            version.dead_letter(found.stage, found.origin)

    def completion(record: Any) -> None:
        facts = check.completion(record.key, record.value)
        if version is None:
            return
        if facts is None:
            version.unreadable(record.partition, record.offset, record.key)
        else:
            version.completion(record.partition, record.offset, facts.own_id, facts.settings)

    await _read(kafka, DEAD_LETTERS, letter, progress)
    await _read(kafka, COMPLETIONS, completion, progress)
    await _read(kafka, GENERATED, lambda record: check.ledger_mark(record.key), progress)


class _Republisher:
    """Sends prompt records back to the prompts topic, a bounded number unacknowledged."""

    def __init__(self, kafka: KafkaSettings):
        self.topic = kafka.topic(PROMPTS)
        self.producer = AIOKafkaProducer(
            **kafka.aiokafka_kwargs(), linger_ms=20, **kafka.producer_kwargs()
        )
        self.sent = 0
        self._pending: set[asyncio.Future[Any]] = set()

    async def send(self, record: Record) -> None:
        self._pending.add(await self.producer.send(self.topic, key=record.key, value=record.value))
        self.sent += 1
        if len(self._pending) >= _MAX_OUTSTANDING:
            done, self._pending = await asyncio.wait(
                self._pending, return_when=asyncio.FIRST_COMPLETED
            )
            for future in done:
                future.result()  # a failed send fails the command

    async def flush(self) -> None:
        for future in await asyncio.gather(*self._pending, return_exceptions=True):
            if isinstance(future, BaseException):
                raise future
        self._pending = set()
        await self.producer.flush()


async def audit(
    kafka: KafkaSettings,
    *,
    republish: bool = False,
    progress: bool = False,
    listed: int = MAX_LISTED,
    store: ShardStore | None = None,
    dataset: str | None = None,
    only: set[str] | None = None,
) -> AuditResult:
    """Every prompt in the prompts topic without an outcome; with `store` and `dataset`, under
    that version's settings, and the version's own check; `republish`: also send each of them
    back to the prompts topic; `progress`: bars on stderr (for a terminal); `only`: of these
    prompt ids alone (one run's, on a stack that holds others)."""
    prompts = TopicReader(kafka, kafka.topic(PROMPTS))
    sender: _Republisher | None = None
    try:
        version = None
        if store is not None and dataset is not None:
            version = await open_version(kafka, store, dataset, listed)
        if not await prompts.open():
            return AuditResult()  # no prompts topic: nothing was published
        ends = {tp.partition: end for tp, end in prompts.ends_at_open.items()}
        starts = {tp.partition: start for tp, start in (await prompts.starts()).items()}
        committed, _ = await group_offsets(kafka, kafka.group(GENERATE_GROUP), prompts.topic)
        check = Audit(committed, listed)
        await _read_outcomes(kafka, check, version, progress)
        checked = version.finish() if version is not None else None
        # a version without samples has no settings of its own: any count
        check.settle(set(checked.settings) if checked is not None and checked.settings else None)
        if republish:
            sender = _Republisher(kafka)
            await sender.producer.start()
        with _bar(prompts, "prompts", progress) as bar:
            while not await prompts.caught_up():
                batch = [r for r in await prompts.read() if r.offset < ends[r.partition]]
                mine = batch if only is None else [r for r in batch if _prompt_id(r) in only]
                for record in check.prompts(mine):
                    if sender is not None:
                        await sender.send(record)
                bar.update(len(batch))
        if sender is not None:
            for record in check.regenerate_copies():
                await sender.send(record)
            await sender.flush()
        result = check.result()
        kept = retention_of(starts, committed)
        # a claimed prompt gone from the topic: only retention deletes prompts
        result.retention = replace(kept, **_known(result.retention)) if kept.deleted else kept
        result.version = checked
        result.republished = sender.sent if sender is not None else 0
        return result
    finally:
        if sender is not None:
            await sender.producer.stop()
        await prompts.close()


def _known(found: Retention) -> dict[str, Any]:
    return {"claimed": found.claimed, "answered": found.answered}
