"""`draftgen dead-letters`: list dead letters by stage and reason; re-publish selected ones.

Re-publishing sends each letter's original payload back to the topic its stage reads from
(a prompt to `prompts`, a completion to `completions`; a rejected source row is normalized
again first), so a record dead-lettered before a fix runs through the fixed stage.
"""

from __future__ import annotations

import fnmatch
import time
from collections import Counter
from dataclasses import dataclass

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from streams.core.delivery import refused_for_good
from streams.core.ledger import REGENERATE
from streams.core.normalize import make_prompt_record
from streams.core.records import (
    REMOVED_KINDS,
    CompletionRecord,
    DeadLetter,
    PromptRecord,
    RecordError,
)
from streams.core.settings import COMPLETIONS, PROMPTS, KafkaSettings
from streams.core.topics import within_topic_limits
from streams.tools.progress import DeadLetterReader

# stage -> the topic whose consumer produced the letter
_INPUT_TOPIC = {"generate": PROMPTS, "tokenize": COMPLETIONS, "publish": PROMPTS}


@dataclass
class Selection:
    stage: str | None = None
    kind: str | None = None  # a glob, e.g. "retries_exhausted*"

    def matches(self, letter: DeadLetter) -> bool:
        if self.stage and letter.stage != self.stage:
            return False
        return not self.kind or fnmatch.fnmatch(letter.kind, self.kind)


async def read_dead_letters(kafka: KafkaSettings) -> list[DeadLetter]:
    reader = DeadLetterReader(kafka, keep_letters=True)
    try:
        return (await reader.poll()).letters
    finally:
        await reader.close()


def summarize(letters: list[DeadLetter]) -> list[str]:
    counts = Counter((letter.stage, letter.kind) for letter in letters)
    example: dict[tuple[str, str], str] = {}
    for letter in letters:
        example.setdefault((letter.stage, letter.kind), letter.message)
    lines = [f"{len(letters)} dead letters"]
    for (stage, kind), count in sorted(counts.items()):
        lines.append(f"  {stage:9} {kind:28} {count:7}   e.g. {example[(stage, kind)][:80]}")
    return lines


@dataclass(frozen=True)
class FailedPrompt:
    """One line of the listing: which prompt, from which row of the user's data, where and why."""

    prompt_id: str | None
    source_id: str | None
    stage: str
    kind: str
    message: str
    origin: str | None
    at: float


def payload_source_id(letter: DeadLetter) -> str | None:
    """The source row's id of a letter: its own field, else its payload's (a prompt or a
    completion record); None when neither says (or the payload was cut)."""
    if letter.source_id is not None or letter.payload_truncated or letter.stage == "publish":
        return letter.source_id
    record_type = CompletionRecord if letter.stage == "tokenize" else PromptRecord
    try:
        return record_type.decode(letter.payload_bytes()).source_id
    except RecordError:
        return None


def failed_prompts(letters: list[DeadLetter]) -> list[FailedPrompt]:
    """One entry per prompt and stage (its latest letter: a letter sent again after a crash
    is one failure), in the order the letters were written."""
    latest: dict[tuple[str | None, str] | int, DeadLetter] = {}
    for index, letter in enumerate(letters):
        key = (letter.prompt_id, letter.stage) if letter.prompt_id else index
        latest.pop(key, None)
        latest[key] = letter
    return [
        FailedPrompt(
            letter.prompt_id,
            payload_source_id(letter),
            letter.stage,
            letter.kind,
            letter.message,
            letter.origin,
            letter.at,
        )
        for letter in latest.values()
    ]


def listing(letters: list[DeadLetter]) -> list[str]:
    """The counts, then every failed prompt: prompt id, source id, stage, reason."""
    failed = failed_prompts(letters)
    width = max((len(f.prompt_id or "-") for f in failed), default=9)
    source_width = max((len(f.source_id or "-") for f in failed), default=9)
    lines = summarize(letters)
    if failed:
        lines.append("")
        lines.append(f"{'prompt id':{width}}  {'source id':{source_width}}  {'stage':9}  reason")
    for f in failed:
        lines.append(
            f"{f.prompt_id or '-':{width}}  {f.source_id or '-':{source_width}}  {f.stage:9}  "
            f"{f.kind}: {f.message[:160]}"
        )
    return lines


def as_json(letters: list[DeadLetter]) -> dict[str, object]:
    counts = Counter((letter.stage, letter.kind) for letter in letters)
    return {
        "dead_letters": len(letters),
        "by_reason": [
            {"stage": stage, "kind": kind, "count": n}
            for (stage, kind), n in sorted(counts.items())
        ],
        "failed_prompts": [f.__dict__ for f in failed_prompts(letters)],
    }


def republishable(letter: DeadLetter) -> tuple[str, bytes, bytes]:
    """(topic, key, value) to send again; raises RecordError if the payload still fails."""
    if letter.payload_truncated:
        where = f" (whole at {letter.origin})" if letter.origin else ""
        raise RecordError(
            "payload_truncated", f"{letter.payload_size} bytes, cut in the letter{where}"
        )
    raw = letter.payload_bytes()
    if letter.stage == "publish":
        try:
            row = orjson.loads(raw)
        except orjson.JSONDecodeError as err:
            raise RecordError("not_json", str(err)) from None
        record = make_prompt_record(row, source="dead-letters", meta={"republished": True})
        return PROMPTS, record.prompt_id.encode(), record.encode()
    if letter.stage not in _INPUT_TOPIC:
        raise RecordError("unknown_stage", f"no input topic for stage {letter.stage!r}")
    if letter.stage == "generate":
        # The ledger records the dead letter, so workers would skip the prompt: ask for a new
        # attempt. A payload that is still not a record goes back as it was.
        try:
            prompt = PromptRecord.decode(raw)
        except RecordError:
            pass
        else:
            # published now: its own `published_at`, which its completion or dead letter
            # carries, so `draftgen audit` tells this copy's outcome from the first one's
            prompt.meta = {**prompt.meta, REGENERATE: True}
            prompt.published_at = time.time()
            raw = prompt.encode()
    return _INPUT_TOPIC[letter.stage], (letter.prompt_id or "").encode(), raw


async def republish(
    kafka: KafkaSettings, selection: Selection
) -> tuple[int, Counter[str], Counter[str]]:
    """Send the selected letters' payloads back to their stage's input topic: (sent, still bad
    by kind, left alone by kind: prompts removed at publish on purpose, sent only when
    `selection.kind` names their kind)."""
    letters = [letter for letter in await read_dead_letters(kafka) if selection.matches(letter)]
    # an idempotent producer cannot get past a batch the broker refused: check each record
    # against the topics' own limits first (streams/core/topics.py)
    kafka = await within_topic_limits(kafka)
    producer = AIOKafkaProducer(**kafka.aiokafka_kwargs(), **kafka.producer_kwargs())
    await producer.start()
    sent, still_bad, left = 0, Counter[str](), Counter[str]()
    try:
        for letter in letters:
            if letter.kind in REMOVED_KINDS and letter.kind != selection.kind:
                left[letter.kind] += 1
                continue
            try:
                topic, key, value = republishable(letter)
                if problem := kafka.too_large(key, value):
                    raise RecordError("record_too_large", problem)
                await producer.send_and_wait(kafka.topic(topic), key=key or None, value=value)
            except RecordError as err:
                still_bad[err.kind] += 1
                continue
            except KafkaError as err:
                if not refused_for_good(err):
                    raise
                still_bad["refused_by_kafka"] += 1
                continue
            sent += 1
    finally:
        await producer.stop()
    return sent, still_bad, left
