"""The audit's check, fed records: which prompts have an outcome under the settings that count,
and which regenerate copies have their own (the rules are streams/tools/audit.py's docstring).
It holds ids as 64-bit hashes, so memory stays bounded whatever the topics' size."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Protocol

import numpy as np

from streams.core.ledger import CLAIM, DEAD, outcome_key, split_key
from streams.core.records import DeadLetter, PromptRecord, RecordError
from streams.core.turns import parse_turn_id
from streams.tools.audit_ids import (
    CompletionFacts,
    HashedIds,
    completion_facts,
    published_at,
    union,
)
from streams.tools.audit_report import AuditResult, MissingPrompt, Retention

# prompts without an outcome kept for the listing; more are counted (and republished)
MAX_LISTED = 10_000
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


def _decoded(value: bytes | None) -> PromptRecord | None:
    try:
        return PromptRecord.decode(value or b"")
    except RecordError:
        return None


def prompt_id_of(record: Record) -> str:
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
        ids = [prompt_id_of(record) for record in records]
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
