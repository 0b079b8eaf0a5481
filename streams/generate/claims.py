"""Who requests a prompt: the generate stage's work-distribution rules, in one place.

The invariant, enforced here:

    a prompt is requested only by the worker holding its claim, and one worker holds it at a
    time; so no prompt runs on two servers at once, except after its holder was killed -9 or
    stalled past its claim (the claim lapsed), and then the late one's request ends as soon as
    it reads the ledger again.

The rules (the ledger's side is `Claim` and `LedgerState.take` in streams/core/ledger.py):
1. Every request is claimed by its requester before it starts: the partition's owner, a thief
   (streams/generate/steal.py) and a revoked partition's old owner alike, and `--regenerate`
   prompts too (under their publish's own work key).
2. One holder. A prompt's claims share one key of the `generated` ledger, so Kafka orders them
   and every reader applies the same rule in that order. A claimant writes its claim, then
   reads the ledger back to it (`take`): it holds the prompt only if its own record won and
   has not lapsed since it was written (its expiry is counted from before the write, so a
   write that waited out a broker outage is not trusted).
3. A claim is renewed (every third of `claim_s`, by the same rule) only while its request can
   run: the caller ends the request when the server's gate closes, releasing the claim at once,
   and a renewal that loses (the claim had lapsed and another worker took the prompt) or an
   outcome read from elsewhere ends it too (`Ticket.lost`). Before each request a claim past
   due for renewal (a stalled process) is renewed and read back first (`Ticket.current`).
4. A release carries the outcome, written to the ledger before it: a reader that sees the
   prompt free knows how it ended, whatever partition its outcome key landed on.

Stealing then needs no margin: any prompt that is not settled and not held may be taken by a
worker with a free slot, and a prompt held by another worker is waited for without a slot.
The generate stage sees these rules through `WorkQueue` only, so another queue (a serving
engine's own) can replace the ledger's.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from streams.core.ledger import Claim, Failure, claim_key, work_key
from streams.generate.outputs import LedgerMark, Outbox
from streams.generate.ports import Ledger
from streams.generate.stats import GenerateStats

log = logging.getLogger(__name__)

# seconds a claimant waits to read its own claim back (a ledger reader far behind): then it is
# LATE, as one read back after its expiry
ECHO_S = 30.0


class Echo(enum.Enum):
    """A claim read back: it won and holds; it lost to another's; or it is LATE: read back
    after its expiry (or not in time), when a later claim of another worker may beat it unseen
    yet. A new claim that is late takes nothing; a renewal that is late is written again."""

    WON = "won"
    LOST = "lost"
    LATE = "late"


@dataclass(frozen=True)
class Work:
    """A prompt to request under some generation settings (`nonce`: a --regenerate publish)."""

    prompt_id: str
    settings: str
    nonce: str = ""

    @property
    def key(self) -> str:
        return work_key(self.prompt_id, self.settings, self.nonce)


class Held(Protocol):
    """A prompt this worker may request now; `lost` is set when it no longer may."""

    @property
    def lost(self) -> asyncio.Event: ...

    async def current(self) -> bool:
        """Whether the request may be sent now (called before each request)."""
        ...

    async def release(self, outcome: str | None = None, failure: Failure | None = None) -> None:
        """The request ended: with its outcome (DONE, DEAD_LETTER; already recorded) or
        without (the prompt is free for any worker); `failure`: why, for the ledger."""
        ...


class WorkQueue(Protocol):
    """Who requests a prompt: the rules of this module's docstring (`LedgerClaims`)."""

    def settled(self, work: Work) -> bool:
        """Whether the work has its outcome."""
        ...

    def held_elsewhere(self, work: Work) -> Claim | None:
        """Another worker's claim that holds the work now."""
        ...

    async def take(self, work: Work) -> Held | None:
        """The work for a request here, or None (settled, or another worker holds it)."""
        ...

    async def until_changed(self, work: Work) -> None:
        """Until news of the work (its outcome, a release), or its holder's claim lapses."""
        ...

    def holding(self) -> int:
        """Claims held here."""
        ...

    async def release_all(self, timeout: float) -> None: ...
    def stop(self) -> None: ...


class Ticket:
    """A claim this worker holds: renewed until released; `lost` is set when the ledger says it
    is no longer ours (another worker took it after it lapsed) or the work got its outcome
    elsewhere: the request must end."""

    def __init__(self, claims: LedgerClaims, work: Work, claim: Claim):
        self.claims = claims
        self.work = work
        self.until = claim.until
        self.lost = asyncio.Event()
        self._renewing = asyncio.create_task(self._renew())
        self._watching = asyncio.create_task(self._watch())

    async def _renew(self) -> None:
        every = self.claims.claim_s / 3
        while True:
            await asyncio.sleep(every)
            if not await self._renewed():
                return

    async def _renewed(self) -> bool:
        """Write the claim again and read it back; false (and `lost` set) when another worker
        took the prompt after the claim lapsed."""
        claim, echo = await self.claims.write(self.work)
        while echo is Echo.LATE:  # a broker outage, a stall: again, now
            claim, echo = await self.claims.write(self.work)
        if echo is Echo.LOST:
            log.warning(
                "the claim of %s lapsed and another worker took it: its request here ends",
                self.work.prompt_id,
            )
            self.lost.set()
            return False
        self.until = max(self.until, claim.until)
        return True

    async def current(self) -> bool:
        """Whether this worker may send the prompt's request now. A claim past due for its
        renewal (the process stalled: SIGSTOP, a suspended VM) may have lapsed and been taken
        by another worker whose claim is not read here yet: it is renewed and read back first,
        so a stalled worker does not send a request that another server already runs."""
        if self.lost.is_set():
            return False
        if self.until - self.claims.clock() > self.claims.claim_s / 3:
            return True
        if not await self._renewed():
            return False
        if self.claims.settled(self.work):  # finished elsewhere while the claim had lapsed
            self.lost.set()
            return False
        return True

    async def _watch(self) -> None:
        ledger, key = self.claims.ledger, self.work.key
        while True:
            await ledger.watch(key).wait()
            holder = ledger.holder(key)
            theirs = holder is not None and holder.worker != self.claims.worker
            if theirs or ledger.settled(key):
                self.lost.set()
                return

    async def release(self, outcome: str | None = None, failure: Failure | None = None) -> None:
        """The request ended: with `outcome` (DONE, DEAD_LETTER; already in the ledger), or
        without (the prompt is free for any worker); `failure` is recorded with the others."""
        self._stop()
        self.claims.held.pop(self.work.key, None)
        now = self.claims.clock()
        failures = self.claims.failures(self.work, failure)
        released = Claim(self.claims.worker, now, True, now, outcome, failures)
        await self.claims.send(self.work, released)

    def _stop(self) -> None:
        self._renewing.cancel()
        self._watching.cancel()


class LedgerClaims:
    """The work queue on the `generated` ledger (a `WorkQueue`)."""

    def __init__(
        self,
        ledger: Ledger,
        outbox: Outbox,
        worker: str,
        claim_s: float,
        stats: GenerateStats,
        clock: Callable[[], float] | None = None,
    ):
        self.ledger = ledger
        self.outbox = outbox
        self.worker = worker  # this process in claims: unique per worker
        self.claim_s = claim_s
        self.stats = stats
        # the broker's time, not this host's (claims of hosts whose clocks disagree compare on
        # it: streams/core/ledger.py `Claim`); looked up at each call: tests move it
        self.clock = clock or (lambda: self.ledger.now())
        self.held: dict[str, Ticket] = {}  # work key -> the claim held here

    def settled(self, work: Work) -> bool:
        return self.ledger.settled(work.key)

    def held_elsewhere(self, work: Work) -> Claim | None:
        """Another worker's claim that holds the work now."""
        holder = self.ledger.holder(work.key)
        if holder is None or holder.worker == self.worker or not holder.holds(self.clock()):
            return None
        return holder

    async def take(self, work: Work) -> Ticket | None:
        """Claim the work for a request here: a ticket once the claim is read back and won;
        None when the work is settled or another worker holds it."""
        if self.settled(work) or self.held_elsewhere(work) is not None:
            return None
        claim, echo = await self.write(work)
        if echo is not Echo.WON:
            return None
        if self.settled(work):  # an outcome read with our claim: nothing to request
            await self.send(work, Claim(self.worker, claim.at, released=True, at=claim.at))
            return None
        ticket = Ticket(self, work, claim)
        self.held[work.key] = ticket
        self.stats.claimed += 1
        return ticket

    async def until_changed(self, work: Work) -> None:
        """Until the next record of the work is read, or its holder's claim lapses."""
        holder = self.ledger.holder(work.key)
        timeout = 0.0 if holder is None else max(0.0, holder.until - self.clock())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ledger.watch(work.key).wait(), timeout)

    def holding(self) -> int:
        return len(self.held)

    def failures(self, work: Work, new: Failure | None = None) -> tuple[Failure, ...]:
        """The work's failures, with `new`: every claim record carries them all."""
        known = self.ledger.failures(work.key)
        return known if new is None else (*known, new)

    async def write(self, work: Work) -> tuple[Claim, Echo]:
        """Write a claim (or a renewal) and read it back: the claim, and how it came back."""
        now = self.clock()
        claim = Claim(self.worker, now + self.claim_s, at=now, failures=self.failures(work))
        echo = self.ledger.expect(work.key, claim)
        try:
            await self.send(work, claim)
            won = await asyncio.wait_for(asyncio.shield(echo), ECHO_S)
        except TimeoutError:
            log.warning("a claim of %s not read back within %.0f s", work.prompt_id, ECHO_S)
            return claim, Echo.LATE
        finally:
            self.ledger.forget(work.key, claim)
        if not won:
            return claim, Echo.LOST
        # its expiry counts from before the write (which may have waited out an outage)
        return claim, Echo.WON if self.clock() < claim.until else Echo.LATE

    async def send(self, work: Work, claim: Claim) -> None:
        await self.outbox.send(LedgerMark(claim_key(work.key).encode(), claim.encode()))

    async def release_all(self, timeout: float) -> None:
        """Release every claim held here (a drain that ran out of time): the prompts go back
        now rather than when the claims lapse."""
        tickets = list(self.held.values())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                for ticket in tickets:
                    await ticket.release()

    def stop(self) -> None:
        """The worker stops: claims held lapse unrenewed (a drain releases them first)."""
        for ticket in list(self.held.values()):
            ticket._stop()
        self.held.clear()
