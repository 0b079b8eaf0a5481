"""`draftgen publish`: read sources, normalize, and publish prompt records keyed by prompt_id."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer

from producers.clean import PromptCleaner
from producers.recipes import samples_of
from producers.sources import (
    Row,
    SourceSpec,
    count_rows,
    mix_sources,
    row_error,
    source_name,
)
from streams.core.delivery import letter_output
from streams.core.ledger import REGENERATE, generated_prompt_ids, read_generated
from streams.core.meter import Meter
from streams.core.normalize import DEFAULT_ID_FIELD, make_prompt_record, source_id_of
from streams.core.records import REMOVED_KINDS, DeadLetter, PromptRecord, RecordError
from streams.core.settings import DEAD_LETTERS, PROMPTS, KafkaSettings
from streams.core.topic_reader import TopicReader
from streams.core.topics import prepare_topics
from streams.core.turns import FINAL, mark

log = logging.getLogger(__name__)

STAGE = "publish"
# Bounded number of sends awaiting the broker's acknowledgement.
MAX_OUTSTANDING = 1000
# how long reading the sources may hold the event loop before the producer gets a turn
YIELD_EVERY_S = 0.05


@dataclass
class PublishSummary:
    published: int = 0
    duplicates: int = 0
    # in the `generated` ledger already (any settings): not published again
    already_generated: int = 0
    # on the prompts topic already (`skip_published`), without an outcome yet: not sent again
    already_published: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    # not published by the cleaner (producers/clean.py): duplicate_text, contaminated
    removed: Counter[str] = field(default_factory=Counter)
    prompt_ids: list[str] = field(default_factory=list)
    # the ids of those already generated (their completions are stored)
    generated_ids: list[str] = field(default_factory=list)
    # the ids of those already on the topic, waiting for their outcome
    pending_ids: list[str] = field(default_factory=list)
    recipe: str = ""  # the recipe's name ("" without one): each sample is counted as published

    def line(self) -> str:
        rejected = sum(self.rejected.values())
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.rejected.items()))
        return (
            (f"recipe {self.recipe}: " if self.recipe else "")
            + f"published {self.published}, skipped as duplicates {self.duplicates}, "
            f"already generated {self.already_generated}, "
            + (f"already published {self.already_published}, " if self.already_published else "")
            + f"rejected {rejected}"
            + (f" ({kinds})" if kinds else "")
            + "".join(f", removed as {kind} {n}" for kind, n in sorted(self.removed.items()))
        )


async def publish(
    kafka: KafkaSettings,
    specs: list[SourceSpec],
    limit: int | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: bool = True,
    regen: str = FINAL,
    regenerate: bool = False,
    id_field: str = DEFAULT_ID_FIELD,
    skip_published: bool = False,
    cleaner: PromptCleaner | None = None,
    recipe_name: str = "",
) -> PublishSummary:
    """Publish every row of `specs`; `regen` "every-turn" asks the generate stage to regenerate
    each assistant turn of a conversation, not only the final one (streams/generate/regen.py).
    Prompts in the `generated` ledger are skipped; `regenerate` publishes them anyway, marked
    so that the generate workers do not skip them either. A row's `id_field` becomes its
    prompt's `source_id`. `skip_published` (a resumed run) also skips prompts already on the
    prompts topic: an interrupted publish sends each prompt once. `cleaner` removes prompts
    whose text was published already or that contain an evaluation task (dead letters, counted
    in `removed`). A source with a recipe (`spec.recipe`, producers/recipes.py) publishes each
    prompt as its recipe's samples, each carrying its policy; `recipe_name` names them."""
    meta = mark({}, regen)
    kafka = await prepare_topics(kafka)
    # What was generated before, by any publish run or source: not sent again.
    done = set() if regenerate else generated_prompt_ids(await read_generated(kafka))
    on_topic = await published_prompt_ids(kafka) if skip_published else set()
    if regenerate:
        meta[REGENERATE] = True
    producer = AIOKafkaProducer(
        **kafka.aiokafka_kwargs(),
        linger_ms=20,
        **kafka.producer_kwargs(),  # acks=all, idempotent
    )
    await producer.start()
    summary = PublishSummary(recipe=recipe_name)
    seen: set[str] = set()
    pending: set[asyncio.Future[Any]] = set()
    dead_topic = kafka.topic(DEAD_LETTERS)
    meter = Meter("publish", "row", limit) if progress else None
    # the meter's total: the sources' rows where their formats count them cheaply, counted in
    # a thread beside the publish
    total = asyncio.ensure_future(asyncio.to_thread(rows_to_publish, specs, limit, storage_options))
    rows = 0
    yielded = time.monotonic()

    async def send(topic: str, key: bytes, value: bytes) -> None:
        pending.add(await producer.send(topic, key=key, value=value))
        if len(pending) >= MAX_OUTSTANDING:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            pending.difference_update(done)
            for future in done:
                future.result()  # a failed delivery fails the publish run loudly

    async def reject(
        spec: SourceSpec, row: int, err: RecordError, raw: bytes, source_id: str | None = None
    ) -> None:
        (summary.removed if err.kind in REMOVED_KINDS else summary.rejected)[err.kind] += 1
        message = f"{spec.path} row {row}: {err.message}"
        letter = DeadLetter.for_payload(STAGE, err.kind, message, raw, origin=f"{spec.path}:{row}")
        letter.source_id = source_id
        await send(*letter_output(kafka, dead_topic, letter))

    try:
        for spec, row_number, row in mix_sources(specs, limit, storage_options=storage_options):
            await _publish_row(
                spec,
                row_number,
                row,
                summary,
                seen,
                send,
                reject,
                kafka,
                meta,
                done,
                id_field,
                on_topic,
                cleaner,
                recipe_name,
            )
            rows += 1
            if meter is not None:
                meter.update(rows, total.result() if total.done() else None)
            if time.monotonic() - yielded > YIELD_EVERY_S:
                # reading a source blocks the loop: let the producer send what it has batched
                # meanwhile (else a slow source's records reach the topic only at the end)
                await asyncio.sleep(0)
                yielded = time.monotonic()
        if pending:
            for future in await asyncio.gather(*pending, return_exceptions=True):
                if isinstance(future, BaseException):
                    raise future
        await producer.flush()
    finally:
        total.cancel()
        if meter is not None:
            meter.close("")  # the caller prints the summary
        await producer.stop()
    return summary


def rows_to_publish(
    specs: list[SourceSpec], limit: int | None, storage_options: dict[str, Any] | None
) -> int | None:
    """The rows a publish reads: the sources' count (`count_rows`) or `limit`, the smaller."""
    try:
        rows = count_rows(specs, storage_options)
    except (OSError, ValueError):  # the read itself says what is wrong with a source
        rows = None
    return limit if rows is None else min(rows, limit if limit is not None else rows)


async def _publish_row(
    spec: SourceSpec,
    row_number: int,
    row: Row,
    summary: PublishSummary,
    seen: set[str],
    send: Any,
    reject: Any,
    kafka: KafkaSettings,
    meta: dict[str, Any],
    done: set[str],
    id_field: str,
    on_topic: set[str],
    cleaner: PromptCleaner | None,
    recipe_name: str,
) -> None:
    if isinstance(row, bytes):
        await reject(spec, row_number, row_error(row), row)
        return
    recipe = spec.recipe
    if recipe is not None:  # the source's regen mode and id field over the publish's
        meta = mark(meta, recipe.regen) if recipe.regen else meta
        id_field = recipe.id_field or id_field
    try:
        record = make_prompt_record(
            row, source_name(spec), {**meta, "row": row_number}, id_field=id_field
        )
    except RecordError as err:
        await reject(spec, row_number, err, _dump(row), _known_id(row, id_field))
        return
    if record.prompt_id in seen:
        summary.duplicates += 1
        return
    seen.add(record.prompt_id)  # its exact copies are duplicates of it, removed or not
    if cleaner is not None and (removal := cleaner.check(record)) is not None:
        await reject(spec, row_number, removal, _dump(row), record.source_id)
        return
    samples = [record] if recipe is None else samples_of(record, recipe_name, recipe)
    for sample in samples:
        await _publish_sample(
            sample, spec, row_number, summary, send, reject, kafka, done, on_topic
        )


async def _publish_sample(
    record: PromptRecord,
    spec: SourceSpec,
    row_number: int,
    summary: PublishSummary,
    send: Any,
    reject: Any,
    kafka: KafkaSettings,
    done: set[str],
    on_topic: set[str],
) -> None:
    if record.prompt_id in done:
        summary.already_generated += 1
        summary.generated_ids.append(record.prompt_id)
        return
    if record.prompt_id in on_topic:
        summary.already_published += 1
        summary.pending_ids.append(record.prompt_id)
        return
    value = record.encode()
    if problem := kafka.too_large(record.prompt_id.encode(), value):
        too_large = RecordError("record_too_large", problem)
        log.warning("%s row %d: %s", spec.path, row_number, too_large.message)
        await reject(spec, row_number, too_large, value, record.source_id)
        return
    await send(kafka.topic(PROMPTS), record.prompt_id.encode(), value)
    summary.published += 1
    summary.prompt_ids.append(record.prompt_id)


async def published_prompt_ids(kafka: KafkaSettings) -> set[str]:
    """The keys of every record on the prompts topic now (its prompt ids)."""
    reader = TopicReader(kafka, kafka.topic(PROMPTS))
    ids: set[str] = set()
    try:
        if await reader.open():
            await reader.read_to_end(lambda record: ids.add(record.key.decode()))
    finally:
        await reader.close()
    return ids


def _known_id(row: Any, id_field: str) -> str | None:
    """The row's own id for its dead letter, if it has a valid one."""
    try:
        return source_id_of(row, id_field)
    except RecordError:
        return None


def _dump(row: Any) -> bytes:
    import orjson

    try:
        return orjson.dumps(row)
    except TypeError:
        return repr(row).encode()
