"""The record of what was generated: the compacted topic `{prefix}generated`.

One record per (prompt_id, generation settings), keyed ``{prompt_id}@{settings hash}``, written
by a generate worker after the completion was acknowledged by Kafka. Compaction keeps one record
per key forever, so the record survives worker restarts and is read back in full by:

- `publish`, at start: prompts already generated are skipped (unless `--regenerate`);
- every generate worker, continuously (`LedgerFollower`): a prompt published again while the
  run goes on is acked without being generated.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Iterable
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.core.settings import GENERATED, KafkaSettings

log = logging.getLogger(__name__)

SEPARATOR = "@"
# meta flag set by `publish --regenerate`: generate even if the ledger has it
REGENERATE = "regenerate"


def settings_hash(model: str, sampling: dict[str, Any], thinking: bool, regen: str) -> str:
    """What makes two generations of one prompt "the same": model, sampling, thinking, and
    the regen mode (every-turn yields other outputs than final-turn)."""
    canonical = orjson.dumps(
        {"model": model, "sampling": sampling, "thinking": thinking, "regen": regen},
        option=orjson.OPT_SORT_KEYS,
    )
    return hashlib.sha256(canonical).hexdigest()[:16]


def ledger_key(prompt_id: str, settings: str) -> str:
    return f"{prompt_id}{SEPARATOR}{settings}"


def split_key(key: str) -> tuple[str, str]:
    prompt_id, _, settings = key.rpartition(SEPARATOR)
    return prompt_id, settings


def ledger_value(prompt_id: str, settings: str, server: str) -> bytes:
    return orjson.dumps(
        {"v": 1, "prompt_id": prompt_id, "settings": settings, "server": server, "at": time.time()}
    )


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    await consumer._client.force_metadata_update()  # topics() caches: a new topic reads empty
    return [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]


async def read_generated(kafka: KafkaSettings) -> set[str]:
    """Every ledger key (``prompt_id@settings``) written so far."""
    follower = LedgerFollower(kafka)
    await follower.start()
    try:
        await follower.caught_up.wait()
        return set(follower.keys)
    finally:
        await follower.stop()


def generated_prompt_ids(keys: Iterable[str]) -> set[str]:
    return {split_key(key)[0] for key in keys}


class LedgerFollower:
    """Reads the ledger from its start and keeps following it; `caught_up` is set once the end
    offsets seen at start are reached. `settings` restricts the kept keys to one hash (a worker
    only asks about its own settings), which bounds memory to one id per generated prompt."""

    def __init__(self, kafka: KafkaSettings, settings: str | None = None, poll_ms: int = 200):
        self.kafka = kafka
        self.settings = settings
        self.poll_ms = poll_ms
        self.keys: set[str] = set()
        self.caught_up = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    def contains(self, prompt_id: str, settings: str) -> bool:
        return ledger_key(prompt_id, settings) in self.keys

    def add(self, prompt_id: str, settings: str) -> None:
        """What this process wrote itself, known before the topic echoes it back."""
        self.keys.add(ledger_key(prompt_id, settings))

    async def start(self) -> None:
        consumer = AIOKafkaConsumer(
            **self.kafka.aiokafka_kwargs(), group_id=None, enable_auto_commit=False
        )
        await consumer.start()
        self._consumer = consumer
        partitions = await _partitions(consumer, self.kafka.topic(GENERATED))
        if not partitions:
            self.caught_up.set()
            return
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        self._task = asyncio.create_task(self._follow(consumer, ends))

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer:
            await self._consumer.stop()

    async def _follow(self, consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int]) -> None:
        behind = {tp: end for tp, end in ends.items() if end > 0}
        if not behind:
            self.caught_up.set()
        while True:
            try:
                batches = await consumer.getmany(timeout_ms=self.poll_ms)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # a broker outage: keep the set, try again
                log.warning("reading the generated ledger failed (%s); retrying", err)
                await asyncio.sleep(1.0)
                continue
            for tp, records in batches.items():
                for record in records:
                    self._take(record.key)
                if tp in behind and records and records[-1].offset + 1 >= behind[tp]:
                    del behind[tp]
            if behind and not self.caught_up.is_set():
                # compaction may leave the last offsets empty: trust the position, not records
                for tp in list(behind):
                    if await consumer.position(tp) >= behind[tp]:
                        del behind[tp]
            if not behind and not self.caught_up.is_set():
                log.info("generated ledger read: %d entries", len(self.keys))
                self.caught_up.set()

    def _take(self, key: bytes | None) -> None:
        if not key:
            return
        text = key.decode("utf-8", "replace")
        if self.settings is None or split_key(text)[1] == self.settings:
            self.keys.add(text)
