"""Create the pipeline's topics explicitly (never rely on broker auto-creation)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError

from streams.core.settings import (
    COMPLETIONS,
    DEAD_LETTERS,
    GENERATED,
    PROMPTS,
    WORKER_STATS,
    KafkaSettings,
)

log = logging.getLogger(__name__)


def topic_configs(kafka: KafkaSettings) -> dict[str, dict[str, str]]:
    max_bytes = str(kafka.topic_max_message_bytes)
    return {
        PROMPTS: {"retention.ms": str(30 * 24 * 3600 * 1000), "max.message.bytes": max_bytes},
        # The source of truth for replay: kept forever.
        COMPLETIONS: {
            "retention.ms": "-1",
            "retention.bytes": "-1",
            "max.message.bytes": max_bytes,
        },
        DEAD_LETTERS: {"retention.ms": str(90 * 24 * 3600 * 1000), "max.message.bytes": max_bytes},
        # Latest heartbeat per worker: short segments, compacted eagerly, so `status` reads
        # little more than one record per worker.
        WORKER_STATS: {
            "cleanup.policy": "compact",
            "segment.ms": str(10 * 60 * 1000),
            "min.cleanable.dirty.ratio": "0.1",
        },
        # What was generated, per prompt and settings: compacted, never deleted (core/ledger.py).
        GENERATED: {"cleanup.policy": "compact", "retention.ms": "-1"},
    }


# Heartbeats are a few per second at most: one partition keeps `status` reads cheap.
_PARTITIONS = {WORKER_STATS: 1}


async def ensure_topics(kafka: KafkaSettings) -> list[str]:
    """Create missing topics; returns the names created."""
    admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [
            NewTopic(
                kafka.topic(name), _PARTITIONS.get(name, kafka.partitions), 1, topic_configs=config
            )
            for name, config in topic_configs(kafka).items()
            if kafka.topic(name) not in existing
        ]
        if wanted:
            with contextlib.suppress(TopicAlreadyExistsError):  # another process won the race
                await admin.create_topics(wanted)
            log.info("created topics %s", ", ".join(t.name for t in wanted))
            await _wait_for_leaders(admin, [t.name for t in wanted])
        return [t.name for t in wanted]
    finally:
        await admin.close()


async def within_topic_limits(kafka: KafkaSettings) -> KafkaSettings:
    """`kafka` with its message limit lowered to what the pipeline's existing topics accept:
    a topic created elsewhere, or before DRAFTGEN_KAFKA_MAX_MESSAGE_BYTES was raised, keeps its
    own max.message.bytes. Checking against it up front beats a refusal by the broker, which
    an idempotent producer cannot get past (the partition's later batches then fail with
    OutOfOrderSequenceNumber)."""
    names = [kafka.topic(name) for name in (PROMPTS, COMPLETIONS, DEAD_LETTERS)]
    admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
    await admin.start()
    try:
        resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
        responses = await admin.describe_configs(resources)
    finally:
        await admin.close()
    lowest = kafka.max_message_bytes
    for response in responses:
        for resource in response.resources:  # (error, message, type, name, configs)
            for config in resource[4]:
                if config[0] == "max.message.bytes":
                    topic = int(config[1])
                    # the topic checks the compressed batch, which gzip can make a little larger
                    lowest = min(lowest, topic - topic // 8192 - 1024)
    if lowest == kafka.max_message_bytes:
        return kafka
    log.info("a topic accepts less than DRAFTGEN_KAFKA_MAX_MESSAGE_BYTES: limit %d bytes", lowest)
    return kafka.model_copy(update={"max_message_bytes": lowest})


async def _wait_for_leaders(
    admin: AIOKafkaAdminClient, topics: list[str], timeout: float = 30
) -> None:
    """New partitions have no leader for a moment; writing then only produces retry noise."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        described = await admin.describe_topics(topics)
        if all(
            topic.get("partitions") and all(p.get("leader", -1) >= 0 for p in topic["partitions"])
            for topic in described
        ):
            return
        await asyncio.sleep(0.2)
