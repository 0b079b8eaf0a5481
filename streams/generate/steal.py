"""Work stealing: a generate worker with free slots, a healthy server and nothing of its own to
put in them takes prompts from other workers' backlogs.

Kafka gives each partition to one member of the group, so a partition's backlog would wait for
its owner while other servers sit idle: at the end of every finite run (uneven partitions,
uneven output lengths), all along with a slow server, and while a server is down or hung (its
worker claims nothing then: streams/generate/slots.py). A worker that has had a free slot and no
prompt of its own for `steal_after_s` reads where each partition's backlog starts (the group's
committed offset, or the log's start where nothing is committed yet), picks a partition it does
not own (at random, a larger backlog more likely), reads as many prompts as it has free slots
(at most `steal_batch`) from the end of that backlog down to its start, and starts those that
are neither settled nor claimed; each slot freed later can take more. A worker that owns no
partition (more workers than partitions, one that joined late, a rebalance) steals from all of
them. Every request is claimed before it starts (streams/generate/claims.py), owners' too, so a
thief never takes a prompt that runs elsewhere, and a prompt two workers reach at once goes to
the one whose claim the ledger orders first. A prompt found held by another worker, when looked
at or when a slot came for it, is kept and looked at again at each look until it is settled:
once its holder lets it go without an outcome (its server died), the thief takes it. Nothing is
acked or committed for a stolen prompt: the owner still consumes it in order, finds its outcome
in the ledger and acks it without a request. Taking from the end leaves the owner the prompts it
reaches first.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
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
    def settled(self, prompt_id: str, value: bytes) -> bool:
        """Its outcome is in the ledger."""
        ...

    def spoken_for(self, prompt_id: str, value: bytes) -> bool:
        """Settled, or claimed by another worker."""
        ...

    def start_stolen(self, records: list[tuple[bytes, bytes]]) -> list[asyncio.Task[bool]]: ...


class Sleeper(Protocol):
    async def sleep(self, attempt: int) -> None: ...


@dataclass(frozen=True)
class Looked:
    """A prompt a thief read: its partition, an offset past it (the end of the look that read
    it), and its record."""

    partition: int
    below: int
    key: bytes
    value: bytes

    @property
    def prompt_id(self) -> str:
        return self.key.decode()


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
        # offsets this worker looked at already, by partition (forgotten once committed)
        self._taken: dict[int, set[int]] = {}
        # prompts spoken for but not settled (held by another worker) when looked at, or when
        # a slot came for them: looked at again at each look and taken once free (their
        # holder's server died), forgotten once settled or committed
        self._waiting: list[Looked] = []
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
        """Take prompts, as many as this worker has free slots (at most `batch`), and start
        them: prompts held elsewhere before and free now, else from the end of someone's
        backlog; returns how many were started, None if there was nothing left to take (or
        stealing was stopped)."""
        if self._stopped:
            return None
        starts = await self.backlogs.committed()
        # one that owns no partition takes from all: claims keep it off what runs elsewhere
        mine = self.owned()
        others = [p for p in starts if p not in mine]
        if self._stopped or not others:
            return None
        self._forget(starts)
        wanted = max(1, min(self.batch, self.thief.free_slots()))
        if released := self._released(others, wanted):
            self._start(released)
            log.info("stole %d prompts released by their holders since", len(released))
            return len(released)
        ends = await self.backlogs.ends(others)
        sizes: dict[int, int] = {}
        for partition in others:
            taken = self._taken.setdefault(partition, set())
            low = starts[partition]
            end = ends[partition]
            size = end - low - sum(1 for o in taken if low <= o < end)
            if size > 0:
                sizes[partition] = size
        if not sizes:
            return None
        # a larger backlog ends later: more likely picked (thieves picking at once mostly differ)
        partition = random.choices(list(sizes), weights=list(sizes.values()))[0]
        taken = self._taken[partition]
        low = starts[partition]
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
        looked = [Looked(partition, max(offsets) + 1, k, v) for k, v in records]
        fresh = [p for p in looked if not self.thief.spoken_for(p.prompt_id, p.value)]
        self._waiting += [p for p in looked if self._waits(p)]
        if not fresh:
            return 0
        self._start(fresh)
        log.info(
            "stole %d prompts from partition %d at offsets %d-%d",
            len(fresh),
            partition,
            min(offsets),
            max(offsets),
        )
        return len(fresh)

    def _forget(self, starts: dict[int, int]) -> None:
        """What needs no other look: offsets the owners committed, prompts settled since."""
        for partition, taken in self._taken.items():
            taken.difference_update([o for o in taken if o < starts.get(partition, 0)])

        def gone(p: Looked) -> bool:
            committed = p.below <= starts.get(p.partition, 0)
            return committed or self.thief.settled(p.prompt_id, p.value)

        self._waiting = [p for p in self._waiting if not gone(p)]

    def _released(self, others: list[int], wanted: int) -> list[Looked]:
        """Up to `wanted` waiting prompts of others' backlogs that are free now."""
        released: list[Looked] = []
        kept: list[Looked] = []
        for p in self._waiting:
            free = p.partition in others and not self.thief.spoken_for(p.prompt_id, p.value)
            if free and len(released) < wanted:
                released.append(p)
            else:
                kept.append(p)
        self._waiting = kept
        return released

    def _start(self, prompts: list[Looked]) -> None:
        tasks = self.thief.start_stolen([(p.key, p.value) for p in prompts])
        for prompt, task in zip(prompts, tasks, strict=True):
            task.add_done_callback(functools.partial(self._ended, prompt))

    def _ended(self, prompt: Looked, _: asyncio.Task[bool]) -> None:
        # held elsewhere by the time a slot came for it (its owner claimed it first): it
        # waits like one found held when looked at
        if self._waits(prompt):
            self._waiting.append(prompt)

    def _waits(self, prompt: Looked) -> bool:
        """Not for this thief now, but maybe later: spoken for, not settled."""
        pid, value = prompt.prompt_id, prompt.value
        return self.thief.spoken_for(pid, value) and not self.thief.settled(pid, value)
