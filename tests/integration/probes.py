"""What the integration tests read from the running stack: topic sizes and keys, consumer-group
offsets and lag, the emulator's counters, a worker's /metrics. Waiting on any of them is
`tests.polling.wait_for`."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections import Counter
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from prometheus_client.parser import text_string_to_metric_families

from compose.process import ManagedProcess
from streams.core.settings import COMPLETIONS, KafkaSettings
from streams.core.topics import group_states


async def stable_members(kafka: KafkaSettings, group: str) -> int:
    """Members of the consumer group `group` (a stage's name) once it is Stable; 0 meanwhile."""
    admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
    await admin.start()
    try:
        described = await admin.describe_consumer_groups([kafka.group(group)])
        return sum(g.members for g in group_states(described) if g.state == "Stable")
    except Exception:  # no group yet, or a coordinator still being elected
        return 0
    finally:
        await admin.close()


def emulator_stats(url: str) -> dict[str, Any]:
    """The emulated server's counters (its GET /stats): requests, completed, errors by kind…"""
    with urllib.request.urlopen(f"{url}/stats", timeout=5) as response:
        return dict(json.loads(response.read()))


def requests_served(url: str) -> int:
    """Requests the emulated server received."""
    return int(emulator_stats(url)["requests"])


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


async def _committed(kafka: KafkaSettings, group: str) -> dict[int, int]:
    admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(kafka.group(group))
        return {tp.partition: meta.offset for tp, meta in offsets.items()}
    finally:
        await admin.close()


def committed_offsets(kafka: KafkaSettings, group: str) -> dict[int, int]:
    """The group's committed offset per partition (partitions never committed are absent)."""
    return asyncio.run(_committed(kafka, group))


async def _lag(kafka: KafkaSettings, group: str, name: str) -> int:
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
    producer = AIOKafkaProducer(**kafka.aiokafka_kwargs(), acks="all")
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(kafka.topic(name), key=key, value=value)
    finally:
        await producer.stop()


def send_raw(kafka: KafkaSettings, name: str, records: list[tuple[bytes, bytes]]) -> None:
    asyncio.run(_send(kafka, name, records))


# -- a worker's /metrics (started with --metrics-port 0) ---------------------------------------

Metrics = dict[tuple[str, frozenset[tuple[str, str]]], float]


def metrics_url(worker: ManagedProcess) -> str | None:
    """The URL the worker printed at start (`... metrics at URL`), once it has."""
    found = re.search(r"metrics at (http://\S+)", worker.log_path.read_text(errors="replace"))
    return found.group(1) if found else None


def scrape(url: str) -> Metrics:
    """Every sample of a /metrics page, keyed by name and labels."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def metric_sum(found: Metrics, name: str) -> float:
    """A metric summed over all its labels (errors of every kind, say)."""
    return sum(value for (metric, _), value in found.items() if metric == name)


# -- a process's log ---------------------------------------------------------------------------


def log_size(process: ManagedProcess) -> int:
    """Bytes in the process's log so far: `log_lines(..., since=...)` reads only what follows."""
    return process.log_path.stat().st_size if process.log_path.exists() else 0


def log_lines(process: ManagedProcess, pattern: str, since: int = 0) -> list[str]:
    """Lines of the process's log (from byte `since` on) that match the regex `pattern`."""
    with process.log_path.open("rb") as log:
        log.seek(since)
        text = log.read().decode(errors="replace")
    return [line for line in text.splitlines() if re.search(pattern, line)]
