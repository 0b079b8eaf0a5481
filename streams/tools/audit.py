"""`draftgen audit`: does every published prompt have an outcome? Read from the topics alone.

A prompt's outcome is any of: a completion keyed by its prompt id, a dead letter carrying its
prompt id, or a mark in the `generated` ledger (``{prompt_id}@{settings}``, with ``!dead`` after
it for a dead letter: streams/core/ledger.py), under any generation settings. With `--regen
every-turn` the turns of a conversation are completed and dead-lettered under their own ids
(``{conversation}-t{t}of{n}``, streams/core/turns.py): a turn's outcome counts for the
conversation's prompt, whose ledger mark carries the conversation's id.

It streams, so memory stays bounded at the seed run's 902K prompts: the ids with an outcome are
kept as 64-bit hashes (8 bytes each, as `seal` and `status` keep theirs), the prompts are read
after them and checked a batch at a time, and only prompts without an outcome are decoded (at
most `MAX_LISTED` of them kept for the listing; the others are counted).

The order of the reads: the prompts topic's end offsets and the generate group's committed
offsets first, then the outcome topics to their current ends, then the prompts up to the ends
noted first. An outcome written while the audit runs is seen; a prompt published meanwhile is not
judged.

`republish` sends each prompt without an outcome (its first copy) back to the prompts topic
with its key and value unchanged: it has no ledger mark, so a generate worker takes it.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from aiokafka import AIOKafkaProducer
from tqdm import tqdm

from streams.core.ledger import DEAD, outcome_key, split_key
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
from streams.tools.seal import group_offsets

# prompts without an outcome kept for the listing; more are counted (and republished)
MAX_LISTED = 10_000
# hashes gathered in a Python list before they become an array
_CHUNK = 65_536
# republished prompts awaiting the broker's acknowledgement
_MAX_OUTSTANDING = 1000

Hashes = npt.NDArray[np.int64]


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


class HashedIds:
    """A set of strings kept as their 64-bit hashes, 8 bytes each once compacted. Python's
    `hash` of a str is salted per process: fine within one audit. A collision (~1e-7 at the
    seed run's size) would hide one prompt without an outcome."""

    def __init__(self) -> None:
        self._new: list[int] = []
        self._chunks: list[Hashes] = []
        self._kept: Hashes = np.empty(0, dtype=np.int64)  # sorted, unique

    def add(self, text: str) -> None:
        self._new.append(hash(text))
        if len(self._new) >= _CHUNK:
            self._flush()

    def add_hashes(self, hashes: Hashes) -> None:
        self._chunks.append(hashes)
        self._compact(force=False)

    def sorted(self) -> Hashes:
        """Every id added, hashed: sorted and unique."""
        self._flush()
        self._compact(force=True)
        return self._kept

    def __len__(self) -> int:
        return len(self.sorted())

    def contains(self, hashes: Hashes) -> npt.NDArray[np.bool_]:
        kept = self.sorted()
        if not len(kept):
            return np.zeros(len(hashes), dtype=bool)
        at = np.searchsorted(kept, hashes).clip(max=len(kept) - 1)
        return np.asarray(kept[at] == hashes)

    def _flush(self) -> None:
        if self._new:
            self._chunks.append(np.array(self._new, dtype=np.int64))
            self._new = []
            self._compact(force=False)

    def _compact(self, force: bool) -> None:
        # once the new hashes outgrow the kept ones: amortized, and repeats (an id written
        # many times) do not grow memory
        pending = sum(len(chunk) for chunk in self._chunks)
        if pending and (force or pending >= max(len(self._kept), _CHUNK)):
            self._kept = _sorted_unique(np.concatenate([self._kept, *self._chunks]))
            self._chunks = []


def _sorted_unique(hashes: Hashes) -> Hashes:
    # a sort and a neighbour test: several times faster than np.unique (numpy 2.3 hashes)
    hashes.sort()
    if len(hashes) < 2:
        return hashes
    keep = np.empty(len(hashes), dtype=bool)
    keep[0] = True
    np.not_equal(hashes[1:], hashes[:-1], out=keep[1:])
    return hashes[keep]


@dataclass(frozen=True, slots=True)
class MissingPrompt:
    """A published prompt without an outcome, where its latest copy is in the prompts topic."""

    prompt_id: str
    source: str
    source_id: str | None
    partition: int
    offset: int
    # the generate group has not committed past its latest copy: it may still be generated
    pending: bool
    copies: int = 1

    @property
    def position(self) -> str:
        return f"{self.partition}@{self.offset}"


@dataclass
class AuditResult:
    prompts: int = 0  # distinct prompt ids in the prompts topic
    records: int = 0  # prompt records read (copies included)
    missing: int = 0  # prompt ids without an outcome
    pending: int = 0  # of those: not committed past by the generate group yet
    # the missing prompts (at most MAX_LISTED), by partition and offset
    listed: list[MissingPrompt] = field(default_factory=list)
    republished: int = 0

    @property
    def complete(self) -> bool:
        return self.missing == 0

    def summary(self) -> str:
        if self.complete:
            return f"every prompt has an outcome ({self.prompts} prompts)"
        line = f"{self.missing} of {self.prompts} prompts have no outcome"
        if self.pending:
            line += (
                f" ({self.pending} not yet committed by the generate workers: still pending "
                "while a run goes on)"
            )
        return line

    def lines(self, command: str) -> list[str]:
        """The summary; when prompts are missing, each one (prompt id, source, source id,
        partition@offset in the prompts topic, lost or pending) and the command that
        republishes them."""
        lines = [self.summary()]
        if self.complete:
            return lines
        rows = [
            (m.prompt_id, m.source or "-", m.source_id or "-", m.position, _state(m))
            for m in self.listed
        ]
        header = ("prompt id", "source", "source id", "partition@offset", "state")
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
        for row in [header, *rows]:
            cells = [f"{cell:{width}}" for cell, width in zip(row, widths, strict=False)]
            lines.append("  " + "  ".join([*cells, row[-1]]))
        if self.missing > len(self.listed):
            lines.append(f"  … and {self.missing - len(self.listed)} more")
        lines.append(f"republish them: {command}")
        return lines

    def as_json(self, command: str) -> dict[str, Any]:
        return {
            "prompts": self.prompts,
            "records": self.records,
            "missing": self.missing,
            "pending": self.pending,
            "missing_prompts": [
                {
                    "prompt_id": m.prompt_id,
                    "source": m.source,
                    "source_id": m.source_id,
                    "partition": m.partition,
                    "offset": m.offset,
                    "state": _state(m),
                    "copies": m.copies,
                }
                for m in self.listed
            ],
            "listed": len(self.listed),
            "republished": self.republished,
            "republish_command": None if self.complete else command,
        }


def _state(missing: MissingPrompt) -> str:
    # lost: the generate group committed past it, so no worker will take it again
    return "pending" if missing.pending else "lost"


def republish_command(program: Sequence[str], kafka: KafkaSettings) -> str:
    """The command that republishes the prompts without an outcome; `program`: how to call
    draftgen (streams/cli/run.py's `draftgen_command()`)."""
    words = [*program, "audit", "--bootstrap", kafka.bootstrap]
    if kafka.topic_prefix:
        words += ["--topic-prefix", kafka.topic_prefix]
    return shlex.join([*words, "--republish"])


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


class Audit:
    """The check itself, fed records: every outcome first, then the prompts."""

    def __init__(self, committed: dict[int, int] | None = None, listed: int = MAX_LISTED):
        # the generate group's committed offset per partition of the prompts topic
        self.committed = committed or {}
        self.max_listed = listed
        self.outcomes = HashedIds()
        self._prompts = HashedIds()
        self._records = 0
        self._listed: dict[int, MissingPrompt] = {}  # by hash, in the order found
        self._unlisted: dict[int, bool] = {}  # by hash: pending (latest copy)

    # -- outcomes ---------------------------------------------------------------------------

    def outcome(self, prompt_id: str) -> None:
        self.outcomes.add(prompt_id)
        turn = parse_turn_id(prompt_id)
        if turn is not None:
            self.outcomes.add(turn[0])  # a turn's outcome is its conversation's

    def ledger_mark(self, key: bytes | None) -> None:
        text = outcome_key((key or b"").decode("utf-8", "replace"))
        if text is None:
            return  # a claim: a request running, no outcome
        prompt_id = split_key(text.removesuffix(DEAD))[0]
        if prompt_id:
            self.outcome(prompt_id)

    def completion(self, key: bytes | None, value: bytes | None) -> None:
        if key:
            self.outcome(key.decode("utf-8", "replace"))
            return
        prompt = _decoded(value)  # completions are keyed; an unkeyed one names its prompt
        if prompt is not None:
            self.outcome(prompt.prompt_id)

    def dead_letter(self, value: bytes | None) -> None:
        try:
            letter = DeadLetter.decode(value or b"")
        except RecordError:
            return
        if letter.prompt_id:
            self.outcome(letter.prompt_id)

    # -- prompts ----------------------------------------------------------------------------

    def prompts(self, records: Sequence[Record]) -> list[Record]:
        """Check a batch of prompt records; returns the first copy of each prompt found
        without an outcome (what `republish` sends)."""
        if not records:
            return []
        ids = [_prompt_id(record) for record in records]
        hashes = np.fromiter(map(hash, ids), dtype=np.int64, count=len(ids))
        self._prompts.add_hashes(hashes)
        self._records += len(records)
        first = []
        for index in np.flatnonzero(~self.outcomes.contains(hashes)).tolist():
            record, digest = records[index], int(hashes[index])
            pending = record.offset >= self.committed.get(record.partition, 0)
            if (earlier := self._listed.get(digest)) is not None:
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

    def result(self) -> AuditResult:
        listed = sorted(self._listed.values(), key=lambda m: (m.partition, m.offset))
        return AuditResult(
            prompts=len(self._prompts),
            records=self._records,
            missing=len(self._listed) + len(self._unlisted),
            pending=sum(m.pending for m in listed) + sum(self._unlisted.values()),
            listed=listed,
        )


# -- reading the topics ---------------------------------------------------------------------


def _bar(reader: TopicReader, what: str, progress: bool) -> tqdm[Any]:
    total = sum(reader.ends_at_open.values())
    return tqdm(
        total=total, unit="record", desc=what, disable=not progress, file=sys.stderr, leave=False
    )


async def _read_outcomes(kafka: KafkaSettings, audit_: Audit, progress: bool) -> None:
    topics: list[tuple[str, Callable[[Any], None]]] = [
        (GENERATED, lambda record: audit_.ledger_mark(record.key)),
        (COMPLETIONS, lambda record: audit_.completion(record.key, record.value)),
        (DEAD_LETTERS, lambda record: audit_.dead_letter(record.value)),
    ]
    for name, handle in topics:
        reader = TopicReader(kafka, kafka.topic(name))
        try:
            if not await reader.open():
                continue  # not created yet: no outcome of that kind
            with _bar(reader, name.replace("-", " "), progress) as bar:

                def each(record: Any, handle: Callable[[Any], None] = handle) -> None:
                    handle(record)
                    bar.update()

                await reader.read_to_end(each)
        finally:
            await reader.close()


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
) -> AuditResult:
    """Every prompt in the prompts topic without an outcome; `republish`: also send each of
    them back to the prompts topic; `progress`: bars on stderr (for a terminal)."""
    prompts = TopicReader(kafka, kafka.topic(PROMPTS))
    sender: _Republisher | None = None
    try:
        if not await prompts.open():
            return AuditResult()  # no prompts topic: nothing was published
        ends = {tp.partition: end for tp, end in prompts.ends_at_open.items()}
        committed, _ = await group_offsets(kafka, kafka.group(GENERATE_GROUP), prompts.topic)
        check = Audit(committed, listed)
        await _read_outcomes(kafka, check, progress)
        check.outcomes.sorted()
        if republish:
            sender = _Republisher(kafka)
            await sender.producer.start()
        with _bar(prompts, "prompts", progress) as bar:
            while not await prompts.caught_up():
                batch = [r for r in await prompts.read() if r.offset < ends[r.partition]]
                for record in check.prompts(batch):
                    if sender is not None:
                        await sender.send(record)
                bar.update(len(batch))
        if sender is not None:
            await sender.flush()
        result = check.result()
        result.republished = sender.sent if sender is not None else 0
        return result
    finally:
        if sender is not None:
            await sender.producer.stop()
        await prompts.close()
