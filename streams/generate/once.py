"""Each prompt generated once per settings: the generate stage behind the ledger.

- Before generating, it asks the ledger (streams/core/ledger.py) whether the prompt was generated
  already with its settings; if so the prompt is acked without a request. A copy of a prompt
  published while another copy is in flight here waits for it (both copies share a partition,
  since prompts are keyed by prompt_id) and is then skipped.
- After the completion is acknowledged by Kafka it writes the ledger record (same send loop,
  after the completion, so a ledger record never exists without its completion).
- Prompts stolen from other workers' backlogs (streams/generate/steal.py) go through it too:
  see the README, "Servers of unequal speed".
- A rebalance redoes no request its old owner is still finishing: when a partition is revoked
  with requests running here, their prompts are claimed in the ledger (`claim`, durable before
  the revocation handler returns, so before the group assigns the partition elsewhere), the
  requests go on (not retried any more: a failure releases the claim), and each claim is renewed
  every third of `claim_s` until its request ended, then released. The partition's new owner,
  once its ledger is read up to the moment of its assignment (`Ledger.sync`), waits without a
  request slot for a claim that holds (`claimed`, `until_unclaimed`): then the prompt's outcome
  is in the ledger (skipped), or the claim was released or lapsed (a killed worker's) and it
  asks its own server. A stolen prompt is claimed so too, before its request: its owner,
  reaching it, waits for the thief's outcome instead of asking its own server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable

import orjson

from streams.core.ledger import (
    REGENERATE,
    Claim,
    claim_key,
    dead_key,
    ledger_key,
    ledger_value,
    settings_hash,
)
from streams.core.settings import GenerateSettings
from streams.core.turns import FINAL, REGEN_MODES
from streams.generate.outputs import Completion, LedgerMark, Letter, Output
from streams.generate.ports import Ledger, ServerClient
from streams.generate.stage import GenerateStage, Owned
from streams.generate.stats import GenerateStats

log = logging.getLogger(__name__)

# seconds a revocation waits for its claims to be acknowledged before it returns anyway (a
# broker outage must not hold the group's rebalance; the new owner then redoes the prompts)
CLAIM_WRITE_S = 5.0
# seconds a prompt of a new assignment waits for the ledger to be read up to that assignment
# before it trusts what the ledger says of claims
SYNC_S = 5.0


def _always() -> bool:
    return True


def prompt_mode(value: bytes) -> tuple[str, bool]:
    """(regen mode, regenerate flag) of a prompt record; a bad record gets defaults (the stage
    dead-letters it)."""
    try:
        meta = orjson.loads(value).get("meta") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return FINAL, True
    if not isinstance(meta, dict):
        return FINAL, True
    return str(meta.get("regen") or FINAL), bool(meta.get(REGENERATE))


class OnceStage:
    def __init__(
        self,
        stage: GenerateStage,
        ledger: Ledger,
        settings: GenerateSettings,
        client: ServerClient,
        stats: GenerateStats,
    ):
        self.stage = stage
        self.ledger = ledger
        self.settings = settings
        self.client = client
        self.stats = stats
        self._running: dict[str, asyncio.Future[None]] = {}
        # this process in claims: unique per worker, even two on one server URL
        self.worker_id = f"{client.base_url}#{uuid.uuid4().hex[:12]}"
        # prompt_id -> the task holding its claim (written, renewed, released), and its stop
        self._holds: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = {}

    def settings_key(self, regen: str) -> str:
        sampling = self.settings.sampling.as_dict()
        return settings_hash(self.client.model, sampling, self.settings.thinking, regen)

    def know_model(self) -> None:
        """Once the model is known: the ledger keeps only this worker's settings."""
        self.ledger.restrict({self.settings_key(mode) for mode in REGEN_MODES})

    def already_generated(self, prompt_id: str, value: bytes) -> bool:
        regen, regenerate = prompt_mode(value)
        return not regenerate and self.ledger.ended(prompt_id, self.settings_key(regen))

    async def handle(
        self, key: bytes | None, raw: bytes, owned: Owned, poisoned: str | None = None
    ) -> None:
        if poisoned is not None or not key:
            await self.stage.handle(key, raw, owned, poisoned)
            return

        async def generate_and_record() -> list[Output]:
            await self.generate_and_record(key, raw, keep_dead_letters=owned, retry=owned)
            return []  # already sent, in order, before the ledger learnt of the prompt

        await self.stage.guarded(key, raw, owned, generate_and_record)

    async def stolen(self, key: bytes, value: bytes) -> bool:
        """One prompt taken from another worker's backlog: true if it completed. Failures are
        dropped, not dead-lettered: the owner still has the prompt and decides."""
        try:
            completed = await self.generate_and_record(key, value, lambda: False, claim=True)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("a stolen prompt failed; its owner will generate it")
            return False
        if completed:
            self.stats.stolen += 1
        return completed

    async def generate_and_record(
        self,
        key: bytes,
        value: bytes,
        keep_dead_letters: Callable[[], bool],
        retry: Callable[[], bool] = _always,
        claim: bool = False,
    ) -> bool:
        """Generate unless the ledger has its outcome; send the outputs, then record it. The
        ledger (and this process's view of it) learns of a prompt only once its completion or
        dead letter is acknowledged by Kafka, so a copy skipped because of it can never be the
        prompt's last chance. Exactly one outcome: a prompt the ledger says ended (completed or
        dead-lettered) is not done again (a redelivery after a crash); a dead letter is dropped
        when the prompt is no longer ours (`keep_dead_letters()` false: revoked, or stolen) or
        when a completion of it was recorded meanwhile (by the worker it moved from). A
        transient failure is retried only while `retry()`; a claim on the prompt (its partition
        revoked meanwhile) is released once the outcome, if any, is in the ledger. `claim`: a
        stolen prompt, claimed before its request (so its owner, reaching it, waits for it
        rather than asking its server too), and not taken when another worker's claim holds."""
        await self.ledger.caught_up.wait()
        prompt_id = key.decode("utf-8", "replace")
        regen, regenerate = prompt_mode(value)
        settings = self.settings_key(regen)
        # a copy of this prompt is in flight here: let it finish, then ask the ledger
        while (running := self._running.get(prompt_id)) is not None:
            await asyncio.shield(running)
        if not regenerate and self.ledger.ended(prompt_id, settings):
            self.stats.skipped += 1
            return False
        if not retry():
            return False  # revoked before its request started: its new owner asks
        if claim and self._claim_elsewhere(key, value) is not None:
            return False  # another worker generates it now
        done = asyncio.get_running_loop().create_future()
        self._running[prompt_id] = done
        try:
            if claim:
                await self._claimed_now([self._hold_for(prompt_id, settings)])
            outputs = await self.stage.outputs(key, value, retry)
            keep = keep_dead_letters() and not self.ledger.contains(prompt_id, settings)
            if not keep:
                outputs = [o for o in outputs if not isinstance(o, Letter)]
            delivered = [await self.stage.deliver(o, value, prompt_id, keep) for o in outputs]
            completed = any(isinstance(o, Completion) for o in delivered)
            dead = any(isinstance(o, Letter) for o in delivered)
            record = ledger_value(prompt_id, settings, self.client.base_url)
            if completed:
                mark = LedgerMark(ledger_key(prompt_id, settings).encode(), record)
                await self.stage.outbox.send(mark)
                self.ledger.add(prompt_id, settings)
            elif dead:
                mark = LedgerMark(dead_key(prompt_id, settings).encode(), record)
                await self.stage.outbox.send(mark)
                self.ledger.add_dead(prompt_id, settings)
        finally:
            try:
                await self._release(prompt_id)
            finally:  # also when cancelled while releasing (the worker stops)
                del self._running[prompt_id]
                done.set_result(None)
        return completed

    # -- claims: the old owner's side -------------------------------------------------------

    async def claim(self, records: Iterable[tuple[bytes | None, bytes]]) -> None:
        """Claim the prompts among `records` (a revoked partition's, in flight) whose request
        runs here: returns once the claims are acknowledged by Kafka, or after `CLAIM_WRITE_S`.
        Each claim is then renewed until its request ends, and released after."""
        written = []
        for key, value in records:
            prompt_id = (key or b"").decode("utf-8", "replace")
            if not key or prompt_id not in self._running or prompt_id in self._holds:
                continue  # not requested here (waiting for a slot, or for another's claim)
            written.append(self._hold_for(prompt_id, self.settings_key(prompt_mode(value)[0])))
        if written and await self._claimed_now(written):
            log.info("partitions revoked: claimed %d prompts whose requests run here", len(written))

    def _hold_for(self, prompt_id: str, settings: str) -> asyncio.Event:
        """Start holding the prompt's claim; the event is set once it is written."""
        first, stop = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(self._hold(prompt_id, settings, first, stop))
        self._holds[prompt_id] = (task, stop)
        return first

    async def _claimed_now(self, written: list[asyncio.Event]) -> bool:
        """Until these claims are acknowledged, at most `CLAIM_WRITE_S`: whether they were."""
        self.stats.claimed += len(written)
        try:
            async with asyncio.timeout(CLAIM_WRITE_S):  # no gather: a stop cancels it cleanly
                for event in written:
                    await event.wait()
        except TimeoutError:
            log.warning(
                "claims of %d prompts not acknowledged within %.0f s: another worker may ask "
                "its server for them too",
                len(written),
                CLAIM_WRITE_S,
            )
            return False
        return True

    async def _hold(
        self, prompt_id: str, settings: str, first: asyncio.Event, stop: asyncio.Event
    ) -> None:
        key = claim_key(prompt_id, settings).encode()
        every = self.settings.claim_s / 3
        while True:
            claim = Claim(self.worker_id, time.time() + self.settings.claim_s)
            await self.stage.outbox.send(LedgerMark(key, claim.encode()))
            first.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)
            if stop.is_set():
                break
        released = Claim(self.worker_id, time.time(), released=True)
        await self.stage.outbox.send(LedgerMark(key, released.encode()))

    async def _release(self, prompt_id: str) -> None:
        # a loop: a claim made while the last one was released is released too
        while (hold := self._holds.pop(prompt_id, None)) is not None:
            task, stop = hold
            stop.set()
            await task

    async def finish_claimed(self, seconds: float) -> None:
        """Wait up to `seconds` for every claimed request to end and its claim be released,
        those claimed while we wait too (a steal that was under way)."""
        holds = [task for task, _ in self._holds.values()]
        if not holds:
            return
        log.info("finishing %d claimed requests (for up to %.0f s)", len(holds), seconds)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while holds and (left := deadline - loop.time()) > 0:
            await asyncio.wait(holds, timeout=left)
            holds = [task for task, _ in self._holds.values() if not task.done()]
        if holds:
            log.warning("%d claimed requests still running: their claims lapse", len(holds))

    def stop(self) -> None:
        for task, _ in self._holds.values():
            task.cancel()

    # -- claims: the new owner's side -------------------------------------------------------

    async def claimed(self, key: bytes | None, value: bytes) -> bool:
        """Whether another worker is finishing this prompt's request (a claim that holds), as
        the ledger says once read up to this worker's last assignment: the caller then awaits
        `until_unclaimed` without holding a request slot."""
        if not key:
            return False
        await self.ledger.caught_up.wait()
        if not await self.ledger.synced(SYNC_S):
            log.warning("the generated ledger not read up to the assignment within %.0f s", SYNC_S)
        # no claim at all, mostly: the prompt record is not parsed for nothing
        return bool(self.ledger.claims) and self._claim_elsewhere(key, value) is not None

    async def until_unclaimed(self, key: bytes, value: bytes) -> None:
        """Until the claim on the prompt no longer holds: its outcome is in the ledger, or the
        claim was released or lapsed."""
        self.stats.awaited += 1
        while (claim := self._claim_elsewhere(key, value)) is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ledger.changed(), claim.until - time.time())
        claim = self._claim_of(key, value)
        if claim is not None and not claim.released and not claim.holds():
            log.warning(
                "the claim of %s by %s lapsed (its worker killed?): asking the server",
                key.decode("utf-8", "replace"),
                claim.worker,
            )

    def _claim_of(self, key: bytes, value: bytes) -> Claim | None:
        regen, _ = prompt_mode(value)
        return self.ledger.claim(key.decode("utf-8", "replace"), self.settings_key(regen))

    def _claim_elsewhere(self, key: bytes, value: bytes) -> Claim | None:
        regen, regenerate = prompt_mode(value)
        if regenerate:
            return None  # generated again whatever the ledger says
        prompt_id, settings = key.decode("utf-8", "replace"), self.settings_key(regen)
        if self.ledger.ended(prompt_id, settings):
            return None
        claim = self.ledger.claim(prompt_id, settings)
        if claim is None or claim.worker == self.worker_id or not claim.holds():
            return None  # one of this process's: its copy in flight is waited for (_running)
        return claim
