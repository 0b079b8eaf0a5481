"""Work stealing for the end of a run: an idle generate worker takes prompts from the tail of
another worker's backlog.

Kafka gives each partition to one member of the group, so a slow server's backlog waits for
that server while the fast ones sit idle. An idle worker (no own prompt for `steal_after_s`)
reads the group's committed offsets, picks a random chunk of `steal_batch` prompts beyond the
owner's next `steal_margin` prompts, reads them with a group-less consumer and generates them.
Nothing is acked or committed for them: the owner still consumes them in order, finds them in
the ledger and acks them without a request. Two workers may generate the same prompt (a race
between stealers, or with the owner reaching it first): both completions are keyed by the
prompt_id, land on one completions partition, and the tokenize stage keeps one. So the
duplicate costs GPU time, never correctness; random chunks keep such races rare.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streams.core.retry import Backoff, short_error
from streams.core.settings import KafkaSettings
from streams.generate.once import OnceGenerateWorker

log = logging.getLogger(__name__)


class Stealer:
    def __init__(
        self,
        worker: OnceGenerateWorker,
        kafka: KafkaSettings,
        topic: str,
        group: str,
        owned: Callable[[], set[int]],
        backoff: Backoff | None = None,
    ):
        self.worker = worker
        self.kafka = kafka
        self.topic = topic
        self.group = group
        self.owned = owned
        # between two looks at the backlogs that found nothing to take (or failed): that
        # usually stays so for a while, and each look is an admin call
        self.backoff = backoff or Backoff(initial_s=0.5, max_s=10.0)
        once = worker.once
        self.margin = once.steal_margin
        self.idle_s = once.steal_after_s
        # chunks this worker took already: (partition, start offset)
        self._taken: set[tuple[int, int]] = set()
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None

    @property
    def batch(self) -> int:
        # the worker's concurrency is known only once it started (--concurrency auto)
        return self.worker.once.steal_batch or self.worker.concurrency

    async def run(self) -> None:
        try:
            await self.worker.ledger.caught_up.wait()
            empty_handed = 0
            while True:
                await self.worker.wait_idle(self.idle_s)
                try:
                    took = await self.steal_once() is not None
                except asyncio.CancelledError:
                    raise
                except Exception as err:  # stealing is an optimisation: never fatal
                    log.warning("stealing failed (%s)", short_error(err))
                    took = False
                if took:
                    empty_handed = 0
                else:
                    empty_handed += 1
                    await self.backoff.sleep(empty_handed)
        finally:
            await self.close()

    async def close(self) -> None:
        if self._consumer:
            with contextlib.suppress(Exception):
                await self._consumer.stop()
        if self._admin:
            with contextlib.suppress(Exception):
                await self._admin.close()

    async def _clients(self) -> tuple[AIOKafkaAdminClient, AIOKafkaConsumer]:
        if self._admin is None:
            admin = AIOKafkaAdminClient(**self.kafka.aiokafka_kwargs())
            await admin.start()
            self._admin = admin
        if self._consumer is None:
            consumer = AIOKafkaConsumer(
                **self.kafka.aiokafka_kwargs(),
                **self.kafka.consumer_kwargs(),
                group_id=None,
                enable_auto_commit=False,
            )
            await consumer.start()
            self._consumer = consumer
        return self._admin, self._consumer

    async def steal_once(self) -> int | None:
        """Take one chunk of someone's backlog; returns how many prompts were generated, None
        if there was no chunk left to take."""
        admin, consumer = await self._clients()
        committed = await admin.list_consumer_group_offsets(self.group)
        mine = self.owned()
        tps = [tp for tp in committed if tp.topic == self.topic and tp.partition not in mine]
        if not tps:
            return None
        ends = await consumer.end_offsets(tps)
        # chunks aligned on absolute offsets, so one taken stays recognisable
        first = {tp: _align(committed[tp].offset + self.margin, self.batch) for tp in tps}
        chunks = [
            (tp, start)
            for tp in tps
            for start in range(first[tp], ends[tp], self.batch)
            if (tp.partition, start) not in self._taken
        ]
        if not chunks:
            return None
        tp, start = random.choice(chunks)
        self._taken.add((tp.partition, start))
        records = await self._read(consumer, tp, start, min(start + self.batch, ends[tp]))
        fresh = [(k, v) for k, v in records if not self.worker.already_generated(k.decode(), v)]
        if not fresh:
            return 0
        done = await self.worker.run_stolen(fresh)
        log.info(
            "stole %d prompts from partition %d at offset %d (%d generated)",
            len(fresh),
            tp.partition,
            start,
            done,
        )
        return done

    async def _read(
        self, consumer: AIOKafkaConsumer, tp: TopicPartition, start: int, end: int
    ) -> list[tuple[bytes, bytes]]:
        consumer.assign([tp])
        consumer.seek(tp, start)
        found: list[tuple[bytes, bytes]] = []
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=1000, max_records=end - start)
            for record in batch.get(tp, []):
                if record.offset < end and record.key and record.value:
                    found.append((record.key, record.value))
        return found


def _align(offset: int, batch: int) -> int:
    return -(-offset // batch) * batch
