"""Each prompt generated once per settings, by one worker at a time: the generate stage behind
the ledger (streams/core/ledger.py) and its claims (streams/generate/claims.py).

A prompt (consumed from this worker's partitions, or stolen from another's backlog) goes round
one loop until it is settled:
1. Its outcome is in the ledger (completed or dead-lettered with these settings; a
   `--regenerate` publish: an outcome of that publish) -> nothing to do; an own prompt is acked.
2. Another worker's claim holds it -> wait for the ledger's next record of it, without a request
   slot (its outcome, its release, or the claim lapses). A thief moves on instead.
3. It failed on this server before (refused, or running at a crash) while other workers work
   -> leave it to them (streams/generate/blame.py): a thief moves on, the owner waits.
4. Else take a request slot (once the server's gate is open; a suspect of a crash, or any
   prompt of a server on probation, one at a time), claim it, request, then record: deliver
   the outputs, write the ledger mark and release the claim with the outcome, as one step a
   stop does not cut (streams/generate/record.py). The holder of the claim decides the
   outcome: a failure for good is the prompt's only when blame.py's rules say so (another
   server agreed), else the claim is released with the failure recorded.
The request ends early when the gate closes (the server went down, hung, or refuses the key) or
the claim is lost: the claim is released without an outcome and the slot freed, so the prompt is
free for any worker with a free slot, and this one takes it again if it is still free once its
server is back. A prompt whose partition was revoked and that is not requesting stops (its new
owner has it); one whose request runs finishes under its claim. A copy of a prompt requesting
here is waited for by the other copies (a prompt published twice shares a partition).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid

import orjson

from streams.core.ledger import CRASH, REGENERATE, Failure, settings_hash
from streams.core.recipes import Policy, effective_sampling, effective_thinking
from streams.core.record_fields import RecordError
from streams.core.settings import GenerateSettings
from streams.core.turns import FINAL
from streams.generate import blame
from streams.generate.claims import Held, LedgerClaims, Work, WorkQueue
from streams.generate.outputs import Letter, Output
from streams.generate.ports import Gate, Ledger, ServerClient
from streams.generate.record import Recorder
from streams.generate.slots import Slots
from streams.generate.stage import GenerateStage, Owned, Refused
from streams.generate.stats import GenerateStats

log = logging.getLogger(__name__)

# seconds a drain gives the claims of requests it cut off to be released (they lapse otherwise)
RELEASE_S = 5.0


def prompt_mode(value: bytes) -> tuple[str, str, Policy | None]:
    """(regen mode, nonce, recipe policy) of a prompt record: the nonce names a `--regenerate`
    publish ("" for any other); a bad record gets defaults (the stage dead-letters it)."""
    try:
        record = orjson.loads(value)
        meta = record.get("meta") or {}
        policy = Policy.from_dict(record["policy"]) if record.get("policy") is not None else None
    except (orjson.JSONDecodeError, AttributeError, RecordError):
        return FINAL, "", None
    if not isinstance(meta, dict):
        return FINAL, "", policy
    nonce = ""
    if meta.get(REGENERATE):
        published = repr(record.get("published_at")).encode()
        nonce = hashlib.sha256(published).hexdigest()[:12]
    return str(meta.get("regen") or FINAL), nonce, policy


class Interrupted(Exception):
    """A request ended before its answer: the gate closed or the claim was lost; `failure`:
    its server went down under it (streams/generate/blame.py)."""

    def __init__(self, failure: Failure | None = None):
        super().__init__()
        self.failure = failure


class OnceStage:
    def __init__(
        self,
        stage: GenerateStage,
        ledger: Ledger,
        settings: GenerateSettings,
        client: ServerClient,
        stats: GenerateStats,
        slots: Slots,
        gate: Gate,
    ):
        self.stage = stage
        self.ledger = ledger
        self.settings = settings
        self.client = client
        self.stats = stats
        self.slots = slots
        self.gate = gate
        # this process in claims: unique per worker, even two on one server URL
        self.worker_id = f"{client.base_url}#{uuid.uuid4().hex[:12]}"
        self.claims: WorkQueue = LedgerClaims(
            ledger, stage.outbox, self.worker_id, settings.claim_s, stats
        )
        # work key -> done: a copy of the prompt claims or requests here
        self._running: dict[str, asyncio.Future[None]] = {}
        self.draining = False  # SIGTERM: stolen prompts not requesting stop
        # one suspect, or one request of a server on probation, at a time (blame.py, rules 3, 4)
        self._solo = asyncio.Lock()
        self.refusals = blame.RefusalWatch(gate.refusing)
        # who else could take a prompt that failed here (blame.py, rule 1)
        self.peers = blame.Peers(ledger, self.worker_id, client.base_url, settings.claim_s)
        self.recorder = Recorder(stage, ledger, self.claims, client.base_url)

    def settings_key(self, regen: str, policy: Policy | None = None) -> str:
        """The ledger's settings of a prompt: what the worker sends for it (its own settings,
        overridden by the prompt's recipe), hashed as `draftgen audit` hashes a completion's."""
        sampling = effective_sampling(self.settings.sampling.as_dict(), policy)
        thinking = effective_thinking(self.settings.thinking, policy)
        return settings_hash(self.client.model, sampling, thinking, regen)

    def work_of(self, key: bytes, value: bytes) -> Work:
        regen, nonce, policy = prompt_mode(value)
        return Work(key.decode("utf-8", "replace"), self.settings_key(regen, policy), nonce)

    def spoken_for(self, prompt_id: str, value: bytes) -> bool:
        """Settled, held by another worker's claim, refused by this server, or a suspect while
        one runs here (blame.py): not for a thief now."""
        work = self.work_of(prompt_id.encode(), value)
        return (
            self.claims.settled(work)
            or self.claims.held_elsewhere(work) is not None
            or self._for_another(work)
            or (self._solo.locked() and blame.suspect(self.ledger.failures(work.key)))
        )

    def _for_another(self, work: Work) -> bool:
        return self.peers.for_another(self.ledger.failures(work.key))

    def requesting(self, key: bytes | None, raw: bytes) -> bool:
        return key is not None and self.work_of(key, raw).key in self._running

    async def handle(
        self, key: bytes | None, raw: bytes, owned: Owned, poisoned: str | None = None
    ) -> None:
        if poisoned is not None or not key:
            await self.stage.handle(key, raw, owned, poisoned)
            return

        async def generate_and_record() -> list[Output]:
            await self.generate_and_record(key, raw, owned)
            return []  # already sent, in order, before the ledger learnt of the prompt

        await self.stage.guarded(key, raw, owned, generate_and_record)

    async def stolen(self, key: bytes, value: bytes) -> bool:
        """One prompt taken from another worker's backlog: true if it completed here."""
        try:
            completed = await self.generate_and_record(
                key, value, lambda: not self.draining, stolen=True
            )
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("a stolen prompt failed; its owner will generate it")
            return False
        if completed:
            self.stats.stolen += 1
        return completed

    async def generate_and_record(
        self, key: bytes, value: bytes, owned: Owned, stolen: bool = False
    ) -> bool:
        """The loop of the module's docstring; true if it completed the prompt here. `owned()`
        false: the prompt is no longer this worker's to wait for (revoked, or a draining
        thief's); `stolen`: another worker's prompt, never waited for."""
        await self.ledger.caught_up.wait()
        work = self.work_of(key, value)
        waited = False
        while True:
            while (running := self._running.get(work.key)) is not None:
                await asyncio.shield(running)
            if self.claims.settled(work):
                if not stolen:
                    self.stats.skipped += 1
                return False
            if not owned():
                return False
            if self.claims.held_elsewhere(work) is not None:
                if stolen:
                    return False
                if not waited:
                    self.stats.awaited += 1
                    waited = True
                await self.claims.until_changed(work)
                continue
            if self._for_another(work):
                if stolen:
                    return False
                with contextlib.suppress(TimeoutError):  # until news, or nobody else is left
                    await asyncio.wait_for(self.ledger.watch(work.key).wait(), self.peers.lone_s)
                continue
            # a suspect, or any request of a server on probation: one at a time (blame.py)
            solo = self.refusals.on_probation or blame.suspect(self.ledger.failures(work.key))
            if solo and stolen and self._solo.locked():
                return False
            async with self._solo if solo else contextlib.nullcontext():
                completed = await self._in_slot(key, value, work, owned, stolen)
            if completed is not None:
                return completed

    async def _in_slot(
        self, key: bytes, value: bytes, work: Work, owned: Owned, stolen: bool
    ) -> bool | None:
        """The claimed request in a request slot; None: look again."""
        if not await slot_or_news(self.slots, self.ledger, work, own=not stolen):
            return None  # news of the prompt first: look again
        try:
            if work.key in self._running or not owned():
                return None
            return await self._claimed_request(key, value, work)
        finally:
            self.slots.release()

    async def _claimed_request(self, key: bytes, value: bytes, work: Work) -> bool | None:
        """Claim, request, then record (deliver, mark, release): whether it completed; None
        when the claim was not won or the request ended early (the caller looks again)."""
        done = asyncio.get_running_loop().create_future()
        self._running[work.key] = done
        ticket: Held | None = None
        failure: Failure | None = None
        try:
            ticket = await self.claims.take(work)
            if ticket is None:
                return None
            if not self.gate.is_open:  # it closed while we claimed: not held while it is
                return None
            try:
                outputs = await self._request(ticket, key, value)
                self.refusals.answered()
            except Interrupted as stop:
                if stop.failure is None:
                    return None  # the claim was lost, or the server refuses the key
                failure = stop.failure
            except Refused as refused:
                failure = Failure(self.client.base_url, refused.error.kind, time.time())
                self.refusals.refused(refused.error.kind)
            if failure is not None:
                letter = self._blamed(work, value, failure, await self.peers.alone_now())
                if letter is None:
                    return None  # released with the failure: for another server
                outputs = [letter]
            held, ticket = ticket, None  # released by the recording, whatever happens here
            return await self.recorder.record(held, work, value, outputs, failure)
        finally:
            try:
                if ticket is not None:
                    await ticket.release(None, failure)
            finally:  # also when cancelled while releasing (the worker stops)
                del self._running[work.key]
                done.set_result(None)

    def _blamed(self, work: Work, value: bytes, failure: Failure, alone: bool) -> Letter | None:
        """The prompt's dead letter when its failures, with this one, are its own fault
        (streams/generate/blame.py); None: it goes back to be tried by another server."""
        blamed = blame.verdict((*self.ledger.failures(work.key), failure), alone)
        if blamed is None:
            log.info(
                "%s failed on %s (%s): next server", work.prompt_id, failure.server, failure.kind
            )
            return None
        return self.stage.dead_letter(*blamed, value, work.prompt_id)

    async def _request(self, ticket: Held, key: bytes, value: bytes) -> list[Output]:
        """The prompt's outputs, unless the gate closes or the claim is lost first."""

        async def still_held() -> None:
            if not await ticket.current():
                raise Interrupted

        request = asyncio.ensure_future(self.stage.outputs(key, value, still_held, True))
        lost = asyncio.ensure_future(ticket.lost.wait())
        closed = asyncio.ensure_future(self.gate.wait_closed())
        try:
            await asyncio.wait([request, lost, closed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for end in (lost, closed):
                end.cancel()
            if not request.done():
                request.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await request
        if request.cancelled():
            if closed.done() and not closed.cancelled() and self.gate.crashed():
                raise Interrupted(Failure(self.client.base_url, CRASH, time.time()))
            raise Interrupted
        return request.result()

    async def finish_requests(self, seconds: float) -> None:
        """SIGTERM: stolen prompts not requesting stop; wait up to `seconds` for the requests
        running here to end (a closed gate ends them at once), then release what is left."""
        self.draining = True
        running = list(self._running.values())
        if running:
            log.info("finishing %d requests (for up to %.0f s)", len(running), seconds)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while running and (left := deadline - loop.time()) > 0:
            await asyncio.wait(running, timeout=left)
            running = [f for f in self._running.values() if not f.done()]
        if self.claims.holding():
            log.warning(
                "%d requests still running: their claims are released, others take them",
                self.claims.holding(),
            )
            await self.claims.release_all(RELEASE_S)

    async def recorded(self, timeout: float) -> None:
        """The worker stops: outcomes being recorded are written first (Kafka writes only)."""
        await self.recorder.finished(timeout)

    def stop(self) -> None:
        self.claims.stop()


async def slot_or_news(slots: Slots, ledger: Ledger, work: Work, own: bool) -> bool:
    """A request slot (true), or the ledger's next record of the work first (false)."""
    slot = asyncio.ensure_future(slots.acquire(own))
    news = asyncio.ensure_future(ledger.watch(work.key).wait())
    try:
        await asyncio.wait({slot, news}, return_when=asyncio.FIRST_COMPLETED)
        news.cancel()
        if not slot.done():
            slot.cancel()  # a slot granted as it is cancelled is given back by `acquire`
            await asyncio.wait([slot])
    except BaseException:  # cancelled (revoked, or the worker stops): keep no slot
        news.cancel()
        slot.cancel()
        if slot.done() and not slot.cancelled() and slot.exception() is None:
            slots.release()
        raise
    return not slot.cancelled() and slot.exception() is None
