"""The record of what was generated: the compacted topic `{prefix}generated`.

One record per (prompt_id, generation settings), keyed ``{prompt_id}@{settings hash}``, written
by a generate worker after the completion was acknowledged by Kafka; a prompt that ended as a
generate-stage dead letter instead gets ``{prompt_id}@{settings hash}{DEAD}``, so that its
redelivery after a crash is not done again (one outcome per prompt). Compaction keeps one record
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

from streams.core import retry
from streams.core.retry import Backoff, until_done
from streams.core.settings import GENERATED, KafkaSettings
from streams.core.topic_reader import TopicReader

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


# suffix of the key of a prompt whose outcome was a dead letter (not "generated": `publish`
# does not skip it, so publishing it again is a new attempt)
DEAD = "!dead"


def ledger_key(prompt_id: str, settings: str) -> str:
    return f"{prompt_id}{SEPARATOR}{settings}"


def dead_key(prompt_id: str, settings: str) -> str:
    return f"{ledger_key(prompt_id, settings)}{DEAD}"


def split_key(key: str) -> tuple[str, str]:
    prompt_id, _, settings = key.rpartition(SEPARATOR)
    return prompt_id, settings


def ledger_value(prompt_id: str, settings: str, server: str) -> bytes:
    return orjson.dumps(
        {"v": 1, "prompt_id": prompt_id, "settings": settings, "server": server, "at": time.time()}
    )


async def read_generated(kafka: KafkaSettings) -> set[str]:
    """Every ledger key (``prompt_id@settings``) written so far."""
    follower = LedgerFollower(kafka)
    try:
        await follower.start()
        await follower.caught_up.wait()
        return set(follower.keys)
    finally:
        await follower.stop()


def generated_prompt_ids(keys: Iterable[str]) -> set[str]:
    return {split_key(key)[0] for key in keys if not key.endswith(DEAD)}


class LedgerFollower:
    """Reads the ledger from its start and keeps following it; `caught_up` is set once the end
    offsets seen at start are reached. `settings` (or `restrict`, once a worker knows its model)
    restricts the kept keys to those hashes (a worker only asks about its own settings), which
    bounds memory to one id per generated prompt. A broker outage while following is waited
    out with `backoff`; the keys read are kept."""

    def __init__(
        self,
        kafka: KafkaSettings,
        settings: str | None = None,
        poll_ms: int = 200,
        backoff: Backoff | None = None,
    ):
        self.kafka = kafka
        self.settings: frozenset[str] | None = None if settings is None else frozenset([settings])
        self.poll_ms = poll_ms
        self.backoff = backoff or retry.backoff("ledger")
        self.keys: set[str] = set()
        self.caught_up = asyncio.Event()
        self._reader = TopicReader(kafka, kafka.topic(GENERATED))
        self._task: asyncio.Task[None] | None = None

    def restrict(self, settings: Iterable[str]) -> None:
        """Keep only keys of these settings hashes, from now on and of those read so far."""
        self.settings = frozenset(settings)
        self.keys = {key for key in self.keys if self._kept(key)}

    def _kept(self, key: str) -> bool:
        return self.settings is None or split_key(key.removesuffix(DEAD))[1] in self.settings

    def contains(self, prompt_id: str, settings: str) -> bool:
        return ledger_key(prompt_id, settings) in self.keys

    def ended(self, prompt_id: str, settings: str) -> bool:
        """Completed or dead-lettered with these settings."""
        return self.contains(prompt_id, settings) or dead_key(prompt_id, settings) in self.keys

    def add(self, prompt_id: str, settings: str) -> None:
        """What this process wrote itself, known before the topic echoes it back."""
        self.keys.add(ledger_key(prompt_id, settings))

    def add_dead(self, prompt_id: str, settings: str) -> None:
        self.keys.add(dead_key(prompt_id, settings))

    async def start(self) -> None:
        if not await self._reader.open():
            self.caught_up.set()  # no ledger topic: nothing was generated
            return
        self._task = asyncio.create_task(self._follow())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._reader.close()

    async def _follow(self) -> None:
        while True:
            for record in await until_done(
                "reading the generated ledger", self._next, self.backoff, log
            ):
                self._take(record.key)

    async def _next(self) -> list[Any]:
        if not self.caught_up.is_set() and await self._reader.caught_up():
            log.info("generated ledger read: %d entries", len(self.keys))
            self.caught_up.set()
        return await self._reader.read(timeout_ms=self.poll_ms)

    def _take(self, key: bytes | None) -> None:
        if not key:
            return
        text = key.decode("utf-8", "replace")
        if self._kept(text):
            self.keys.add(text)
