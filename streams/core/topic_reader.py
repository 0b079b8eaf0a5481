"""A group-less reader of one whole topic: every partition, from its beginning.

The pipeline reads three topics in full rather than consuming them as a group: the generated
ledger (streams/core/ledger.py), worker heartbeats (streams/observe/heartbeat.py) and dead letters
(streams/tools/progress.py). Each user handles the records itself; this class only finds the
partitions, reads them and says how far it got. It joins no group and commits nothing.

Only public aiokafka calls. A consumer's cached metadata (`partitions_for_topic`) learns of a
topic created after the consumer started only at its next periodic refresh, and
`consumer.topics()` reads into a copy, so the partitions come from an admin client's metadata:
`list_topics` first (it asks for all topics, so a topic not created yet is never auto-created
by a broker that allows that), then `describe_topics`, through `topics.on_admin` (a broker just
lost on a cluster is retried, not a failure). `assign` makes the consumer fetch the topic's
metadata itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import ConsumerRecord

from streams.core.settings import KafkaSettings
from streams.core.topics import on_admin


def groupless_consumer(kafka: KafkaSettings) -> AIOKafkaConsumer:
    """A consumer (not started) that joins no group and commits nothing."""
    return AIOKafkaConsumer(
        **kafka.aiokafka_kwargs(),
        **kafka.consumer_kwargs(),
        group_id=None,
        enable_auto_commit=False,
        # records deleted by retention under our position: go on from the oldest kept
        auto_offset_reset="earliest",
    )


class TopicReader:
    """`open()` assigns every partition of `topic` from its beginning and notes the end offsets
    of that moment; `read()` returns the next records, `read_to_end()` hands every record up to
    the current end to a callback, `caught_up()` says whether the end offsets seen at `open()`
    were reached."""

    def __init__(self, kafka: KafkaSettings, topic: str, max_records: int = 5000):
        self.kafka = kafka
        self.topic = topic
        self.max_records = max_records
        self.partitions: list[TopicPartition] = []
        self.ends_at_open: dict[TopicPartition, int] = {}
        self._consumer: AIOKafkaConsumer | None = None

    @property
    def is_open(self) -> bool:
        return bool(self.partitions)

    async def open(self) -> bool:
        """Assign every partition, from the beginning (once). False while the topic does not
        exist yet: call again later."""
        if self.partitions:
            return True
        if self._consumer is None:
            consumer = groupless_consumer(self.kafka)
            try:
                await consumer.start()
            except BaseException:
                # no broker: closed here, else asyncio logs an "Unclosed AIOKafkaConsumer"
                # ERROR after the command's one line
                await consumer.stop()
                raise
            self._consumer = consumer
        ids = await self._partition_ids()
        if not ids:
            return False
        partitions = [TopicPartition(self.topic, p) for p in ids]
        self._consumer.assign(partitions)
        # end offsets before the seek: after it, the consumer's own offset reset holds the
        # request back ~0.5 s (aiokafka 0.14, 64 partitions: 0.58 s; this way 0.03 s)
        self.ends_at_open = await self._consumer.end_offsets(partitions)
        await self._consumer.seek_to_beginning(*partitions)
        self.partitions = partitions
        return True

    async def read(self, timeout_ms: int = 1000) -> list[ConsumerRecord]:
        """The next records, in offset order within each partition; empty if none came within
        `timeout_ms`."""
        batches = await self._open_consumer().getmany(
            timeout_ms=timeout_ms, max_records=self.max_records
        )
        return [record for records in batches.values() for record in records]

    async def read_to_end(self, handle: Callable[[ConsumerRecord], Any]) -> int:
        """Hand every record up to the topic's current end to `handle`; returns how many."""
        consumer = self._open_consumer()
        ends = await consumer.end_offsets(self.partitions)
        count = 0
        while not await self.reached(ends):
            for record in await self.read():
                handle(record)
                count += 1
        return count

    async def ends(self) -> dict[TopicPartition, int]:
        """Every partition's end offset now (for `reached`)."""
        return await self._open_consumer().end_offsets(self.partitions)

    async def starts(self) -> dict[TopicPartition, int]:
        """Every partition's log start offset now: what retention deleted ends there."""
        return await self._open_consumer().beginning_offsets(self.partitions)

    async def caught_up(self) -> bool:
        """Whether every partition was read up to its end offset seen at `open()`."""
        return await self.reached(self.ends_at_open)

    async def close(self) -> None:
        """Stop the clients; a later `open()` reads the topic from its beginning again."""
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            self.partitions, self.ends_at_open = [], {}
            await consumer.stop()

    async def reached(self, ends: dict[TopicPartition, int]) -> bool:
        """Whether every partition was read up to these end offsets."""
        # The position, not the last record's offset: compaction and transaction markers
        # leave offsets without records at the end of a partition.
        consumer = self._open_consumer()
        for tp, end in ends.items():
            if await consumer.position(tp) < end:
                return False
        return True

    def _open_consumer(self) -> AIOKafkaConsumer:
        if self._consumer is None or not self.partitions:
            raise RuntimeError(f"TopicReader({self.topic!r}): open() it first")
        return self._consumer

    async def _partition_ids(self) -> list[int]:
        async def ids(admin: AIOKafkaAdminClient) -> list[int]:
            if self.topic not in await admin.list_topics():
                return []
            for described in await admin.describe_topics([self.topic]):
                if described.get("topic") == self.topic and not described.get("error_code"):
                    return sorted(p["partition"] for p in described.get("partitions") or [])
            return []

        return await on_admin(self.kafka, f"reading the partitions of {self.topic}", ids)
