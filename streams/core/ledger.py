"""The record of what was generated: the compacted topic `{prefix}generated`.

One record per (prompt_id, generation settings), keyed ``{prompt_id}@{settings hash}``, written
by a generate worker after the completion was acknowledged by Kafka; a prompt that ended as a
generate-stage dead letter instead gets ``{prompt_id}@{settings hash}{DEAD}``, so that its
redelivery after a crash is not done again (one outcome per prompt). Compaction keeps one record
per key forever, so the record survives worker restarts and is read back in full by:

- `publish`, at start: prompts already generated are skipped (unless `--regenerate`);
- every generate worker, continuously (`LedgerFollower`): a prompt published again while the
  run goes on is acked without being generated.

A third kind of key, ``{work key}{CLAIM}``, is no outcome but who requests the prompt now: every
generate worker claims a prompt before it requests it, and the claims of one prompt share one
key, so Kafka orders them and every reader decides the same holder from them (`LedgerState.take`,
the rule in `Claim`; the protocol around it is streams/generate/claims.py). The work key is
``{prompt_id}@{settings hash}``, with ``~{nonce}`` for a prompt published with `--regenerate`
(its own publish's claims: the earlier outcome does not settle it). A release carries the
outcome, so a reader that sees a prompt freed has seen how it ended. Readers of outcomes skip
claim keys (`outcome_key`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from streams.core import retry
from streams.core.model_names import model_name
from streams.core.retry import Backoff, until_done
from streams.core.settings import GENERATED, KafkaSettings
from streams.core.topic_reader import TopicReader

log = logging.getLogger(__name__)

SEPARATOR = "@"
# meta flag set by `publish --regenerate`: generate even if the ledger has it
REGENERATE = "regenerate"


def settings_hash(model: str, sampling: dict[str, Any], thinking: bool, regen: str) -> str:
    """What makes two generations of one prompt "the same": model, sampling, thinking, and
    the regen mode (every-turn yields other outputs than final-turn). The model by its name
    (`model_name`): servers that name it by the paths of its weights share one claim space."""
    canonical = orjson.dumps(
        {"model": model_name(model), "sampling": sampling, "thinking": thinking, "regen": regen},
        option=orjson.OPT_SORT_KEYS,
    )
    return hashlib.sha256(canonical).hexdigest()[:16]


# suffix of the key of a prompt whose outcome was a dead letter (not "generated": `publish`
# does not skip it, so publishing it again is a new attempt)
DEAD = "!dead"


# suffix of the key of a claim: who requests the prompt now (no outcome)
CLAIM = "!claim"
# Kafka's timestamp type of a record stamped by the broker (the ledger's: streams/core/topics.py)
LOG_APPEND_TIME = 1
# own claims read back that estimate the broker's clock (LedgerState.now)
SKEW_SAMPLES = 16


def ledger_key(prompt_id: str, settings: str) -> str:
    return f"{prompt_id}{SEPARATOR}{settings}"


def dead_key(prompt_id: str, settings: str) -> str:
    return f"{ledger_key(prompt_id, settings)}{DEAD}"


def split_key(key: str) -> tuple[str, str]:
    prompt_id, _, settings = key.rpartition(SEPARATOR)
    return prompt_id, settings


def outcome_key(key: str) -> str | None:
    """The key of an outcome (``prompt_id@settings``, with DEAD for a dead letter) as is; None
    for a claim, which is no outcome."""
    return None if key.endswith(CLAIM) else key


# how a released claim's request ended: a completion, a dead letter (None: no outcome, the
# prompt is free again)
DONE = "done"
DEAD_LETTER = "dead"
NONCE = "~"


def work_key(prompt_id: str, settings: str, nonce: str = "") -> str:
    """What a claim is on: the prompt under these settings; `nonce`: one `--regenerate` publish."""
    base = ledger_key(prompt_id, settings)
    return f"{base}{NONCE}{nonce}" if nonce else base


def claim_key(work: str) -> str:
    return f"{work}{CLAIM}"


def outcome_of(work: str) -> str:
    """The outcome key's base of a work key (its publish's nonce left out)."""
    return work.partition(NONCE)[0]


# a Failure's kind when its server went down (crashed, was killed or stopped answering) while
# the work ran there: the prompt may be what took it down
CRASH = "crash"


@dataclass(frozen=True)
class Failure:
    """A request of a work that ended without an outcome for a reason that may be the prompt's
    or its server's: a permanent refusal (`kind` is its error's, e.g. `http_404`), or CRASH.
    Who is to blame is decided from all of them (streams/generate/blame.py)."""

    server: str
    kind: str
    at: float


@dataclass(frozen=True)
class Claim:
    """Who requests a prompt, written at `at` and lapsing at `until` (the writer's clock,
    seconds since the epoch; the holder renews it well before). `released`: the request ended,
    and `outcome` says how (DONE, DEAD_LETTER) when it left one, written to the ledger before.
    `appended`: when the broker appended it (the ledger's LogAppendTime), read, not written.

    Time is the broker's (`start`, `end`): a claim read with its append time starts then and
    lasts what its writer asked (`until - at`), so hosts whose clocks disagree still agree on
    who holds a prompt; a claim without one (a ledger topic created with CreateTime) keeps its
    writer's times. The rule every reader applies in the ledger's order (`LedgerState.take`),
    so all agree: a claim wins when the prompt has no holder, when it is its holder's own (a
    renewal), or when the holder's claim had ended when the new claim started; a release frees
    the prompt only when its holder wrote it."""

    worker: str
    until: float
    released: bool = False
    at: float = 0.0
    outcome: str | None = None
    # every failure of the work known to the writer (streams/generate/blame.py): each record
    # carries them all, so compaction, which keeps a key's last record only, keeps them
    failures: tuple[Failure, ...] = ()
    appended: float | None = None

    @property
    def start(self) -> float:
        return self.at if self.appended is None else self.appended

    @property
    def end(self) -> float:
        return self.until if self.appended is None else self.appended + (self.until - self.at)

    def encode(self) -> bytes:
        value: dict[str, Any] = {
            "v": 1,
            "claim": self.worker,
            "until": self.until,
            "at": self.at,
            "released": self.released,
        }
        if self.outcome:
            value["outcome"] = self.outcome
        if self.failures:
            value["failures"] = [[f.server, f.kind, f.at] for f in self.failures]
        return orjson.dumps(value)

    @classmethod
    def decode(cls, value: bytes | None, appended: float | None = None) -> Claim | None:
        """None for a value that is no claim (written by a later version, or damaged)."""
        try:
            data = orjson.loads(value or b"")
            outcome = data.get("outcome")
            failures = tuple(
                Failure(str(server), str(kind), float(at))
                for server, kind, at in data.get("failures") or ()
            )
            return cls(
                str(data["claim"]),
                float(data["until"]),
                bool(data.get("released")),
                float(data.get("at") or 0.0),
                outcome if outcome in (DONE, DEAD_LETTER) else None,
                failures,
                appended,
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            return None

    def holds(self, now: float | None = None) -> bool:
        """Not released and not ended at `now` (the broker's time: `LedgerState.now`)."""
        return not self.released and self.end > (time.time() if now is None else now)

    def beats(self, holder: Claim | None) -> bool:
        """Whether this claim, read after `holder`'s, makes its writer the holder."""
        return holder is None or holder.worker == self.worker or holder.end <= self.start


def appended_at(record: Any) -> float | None:
    """A consumed record's LogAppendTime in seconds (None: its timestamp is its producer's)."""
    return record.timestamp / 1000 if record.timestamp_type == LOG_APPEND_TIME else None


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
    """What the ledger says, from its records (`take`): the outcome keys, and the holder of each
    prompt's claim. Every settings hash is kept: a worker answers each prompt under its recipe's
    settings (streams/core/recipes.py), which it learns only when it meets the prompt. Memory:
    one key (~130 bytes) per prompt generated on the stack, under any settings."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        # work key -> the claim that holds it, by the rule in `Claim` (released ones dropped)
        self.claims: dict[str, Claim] = {}
        # work keys of --regenerate publishes released with an outcome
        self.regenerated: set[str] = set()
        # claims written here, waiting to be read back: (work key, worker, at) -> won?
        self._echoes: dict[tuple[str, str, float], asyncio.Future[bool]] = {}
        # work key -> set at the next record of it (a claim, a release, an outcome)
        self._watched: dict[str, asyncio.Event] = {}
        # work key -> its failures without an outcome (few prompts have any)
        self._failures: dict[str, set[Failure]] = {}
        # worker -> its latest claim's start (a coarse "who else is working")
        self._claimed_at: dict[str, float] = {}
        # the broker's clock less ours, from our own claims read back (`now`): the largest of
        # the latest, as each is late by its delivery
        self._skews: deque[float] = deque(maxlen=SKEW_SAMPLES)

    def contains(self, prompt_id: str, settings: str) -> bool:
        return ledger_key(prompt_id, settings) in self.keys

    def ended(self, prompt_id: str, settings: str) -> bool:
        """Completed or dead-lettered with these settings."""
        return self.contains(prompt_id, settings) or dead_key(prompt_id, settings) in self.keys

    def settled(self, work: str) -> bool:
        """Whether the work has its outcome: a --regenerate publish's own, else the prompt's."""
        if NONCE in work:
            return work in self.regenerated
        return work in self.keys or f"{work}{DEAD}" in self.keys

    def holder(self, work: str) -> Claim | None:
        """The claim that holds the work, if any (it may have lapsed: `Claim.holds`)."""
        return self.claims.get(work)

    def now(self) -> float:
        """The broker's time, as near as our own claims read back tell it: claims are judged
        on it, not on this host's clock (which may be off by any amount)."""
        return time.time() + (max(self._skews) if self._skews else 0.0)

    def failures(self, work: str) -> tuple[Failure, ...]:
        """The work's failures read so far, oldest first."""
        return tuple(sorted(self._failures.get(work, ()), key=lambda f: (f.at, f.server)))

    def last_claim_elsewhere(self, worker: str) -> float | None:
        """When (the broker's time, `now`) another worker than `worker` last claimed anything."""
        return max((at for w, at in self._claimed_at.items() if w != worker), default=None)

    def claim(self, prompt_id: str, settings: str) -> Claim | None:
        return self.holder(ledger_key(prompt_id, settings))

    def add(self, prompt_id: str, settings: str) -> None:
        """What this process wrote itself, known before the topic echoes it back."""
        self.keys.add(ledger_key(prompt_id, settings))

    def add_dead(self, prompt_id: str, settings: str) -> None:
        self.keys.add(dead_key(prompt_id, settings))

    def expect(self, work: str, claim: Claim) -> asyncio.Future[bool]:
        """Before writing `claim`: resolves once it is read back, true if it won the work."""
        future = asyncio.get_running_loop().create_future()
        self._echoes[(work, claim.worker, claim.at)] = future
        return future

    def forget(self, work: str, claim: Claim) -> None:
        """A claim no longer waited for (its write gave up)."""
        self._echoes.pop((work, claim.worker, claim.at), None)

    def watch(self, work: str) -> asyncio.Event:
        """Set at the next record of this work (claim, release or outcome)."""
        event = self._watched.get(work)
        if event is None:
            event = self._watched[work] = asyncio.Event()
        return event

    def take(self, key: bytes | None, value: bytes | None, appended: float | None = None) -> None:
        """One record of the ledger topic; `appended`: its LogAppendTime (seconds), if it has
        one."""
        if not key:
            return
        text = key.decode("utf-8", "replace")
        if text.endswith(CLAIM):
            work = text.removesuffix(CLAIM)
            claim = Claim.decode(value, appended)
            if claim is not None:
                self._take_claim(work, claim)
        else:
            self.keys.add(text)
            work = text.removesuffix(DEAD)
        if (event := self._watched.pop(work, None)) is not None:
            event.set()

    def _take_claim(self, work: str, claim: Claim) -> None:
        if claim.failures:
            self._failures.setdefault(work, set()).update(claim.failures)
        if not claim.released:
            self._claimed_at[claim.worker] = max(
                claim.start, self._claimed_at.get(claim.worker, 0.0)
            )
        holder = self.claims.get(work)
        if claim.released:
            if holder is not None and holder.worker == claim.worker:
                del self.claims[work]
            if claim.outcome is not None:  # written before the release: known with it
                base = outcome_of(work)
                self.keys.add(base if claim.outcome == DONE else f"{base}{DEAD}")
                if NONCE in work:
                    self.regenerated.add(work)
            return
        won = claim.beats(holder)
        if won:
            self.claims[work] = claim
        echo = self._echoes.pop((work, claim.worker, claim.at), None)
        if echo is not None and claim.appended is not None:
            self._skews.append(claim.appended - time.time())
        if echo is not None and not echo.done():
            echo.set_result(won)


class LedgerFollower(LedgerState):
    """Reads the ledger from its start and keeps following it; `caught_up` is set once the end
    offsets seen at start are reached. A broker outage while following is waited out with
    `backoff`; the keys read are kept. A claimant learns whether its claim won by reading it
    back (`expect`): the ledger's order of one key's records is the same for every reader."""

    def __init__(
        self,
        kafka: KafkaSettings,
        poll_ms: int = 200,
        backoff: Backoff | None = None,
    ):
        super().__init__()
        self.kafka = kafka
        self.poll_ms = poll_ms
        self.backoff = backoff or retry.backoff("ledger")
        self.caught_up = asyncio.Event()
        self._reader = TopicReader(kafka, kafka.topic(GENERATED))
        self._task: asyncio.Task[None] | None = None

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
                self.take(record.key, record.value, appended_at(record))

    async def _next(self) -> list[Any]:
        if not self.caught_up.is_set() and await self._reader.caught_up():
            log.info("generated ledger read: %d entries", len(self.keys))
            self.caught_up.set()
        return await self._reader.read(timeout_ms=self.poll_ms)
