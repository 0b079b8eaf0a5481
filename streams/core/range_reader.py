"""A group-less reader of offset ranges of one topic's partitions.

`draftgen export --format conversations` reads the completions behind each shard of a dataset
version: a shard covers a contiguous offset window of one partition, so its completions are one
range of that partition. Ranges are read one at a time (memory: the records of one range that
the caller keeps), seeking only when a range does not start where the previous one ended. It
joins no group and commits nothing; only public aiokafka calls.
"""

from __future__ import annotations

from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from streams.core.settings import KafkaSettings
from streams.core.topic_reader import groupless_consumer


class RangeReader:
    def __init__(self, kafka: KafkaSettings, topic: str, max_records: int = 500):
        self.kafka = kafka
        self.topic = topic
        self.max_records = max_records
        self._consumer: AIOKafkaConsumer | None = None
        self._assigned: TopicPartition | None = None

    async def start(self) -> None:
        if self._consumer is None:
            consumer = groupless_consumer(self.kafka)
            await consumer.start()
            self._consumer = consumer

    async def read(
        self, partition: int, first: int, last: int, handle: Callable[[ConsumerRecord], None]
    ) -> int:
        """Hand every record of `partition` with `first <= offset <= last` to `handle`, in
        offset order; returns the offset reached (`last + 1` unless the partition ends before
        `last`)."""
        if self._consumer is None:
            raise RuntimeError("RangeReader: start() it first")
        consumer = self._consumer
        tp = TopicPartition(self.topic, partition)
        if self._assigned != tp:
            consumer.assign([tp])
            self._assigned = tp
            consumer.seek(tp, first)
        elif await consumer.position(tp) != first:
            consumer.seek(tp, first)
        end = (await consumer.end_offsets([tp]))[tp]
        stop = min(last + 1, end)
        # the position, not the last record's offset: compaction and transaction markers leave
        # offsets without records
        while await consumer.position(tp) < stop:
            batch = await consumer.getmany(tp, timeout_ms=1000, max_records=self.max_records)
            for record in batch.get(tp, []):
                if record.offset > last:
                    consumer.seek(tp, last + 1)
                    return last + 1
                if record.offset >= first:
                    handle(record)
        return stop

    async def stop(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            self._assigned = None
            await consumer.stop()
