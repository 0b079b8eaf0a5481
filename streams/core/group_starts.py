"""Where a consumer group resumes each partition of a topic: the start of a partition's lease
(streams/core/leases.py), asked of Kafka rather than assumed from the first record delivered.

The group's committed offset; with none, the log's start for a group that reads from the
earliest (the generate stage, and a tokenize group built from the beginning), or None for one
that reads from the latest (where the consumer was put is where it starts). An admin call and a
group-less consumer, made on first use and kept; an outage is waited out (streams/core/retry.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streams.core.retry import Backoff, until_done
from streams.core.settings import KafkaSettings
from streams.core.topic_reader import groupless_consumer

log = logging.getLogger(__name__)


class GroupStarts:
    def __init__(self, kafka: KafkaSettings, group: str, earliest: bool, backoff: Backoff):
        self.kafka = kafka
        self.group = group
        self.earliest = earliest
        self.backoff = backoff
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._reading = asyncio.Lock()  # one look into the log at a time (assign + seek)

    async def start_of(self, tp: Any) -> int | None:
        what = f"asking where group {self.group} resumes {tp.topic}/{tp.partition}"
        return await until_done(what, lambda: self._start_of(tp), self.backoff, log)

    async def _start_of(self, tp: Any) -> int | None:
        partition = TopicPartition(tp.topic, tp.partition)
        if self._admin is None:
            admin = AIOKafkaAdminClient(**self.kafka.aiokafka_kwargs())
            await admin.start()
            self._admin = admin
        offsets = await self._admin.list_consumer_group_offsets(self.group, partitions=[partition])
        meta = offsets.get(partition)
        committed = None if meta is None or meta.offset < 0 else int(meta.offset)
        if committed is None and not self.earliest:
            return None
        consumer = await self._consumer_client()
        first = int((await consumer.beginning_offsets([partition]))[partition])
        # a committed offset below the log's start (retention deleted them): resumes at its start
        return first if committed is None else max(committed, first)

    async def first_at(self, tp: Any, offset: int) -> int | None:
        """The first offset the log holds at or after `offset` (None: none yet): whether a hole
        a lease waits at is in the log itself (streams/core/leases.py)."""
        what = f"reading {tp.topic}/{tp.partition} at offset {offset}"
        return await until_done(what, lambda: self._first_at(tp, offset), self.backoff, log)

    async def _first_at(self, tp: Any, offset: int) -> int | None:
        partition = TopicPartition(tp.topic, tp.partition)
        async with self._reading:
            consumer = await self._consumer_client()
            consumer.assign([partition])
            consumer.seek(partition, offset)
            batch = await consumer.getmany(partition, timeout_ms=1000, max_records=1)
            records = batch.get(partition, [])
            return int(records[0].offset) if records else None

    async def _consumer_client(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = groupless_consumer(self.kafka)
            await consumer.start()
            self._consumer = consumer
        return self._consumer

    async def close(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._consumer.stop()
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await self._admin.close()
