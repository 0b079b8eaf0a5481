"""The record of what was generated: the compacted topic `{prefix}generated`.

One record per (prompt_id, generation settings), keyed ``{prompt_id}@{settings hash}``, written
by a generate worker after the completion was acknowledged by Kafka; a prompt that ended as a
generate-stage dead letter instead gets ``{prompt_id}@{settings hash}{DEAD}``, so that its
redelivery after a crash is not done again (one outcome per prompt). Compaction keeps one record
per key forever, so the record survives worker restarts and is read back in full by:

- `publish`, at start: prompts already generated are skipped (unless `--regenerate`);
- every generate worker, continuously (`LedgerFollower`): a prompt published again while the
  run goes on is acked without being generated.

A third kind of key, ``{prompt_id}@{settings hash}{CLAIM}``, is no outcome: a generate worker
whose partition was revoked while it was generating the prompt writes it (before its revocation
handler returns, so before the group assigns the partition elsewhere) and renews it while its
request runs; the partition's new owner waits for that request's outcome instead of asking its
own server (streams/generate/once.py). Its value is a `Claim`; the last one written for a key is
a release once the request ended (with or without an outcome). Readers of outcomes skip claim
keys (`outcome_key`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
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


# suffix of the key of a claim: a worker finishing a request of a revoked prompt (no outcome)
CLAIM = "!claim"


def ledger_key(prompt_id: str, settings: str) -> str:
    return f"{prompt_id}{SEPARATOR}{settings}"


def dead_key(prompt_id: str, settings: str) -> str:
    return f"{ledger_key(prompt_id, settings)}{DEAD}"


def claim_key(prompt_id: str, settings: str) -> str:
    return f"{ledger_key(prompt_id, settings)}{CLAIM}"


def split_key(key: str) -> tuple[str, str]:
    prompt_id, _, settings = key.rpartition(SEPARATOR)
    return prompt_id, settings


def outcome_key(key: str) -> str | None:
    """The key of an outcome (``prompt_id@settings``, with DEAD for a dead letter) as is; None
    for a claim, which is no outcome."""
    return None if key.endswith(CLAIM) else key


@dataclass(frozen=True)
class Claim:
    """Who is finishing a revoked prompt's request, until when (wall clock, seconds since the
    epoch: the claimant renews it well before; a claim not renewed lapses, as a killed worker's
    does). `released`: the request ended; the outcome, if any, was written before."""

    worker: str
    until: float
    released: bool = False

    def encode(self) -> bytes:
        return orjson.dumps(
            {"v": 1, "claim": self.worker, "until": self.until, "released": self.released}
        )

    @classmethod
    def decode(cls, value: bytes | None) -> Claim | None:
        """None for a value that is no claim (written by a later version, or damaged)."""
        try:
            data = orjson.loads(value or b"")
            return cls(str(data["claim"]), float(data["until"]), bool(data.get("released")))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None

    def holds(self, now: float | None = None) -> bool:
        return not self.released and self.until > (time.time() if now is None else now)


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
    return {split_key(key)[0] for key in keys if not key.endswith((DEAD, CLAIM))}


class LedgerState:
    """What the ledger says, from its records (`take`): the outcome keys, and the claims of
    prompts whose request another worker is finishing. `settings` (or `restrict`, once a worker
    knows its model) restricts what is kept to those hashes (a worker only asks about its own
    settings), which bounds memory to one id per generated prompt."""

    def __init__(self, settings: str | None = None) -> None:
        self.settings: frozenset[str] | None = None if settings is None else frozenset([settings])
        self.keys: set[str] = set()
        # ledger key -> the claim last written for it (released ones dropped)
        self.claims: dict[str, Claim] = {}
        self._changed = asyncio.Event()

    def restrict(self, settings: Iterable[str]) -> None:
        """Keep only keys of these settings hashes, from now on and of those read so far."""
        self.settings = frozenset(settings)
        self.keys = {key for key in self.keys if self._kept(key)}
        self.claims = {key: c for key, c in self.claims.items() if self._kept(key)}

    def _kept(self, key: str) -> bool:
        base = key.removesuffix(DEAD).removesuffix(CLAIM)
        return self.settings is None or split_key(base)[1] in self.settings

    def contains(self, prompt_id: str, settings: str) -> bool:
        return ledger_key(prompt_id, settings) in self.keys

    def ended(self, prompt_id: str, settings: str) -> bool:
        """Completed or dead-lettered with these settings."""
        return self.contains(prompt_id, settings) or dead_key(prompt_id, settings) in self.keys

    def claim(self, prompt_id: str, settings: str) -> Claim | None:
        """The claim on this prompt, if one is written and not released (it may have lapsed:
        `Claim.holds`)."""
        return self.claims.get(ledger_key(prompt_id, settings))

    def add(self, prompt_id: str, settings: str) -> None:
        """What this process wrote itself, known before the topic echoes it back."""
        self.keys.add(ledger_key(prompt_id, settings))

    def add_dead(self, prompt_id: str, settings: str) -> None:
        self.keys.add(dead_key(prompt_id, settings))

    async def changed(self) -> None:
        """Returns at the next record taken (a claim renewed or released, an outcome)."""
        await self._changed.wait()

    def take(self, key: bytes | None, value: bytes | None) -> None:
        """One record of the ledger topic."""
        if not key:
            return
        text = key.decode("utf-8", "replace")
        if not self._kept(text):
            return
        if text.endswith(CLAIM):
            base = text.removesuffix(CLAIM)
            claim = Claim.decode(value)
            if claim is None or claim.released:
                self.claims.pop(base, None)
            else:
                self.claims[base] = claim
        else:
            self.keys.add(text)
        self._changed.set()
        self._changed = asyncio.Event()  # waiters hold the one just set


class LedgerFollower(LedgerState):
    """Reads the ledger from its start and keeps following it; `caught_up` is set once the end
    offsets seen at start are reached. A broker outage while following is waited out with
    `backoff`; the keys read are kept. `sync()` sets a read-your-writes barrier: `synced()`
    returns once everything written to the ledger before the call is read."""

    def __init__(
        self,
        kafka: KafkaSettings,
        settings: str | None = None,
        poll_ms: int = 200,
        backoff: Backoff | None = None,
    ):
        super().__init__(settings)
        self.kafka = kafka
        self.poll_ms = poll_ms
        self.backoff = backoff or retry.backoff("ledger")
        self.caught_up = asyncio.Event()
        self._reader = TopicReader(kafka, kafka.topic(GENERATED))
        self._task: asyncio.Task[None] | None = None
        # the end offsets of the last barrier, and whether they were reached
        self._barrier: dict[Any, int] | None = None
        self._synced = asyncio.Event()
        self._synced.set()
        self._syncing: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if not await self._reader.open():
            self.caught_up.set()  # no ledger topic: nothing was generated
            return
        self._task = asyncio.create_task(self._follow())

    async def stop(self) -> None:
        for task in (self._task, self._syncing):
            if task:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._reader.close()

    def sync(self) -> None:
        """A barrier at this moment (called as partitions are assigned): the ledger's end
        offsets are asked now, and `synced()` waits until they are read. A barrier not reached
        yet is replaced by this later one, and its waiters wait for the later one: a fleet
        starting together rebalances several times within a second."""
        if not self._reader.is_open:
            return  # no ledger topic yet: nothing written to wait for
        if self._synced.is_set():
            self._synced = asyncio.Event()
        self._barrier = None  # the earlier offsets no longer release anyone
        if self._syncing is not None:
            self._syncing.cancel()
        self._syncing = asyncio.create_task(self._ends(self._synced))

    async def _ends(self, synced: asyncio.Event) -> None:
        try:
            self._barrier = await self._reader.ends()
        except Exception as err:  # a broker outage: no barrier (the caller's wait is bounded)
            log.warning("the generated ledger's end offsets: %s", err)
            synced.set()

    async def synced(self, timeout: float) -> bool:
        """Whether the last barrier was reached within `timeout` seconds."""
        try:
            await asyncio.wait_for(self._synced.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def _follow(self) -> None:
        while True:
            for record in await until_done(
                "reading the generated ledger", self._next, self.backoff, log
            ):
                self.take(record.key, record.value)
            barrier = self._barrier
            reached = barrier is not None and await self._reader.reached(barrier)
            if reached and barrier is self._barrier:  # not replaced by a later one meanwhile
                self._barrier = None
                self._synced.set()

    async def _next(self) -> list[Any]:
        if not self.caught_up.is_set() and await self._reader.caught_up():
            log.info("generated ledger read: %d entries", len(self.keys))
            self.caught_up.set()
        return await self._reader.read(timeout_ms=self.poll_ms)
