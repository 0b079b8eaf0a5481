"""The prompts topic's backlogs as a thief reads them (streams/generate/steal.py): where each
partition's backlog starts (the group's committed offset, an admin call; the log's start where
nothing is committed yet or retention deleted it), the partitions' ends and the records at
chosen offsets (a group-less consumer, so reading never joins nor disturbs the group). The
clients are made on first use and kept."""

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
        """Where each partition's backlog starts: every partition of the topic, also one its
        owner committed nothing of yet (a server down since the start of a run)."""
        admin = await self._admin_client()
        partitions = [TopicPartition(self.topic, p) for p in await self._partitions(admin)]
        if not partitions:
            return {}
        # named partitions: one without a committed offset comes back as -1, not left out
        offsets = await admin.list_consumer_group_offsets(self.group, partitions=partitions)
        consumer = await self._consumer_client()
        firsts = await consumer.beginning_offsets(partitions)
        return {
            tp.partition: max(offsets[tp].offset if tp in offsets else -1, firsts[tp])
            for tp in partitions
        }

    async def _partitions(self, admin: AIOKafkaAdminClient) -> list[int]:
        for described in await admin.describe_topics([self.topic]):
            if described.get("topic") == self.topic and not described.get("error_code"):
                return sorted(p["partition"] for p in described.get("partitions") or [])
        return []  # not there (deleted): nothing to steal

    async def members(self) -> int | None:
        """How many workers the group has now (None: not known): one alone decides a refusal
        by itself (streams/generate/blame.py)."""
        admin = await self._admin_client()
        for response in await admin.describe_consumer_groups([self.group]):
            # DescribeGroupsResponse: (error_code, group_id, state, protocol_type, protocol,
            # members, ...) per group
            for group in response.groups:
                if group[1] == self.group and not group[0]:
                    return len(group[5])
        return None

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
