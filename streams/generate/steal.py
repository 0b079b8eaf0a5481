"""Work stealing for the end of a run: a generate worker with free slots and nothing of its own
to put in them takes prompts from the end of another worker's backlog.

Kafka gives each partition to one member of the group, so a partition's backlog waits for its
owner while other servers sit idle: at the end of every finite run (uneven partitions, uneven
output lengths) and all along with a slow server. A worker that has had a free slot and no
prompt of its own for `steal_after_s` reads the group's committed offsets, picks a partition of
another worker (at random, a larger backlog more likely), takes as many prompts as it has free
slots (at most `steal_batch`) from that backlog's end, beyond the owner's next `steal_margin`
prompts (by default the most an owner holds past its committed offset: its requests in flight
and its prefetch; a thief sees an owner's committed offset, not its position), reads them with
a group-less consumer and starts them; each slot freed later can take more. Nothing is acked
or committed for them: the owner still consumes them in order, finds them in the ledger and
acks them without a request. Two workers may generate the same prompt (a
race between thieves, or the owner reaching it before the thief is done): both completions are
keyed by the prompt_id, land on one completions partition, and the tokenize stage keeps one. So
the duplicate costs GPU time, never correctness; taking from the end keeps it rare.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streams.core import retry
from streams.core.retry import Backoff, short_error
from streams.core.settings import KafkaSettings, generate_window
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
        # between two looks at the backlogs that found nothing to take (or failed): each look
        # is an admin call; short enough that a worker idle since long still joins the end of
        # a run within a couple of seconds
        self.backoff = backoff or retry.backoff("steal")
        once = worker.once
        self.idle_s = once.steal_after_s
        # offsets this worker took already, by partition (those below the committed offset
        # are forgotten)
        self._taken: dict[int, set[int]] = {}
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None

    @property
    def margin(self) -> int:
        # an owner's window, by this worker's: known once it started (--concurrency auto)
        margin = self.worker.once.steal_margin
        return generate_window(self.worker.concurrency) if margin is None else margin

    @property
    def batch(self) -> int:
        # the worker's concurrency is known only once it started (--concurrency auto)
        return self.worker.once.steal_batch or self.worker.concurrency

    async def run(self) -> None:
        try:
            await self.worker.ledger.caught_up.wait()
            empty_handed = 0
            while True:
                busy_at = self.worker.last_busy
                await self.worker.wait_idle(self.idle_s)
                if self.worker.last_busy != busy_at:
                    empty_handed = 0  # it had work of its own since: a fresh start
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
        """Take prompts from the end of someone's backlog, as many as this worker has free
        slots (at most `batch`), and start them; returns how many were started, None if there
        was nothing left to take."""
        admin, consumer = await self._clients()
        committed = await admin.list_consumer_group_offsets(self.group)
        mine = self.owned()
        tps = [tp for tp in committed if tp.topic == self.topic and tp.partition not in mine]
        if not mine or not tps:
            # no partition of its own: joining, or in a rebalance, when what is someone
            # else's is not known yet (a lone worker restarting would take its own backlog)
            return None
        ends = await consumer.end_offsets(tps)
        sizes: dict[TopicPartition, int] = {}
        for tp in tps:
            taken = self._taken.setdefault(tp.partition, set())
            taken.difference_update([o for o in taken if o < committed[tp].offset])
            low = committed[tp].offset + self.margin
            size = ends[tp] - low - sum(1 for o in taken if low <= o < ends[tp])
            if size > 0:
                sizes[tp] = size
        if not sizes:
            return None
        # a larger backlog ends later: more likely picked (thieves picking at once mostly differ)
        tp = random.choices(list(sizes), weights=list(sizes.values()))[0]
        taken = self._taken[tp.partition]
        wanted = max(1, min(self.batch, self.worker.free_slots()))
        low = committed[tp].offset + self.margin
        # from the end: the prompts its owner reaches last, so the least likely to be redone
        offsets = []
        for offset in range(ends[tp] - 1, low - 1, -1):
            if offset not in taken:
                offsets.append(offset)
                if len(offsets) == wanted:
                    break
        taken.update(offsets)
        records = await self._read(consumer, tp, set(offsets))
        fresh = [(k, v) for k, v in records if not self.worker.already_generated(k.decode(), v)]
        if not fresh:
            return 0
        await self.worker.start_stolen(fresh)
        log.info(
            "stole %d prompts from partition %d at offsets %d-%d",
            len(fresh),
            tp.partition,
            min(offsets),
            max(offsets),
        )
        return len(fresh)

    async def _read(
        self, consumer: AIOKafkaConsumer, tp: TopicPartition, offsets: set[int]
    ) -> list[tuple[bytes, bytes]]:
        """The records at `offsets` of `tp` (a record compacted or deleted away is skipped)."""
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
