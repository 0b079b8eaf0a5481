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

The check itself is `Audit` (audit_check.py); this module reads the topics into it.

`republish` sends each prompt without an outcome (its first copy; a regenerate copy without its
own outcome, once all are read) back to the prompts topic with its key and value unchanged.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from aiokafka import AIOKafkaProducer
from tqdm import tqdm

from sinks.shards import ShardStore
from streams.core.settings import (
    COMPLETIONS,
    DEAD_LETTERS,
    GENERATE_GROUP,
    GENERATED,
    PROMPTS,
    KafkaSettings,
)
from streams.core.topic_reader import TopicReader
from streams.tools.audit_check import MAX_LISTED, Audit, Record, prompt_id_of
from streams.tools.audit_dataset import VersionCheck, open_version
from streams.tools.audit_report import AuditResult, Retention, retention_of
from streams.tools.seal import group_offsets

__all__ = ["AuditResult", "audit", "republish_command"]

# republished prompts awaiting the broker's acknowledgement
_MAX_OUTSTANDING = 1000


def republish_command(
    program: Sequence[str], kafka: KafkaSettings, version: Sequence[str] = ()
) -> str:
    """The command that republishes the prompts without an outcome; `program`: how to call
    draftgen (streams/cli/run_summary.py's `draftgen_command()`); `version`: its --out/--dataset."""
    words = [*program, "audit", "--bootstrap", kafka.bootstrap]
    if kafka.topic_prefix:
        words += ["--topic-prefix", kafka.topic_prefix]
    return shlex.join([*words, *version, "--republish"])


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
                mine = batch if only is None else [r for r in batch if prompt_id_of(r) in only]
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
