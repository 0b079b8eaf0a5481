"""The prompts topic's backlogs as a thief reads them (streams/generate/steal.py): the group's
committed offsets (an admin call), the partitions' ends and the records at chosen offsets (a
group-less consumer, so reading never joins nor disturbs the group). The clients are made on
first use and kept."""

from __future__ import annotations

import contextlib

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streams.core.settings import KafkaSettings
from streams.core.topic_reader import groupless_consumer


class KafkaBacklogs:
    def __init__(self, kafka: KafkaSettings, topic: str, group: str):
        self.kafka = kafka
        self.topic = topic
        self.group = group
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None

    async def committed(self) -> dict[int, int]:
        admin = await self._admin_client()
        offsets = await admin.list_consumer_group_offsets(self.group)
        return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == self.topic}

    async def ends(self, partitions: list[int]) -> dict[int, int]:
        consumer = await self._consumer_client()
        ends = await consumer.end_offsets([TopicPartition(self.topic, p) for p in partitions])
        return {tp.partition: end for tp, end in ends.items()}

    async def read(self, partition: int, offsets: set[int]) -> list[tuple[bytes, bytes]]:
        consumer = await self._consumer_client()
        tp = TopicPartition(self.topic, partition)
        start, end = min(offsets), max(offsets) + 1
        consumer.assign([tp])
        consumer.seek(tp, start)
        found: list[tuple[bytes, bytes]] = []
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=1000, max_records=end - start)
            for record in batch.get(tp, []):
                if record.offset in offsets and record.key and record.value:
                    found.append((record.key, record.value))
        return found

    async def close(self) -> None:
        if self._consumer:
            with contextlib.suppress(Exception):
                await self._consumer.stop()
        if self._admin:
            with contextlib.suppress(Exception):
                await self._admin.close()

    async def _admin_client(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            admin = AIOKafkaAdminClient(**self.kafka.aiokafka_kwargs())
            await admin.start()
            self._admin = admin
        return self._admin

    async def _consumer_client(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = groupless_consumer(self.kafka)
            await consumer.start()
            self._consumer = consumer
        return self._consumer
