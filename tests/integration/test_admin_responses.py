"""The admin responses read by field name (streams/core/topics.py), against the real broker:
if aiokafka's response schemas change, these fail rather than `status` and the topic limits
reading the wrong field."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from streams.core.settings import COMPLETIONS, DEAD_LETTERS, PROMPTS, KafkaSettings
from streams.core.topics import (
    config_values,
    ensure_topics,
    group_names,
    group_states,
    topic_configs,
)
from tests.polling import wait_for_async

pytestmark = pytest.mark.integration


def test_topic_configs_and_groups_read_by_name(bootstrap: str, topic_prefix: str) -> None:
    kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix=topic_prefix, partitions=2)
    names = [kafka.topic(name) for name in (PROMPTS, COMPLETIONS, DEAD_LETTERS)]
    group = kafka.group("draftgen-admin-test")

    async def run() -> None:
        await ensure_topics(kafka)
        admin = AIOKafkaAdminClient(**kafka.aiokafka_kwargs())
        consumer = AIOKafkaConsumer(
            kafka.topic(PROMPTS),
            group_id=group,
            **kafka.aiokafka_kwargs(),
            **kafka.consumer_kwargs(),
        )
        await admin.start()
        await consumer.start()
        try:
            resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
            described = await admin.describe_configs(resources)
            limits = config_values(described, "max.message.bytes")
            assert limits == {
                kafka.topic(name): topic_configs(kafka)[name]["max.message.bytes"]
                for name in (PROMPTS, COMPLETIONS, DEAD_LETTERS)
            }
            assert config_values(described, "no.such.config") == {}

            await consumer.getmany(timeout_ms=200)  # joins the group

            async def stable() -> bool:
                states = group_states(await admin.describe_consumer_groups([group]))
                return [(s.group, s.state, s.members) for s in states] == [(group, "Stable", 1)]

            await wait_for_async(stable, timeout=30, what="the group to be stable", interval=0.2)
            assert group in group_names(await admin.list_consumer_groups())
        finally:
            await consumer.stop()
            await admin.close()

    asyncio.run(run())
