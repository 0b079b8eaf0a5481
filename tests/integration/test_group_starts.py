"""Where a group resumes a partition, asked of the real broker (streams/core/group_starts.py):
what a lease starts at and how it tells a hole in the log from a record not delivered."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata
from faust.types import TP

from streams.core.group_starts import GroupStarts
from streams.core.retry import Backoff
from streams.core.settings import PROMPTS, KafkaSettings
from streams.core.topics import ensure_topics

pytestmark = pytest.mark.integration


async def scenario(kafka: KafkaSettings) -> dict[str, object]:
    kafka = await ensure_topics(kafka)
    topic = kafka.topic(PROMPTS)
    producer = AIOKafkaProducer(**kafka.aiokafka_kwargs())
    await producer.start()
    try:
        for index in range(5):
            await producer.send_and_wait(topic, key=b"k", value=b"%d" % index, partition=0)
    finally:
        await producer.stop()
    committed = AIOKafkaConsumer(
        **kafka.aiokafka_kwargs(), group_id=kafka.group("committed"), enable_auto_commit=False
    )
    await committed.start()
    try:
        committed.assign([TopicPartition(topic, 0)])
        await committed.commit({TopicPartition(topic, 0): OffsetAndMetadata(3, "")})
    finally:
        await committed.stop()
    fast = Backoff(0.01, 0.02)
    p0 = TP(topic, 0)
    found: dict[str, object] = {}
    for name, group, earliest in (
        ("committed", "committed", True),
        ("none, earliest", "fresh", True),
        ("none, latest", "fresh", False),
    ):
        starts = GroupStarts(kafka, kafka.group(group), earliest=earliest, backoff=fast)
        try:
            found[name] = await starts.start_of(p0)
            if name == "committed":
                found["first at 2"] = await starts.first_at(p0, 2)
                found["first at 5"] = await starts.first_at(p0, 5)
        finally:
            await starts.close()
    return found


def test_a_lease_starts_at_the_groups_committed_offset(bootstrap: str, topic_prefix: str) -> None:
    kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix=topic_prefix, partitions=2)
    assert asyncio.run(scenario(kafka)) == {
        "committed": 3,
        "none, earliest": 0,  # the log's start
        "none, latest": None,  # where the consumer was put
        "first at 2": 2,  # the log has it: a record not delivered, sought back to
        "first at 5": None,  # nothing there yet
    }
