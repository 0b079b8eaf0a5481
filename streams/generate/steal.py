"""Work stealing: a generate worker with free slots, a healthy server and nothing of its own to
put in them takes prompts from other workers' backlogs.

Kafka gives each partition to one member of the group, so a partition's backlog would wait for
its owner while other servers sit idle: at the end of every finite run (uneven partitions,
uneven output lengths), all along with a slow server, and while a server is down or hung (its
worker claims nothing then: streams/generate/slots.py). A worker that has had a free slot and no
prompt of its own for `steal_after_s` reads the group's committed offsets, picks a partition of
another worker (at random, a larger backlog more likely), reads as many prompts as it has free
slots (at most `steal_batch`) from the end of that backlog down to its committed offset, and
starts those that are neither settled nor claimed; each slot freed later can take more. Every
request is claimed before it starts (streams/generate/claims.py), owners' too, so a thief never
takes a prompt that runs elsewhere, and a prompt two workers reach at once goes to the one whose
claim the ledger orders first. Nothing is acked or committed for a stolen prompt: the owner still
consumes it in order, finds its outcome in the ledger and acks it without a request. Taking from
the end leaves the owner the prompts it reaches first.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Protocol

from streams.core import retry
from streams.core.retry import Outage
from streams.core.settings import OnceSettings
from streams.generate.ports import Backlogs

log = logging.getLogger(__name__)


class Thief(Protocol):
    """What a stealer asks of its worker (streams/generate/worker.py)."""

    @property
    def concurrency(self) -> int: ...
    @property
    def last_busy(self) -> float:
        """When a prompt of its own last came or went to a slot."""
        ...

    async def ready_to_steal(self) -> None: ...
    async def wait_idle(self, seconds: float) -> None: ...
    def free_slots(self) -> int: ...
    def spoken_for(self, prompt_id: str, value: bytes) -> bool:
        """Settled, or claimed by another worker."""
        ...

    def start_stolen(self, records: list[tuple[bytes, bytes]]) -> list[asyncio.Task[bool]]: ...


class Sleeper(Protocol):
    async def sleep(self, attempt: int) -> None: ...


class Stealer:
    def __init__(
        self,
        thief: Thief,
        backlogs: Backlogs,
        once: OnceSettings,
        owned: Callable[[], set[int]],
        backoff: Sleeper | None = None,
    ):
        self.thief = thief
        self.backlogs = backlogs
        self.once = once
        self.owned = owned
        # between two looks at the backlogs that found nothing to take (or failed): each look
        # is an admin call; short enough that a worker idle since long still joins the end of
        # a run within a couple of seconds
        self.backoff: Sleeper = backoff or retry.backoff("steal")
        self.idle_s = once.steal_after_s
        # a broker outage fails every look: one line when the looks start failing, one when
        # they work again (and a reminder a minute), not a line a look
        self.failing = Outage("stealing", log, words=("failing", "works again"))
        # offsets this worker took already, by partition (those below the committed offset
        # are forgotten)
        self._taken: dict[int, set[int]] = {}
        self._stopped = False

    def stop(self) -> None:
        """No more stealing: the worker drains (SIGTERM). What was stolen runs to its end."""
        self._stopped = True

    @property
    def batch(self) -> int:
        # the worker's concurrency is known only once it started (--concurrency auto)
        return self.once.steal_batch or self.thief.concurrency

    async def run(self) -> None:
        try:
            await self.thief.ready_to_steal()
            empty_handed = 0
            while not self._stopped:
                busy_at = self.thief.last_busy
                await self.thief.wait_idle(self.idle_s)
                if self.thief.last_busy != busy_at:
                    empty_handed = 0  # it had work of its own since: a fresh start
                try:
                    took = await self.steal_once() is not None
                except asyncio.CancelledError:
                    raise
                except Exception as err:  # stealing is an optimisation: never fatal
                    self.failing.failed(err)
                    took = False
                else:
                    self.failing.succeeded()
                if took:
                    empty_handed = 0
                else:
                    empty_handed += 1
                    await self.backoff.sleep(empty_handed)
        finally:
            await self.backlogs.close()

    async def steal_once(self) -> int | None:
        """Take prompts from the end of someone's backlog, as many as this worker has free
        slots (at most `batch`), and start them; returns how many were started, None if there
        was nothing left to take (or stealing was stopped)."""
        if self._stopped:
            return None
        committed = await self.backlogs.committed()
        mine = self.owned()
        others = [p for p in committed if p not in mine]
        if not mine or not others:
            # no partition of its own: joining, or in a rebalance, when what is someone
            # else's is not known yet (a lone worker restarting would take its own backlog)
            return None
        ends = await self.backlogs.ends(others)
        sizes: dict[int, int] = {}
        for partition in others:
            taken = self._taken.setdefault(partition, set())
            taken.difference_update([o for o in taken if o < committed[partition]])
            low = committed[partition]
            end = ends[partition]
            size = end - low - sum(1 for o in taken if low <= o < end)
            if size > 0:
                sizes[partition] = size
        if not sizes:
            return None
        # a larger backlog ends later: more likely picked (thieves picking at once mostly differ)
        partition = random.choices(list(sizes), weights=list(sizes.values()))[0]
        taken = self._taken[partition]
        wanted = max(1, min(self.batch, self.thief.free_slots()))
        low = committed[partition]
        # from the end: the prompts its owner reaches last, so the least likely to be redone
        offsets = []
        for offset in range(ends[partition] - 1, low - 1, -1):
            if offset not in taken:
                offsets.append(offset)
                if len(offsets) == wanted:
                    break
        taken.update(offsets)
        records = await self.backlogs.read(partition, set(offsets))
        if self._stopped:  # stopped while we looked: a draining worker starts nothing new
            return None
        fresh = [(k, v) for k, v in records if not self.thief.spoken_for(k.decode(), v)]
        if not fresh:
            return 0
        self.thief.start_stolen(fresh)
        log.info(
            "stole %d prompts from partition %d at offsets %d-%d",
            len(fresh),
            partition,
            min(offsets),
            max(offsets),
        )
        return len(fresh)
