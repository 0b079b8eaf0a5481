"""Helpers for the scaling, ingestion and replay tests: emulator counters and topic counts."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections import Counter
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.core.settings import COMPLETIONS, KafkaSettings


def requests_served(url: str) -> int:
    """Requests the emulated server received (its GET /stats)."""
    with urllib.request.urlopen(f"{url}/stats", timeout=5) as response:
        return int(json.loads(response.read())["requests"])


async def _consumer(kafka: KafkaSettings, topic: str) -> tuple[AIOKafkaConsumer, list]:
    consumer = AIOKafkaConsumer(**kafka.aiokafka_kwargs(), enable_auto_commit=False)
    await consumer.start()
    await consumer._client.force_metadata_update()
    parts = consumer.partitions_for_topic(topic) or set()
    return consumer, [TopicPartition(topic, p) for p in sorted(parts)]


async def _end_total(kafka: KafkaSettings, name: str) -> int:
    consumer, tps = await _consumer(kafka, kafka.topic(name))
    try:
        return sum((await consumer.end_offsets(tps)).values())
    finally:
        await consumer.stop()


def topic_size(kafka: KafkaSettings, name: str = COMPLETIONS) -> int:
    """Records ever written to a topic (sum of end offsets)."""
    return asyncio.run(_end_total(kafka, name))


async def _keys(kafka: KafkaSettings, name: str) -> Counter[str]:
    consumer, tps = await _consumer(kafka, kafka.topic(name))
    counts: Counter[str] = Counter()
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        for tp, end in ends.items():
            while await consumer.position(tp) < end:
                for record in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                    counts[record.key.decode()] += 1
    finally:
        await consumer.stop()
    return counts


def key_counts(kafka: KafkaSettings, name: str = COMPLETIONS) -> Counter[str]:
    """How many records each key has on a topic (completions: per prompt_id)."""
    return asyncio.run(_keys(kafka, name))


def wait_for(check: Callable[[], bool], timeout: float, what: str, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


def rate(kafka: KafkaSettings, seconds: float) -> float:
    """Completions per second over the next `seconds`."""
    before = topic_size(kafka)
    time.sleep(seconds)
    return (topic_size(kafka) - before) / seconds


async def _lag(kafka: KafkaSettings, group: str, name: str) -> int:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
    await admin.start()
    consumer, tps = await _consumer(kafka, kafka.topic(name))
    try:
        committed = await admin.list_consumer_group_offsets(kafka.group(group))
        ends = await consumer.end_offsets(tps)
        return sum(
            end - (committed[tp].offset if tp in committed else 0) for tp, end in ends.items()
        )
    finally:
        await consumer.stop()
        await admin.close()


def group_lag(kafka: KafkaSettings, group: str, name: str) -> int:
    return asyncio.run(_lag(kafka, group, name))


async def _send(kafka: KafkaSettings, name: str, records: list[tuple[bytes, bytes]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(**kafka.aiokafka_kwargs(), acks="all")
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(kafka.topic(name), key=key, value=value)
    finally:
        await producer.stop()


def send_raw(kafka: KafkaSettings, name: str, records: list[tuple[bytes, bytes]]) -> None:
    asyncio.run(_send(kafka, name, records))
