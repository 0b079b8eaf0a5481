"""The replay benchmark's completions on the topic: keyed as the generate stage keys them,
warm-up ones on every partition, sent in large batches."""

from __future__ import annotations

import asyncio

import orjson
from aiokafka import AIOKafkaProducer

from streams.core.settings import COMPLETIONS, KafkaSettings
from streams.core.topics import ensure_topics

PARTITIONS = 16


async def produce(kafka: KafkaSettings, records: list[bytes]) -> None:
    await ensure_topics(kafka)
    producer = AIOKafkaProducer(**kafka.aiokafka_kwargs(), linger_ms=20)
    await producer.start()
    try:
        sends = [await producer.send(kafka.topic(COMPLETIONS), raw) for raw in records]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


Keyed = tuple[bytes, bytes, int | None]  # key, value, partition (None: by the key)


def keyed_records(records: list[bytes], count: int | None = None) -> list[Keyed]:
    """(key, value) as the generate stage sends them: keyed by prompt_id, so every run puts
    the same completions on the same partitions. `count` beyond the distinct records: copies
    under new prompt ids (the text is what costs, not its novelty). Encoded before any clock
    starts."""
    count = len(records) if count is None else count
    keyed: list[Keyed] = []
    for index in range(count):
        record = orjson.loads(records[index % len(records)])
        if index >= len(records):
            record["prompt_id"] = f"p{index:07d}"
        keyed.append((str(record["prompt_id"]).encode(), orjson.dumps(record), None))
    return keyed


def warmup_records(records: list[Keyed], per_partition: int) -> list[Keyed]:
    """Completions under prompt ids of their own, `per_partition` on every partition."""
    chosen = []
    for index in range(PARTITIONS * per_partition):
        record = orjson.loads(records[index % len(records)][1])
        record["prompt_id"] = f"warmup-{index:05d}"
        chosen.append((record["prompt_id"].encode(), orjson.dumps(record), index % PARTITIONS))
    return chosen


async def produce_fast(kafka: KafkaSettings, records: list[Keyed]) -> dict[int, int]:
    """Sends pre-encoded records in large batches; returns each partition's end offset."""
    producer = AIOKafkaProducer(
        **kafka.aiokafka_kwargs(),
        linger_ms=5,
        max_batch_size=1 << 20,
        max_request_size=kafka.max_message_bytes,
    )
    await producer.start()
    try:
        topic = kafka.topic(COMPLETIONS)
        sends = [
            await producer.send(topic, value, key=key, partition=partition)
            for key, value, partition in records
        ]
        sent = await asyncio.gather(*sends)
    finally:
        await producer.stop()
    ends: dict[int, int] = {}
    for meta in sent:
        ends[meta.partition] = max(ends.get(meta.partition, 0), meta.offset + 1)
    return ends
