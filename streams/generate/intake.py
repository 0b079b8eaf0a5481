"""The intake of a generate worker: request slots, the in-flight window, ordered acks, revocation.

Each consumed prompt takes a slot (`concurrency` of them: the requests the server is kept at),
is admitted by its partition's lease (streams/core/leases.py: the lease the event was delivered
under, judged before any wait), enters the in-flight window under that lease, and is handed to
the stage in a task of its own, so a slow request never blocks the others and a freed slot is
refilled at once. A prompt's offset is acked (and so committed) only after the stage has
delivered its outputs, and only in offset order within its lease (streams/generate/inflight.py).
A revoked partition's lease ends: its prompts' outputs are no longer ours to dead-letter
(`owned()`), nor their offsets ours to ack; a copy delivered again under a new lease is a new
entry, which the old copy's end cannot touch. The requests still running for it are claimed
(`PromptStage.claim`) before the revocation returns, and finished for the new owner; a prompt
that another worker claimed so waits for that claim without a request slot (`claimed`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from streams.core.events import Event
from streams.core.leases import Lease, Leases, Verdict
from streams.generate.inflight import InFlightWindow
from streams.generate.ports import PoisonCheck
from streams.generate.stats import GenerateStats

log = logging.getLogger(__name__)


class PromptStage(Protocol):
    """What the intake hands each prompt to (streams/generate/stage.py, once.py)."""

    async def handle(
        self,
        key: bytes | None,
        raw: bytes,
        owned: Callable[[], bool],
        poisoned: str | None = None,
    ) -> None:
        """Generate and deliver; never raises but for cancellation."""
        ...

    async def claim(self, records: Iterable[tuple[bytes | None, bytes]]) -> None:
        """Make durable that the requests of these prompts (revoked, in flight) run on here."""
        ...

    async def claimed(self, key: bytes | None, raw: bytes) -> bool:
        """Whether another worker is finishing this prompt's request."""
        ...

    async def until_unclaimed(self, key: bytes, raw: bytes) -> None: ...


class Intake:
    def __init__(
        self,
        stage: PromptStage,
        concurrency: int,
        stats: GenerateStats,
        gate_open: Callable[[], Awaitable[None]],
        guard: PoisonCheck | None = None,
    ):
        self.stage = stage
        self.concurrency = concurrency
        self.stats = stats
        self.gate_open = gate_open
        self.guard = guard
        self.leases = Leases()
        self.window: InFlightWindow[Lease, Event] = InFlightWindow()
        # set once the worker started: its server answered, its concurrency is known
        self.ready = asyncio.Event()
        # when a prompt of its own last came or went to a slot (for stealing: `idle_for`)
        self.last_busy = time.monotonic()
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[Any]] = set()

    def resize(self, concurrency: int) -> None:
        """Before `ready` only: nothing holds a slot yet."""
        self.concurrency = concurrency
        self._slots = asyncio.Semaphore(concurrency)

    async def submit(self, event: Event) -> None:
        """Take one prompt: waits for a free slot and an open gate, then starts it (unless its
        lease refuses it: delivered before a revocation, again, or past a hole)."""
        message = event.message
        lease = self.leases.lease(message.tp)  # as delivered, before any wait
        self.last_busy = time.monotonic()
        await self.ready.wait()
        await self._slots.acquire()
        try:
            await self.gate_open()
            verdict = await self.leases.admit(lease, message.offset)
        except BaseException:
            self._slots.release()
            raise
        if verdict is not Verdict.ADMIT:
            self._slots.release()
            self.stats.refused += 1
            return  # unacked: its partition's current owner has (or will have) it
        poisoned = None
        if self.guard is not None:
            poisoned = self.guard.poisoned(message.tp.topic, message.tp.partition, message.offset)
        self.window.add(lease, message.offset, event)
        self.stats.in_flight += 1
        self._spawn(self._run_one(lease, event, poisoned))
        self.last_busy = time.monotonic()

    async def _run_one(self, lease: Lease, event: Event, poisoned: str | None) -> None:
        offset = event.message.offset

        def owned() -> bool:
            return self.leases.holds(lease)

        key, raw = (bytes(event.key) if event.key else None), bytes(event.value)
        held = True
        try:
            if key and poisoned is None and await self.stage.claimed(key, raw):
                # another worker finishes its request: wait for it without a slot
                held = False
                self.stats.in_flight -= 1
                self._slots.release()
                await self.stage.until_unclaimed(key, raw)
                await self._slots.acquire()
                held = True
                self.stats.in_flight += 1
            await self.stage.handle(key, raw, owned, poisoned)
        finally:
            if held:
                self.stats.in_flight -= 1
                self._slots.release()
        for done_offset, releasable in self.window.finish(lease, offset):
            self.leases.acked(lease, done_offset)  # raises on an ack out of order: a bug
            releasable.ack()

    async def revoke(self, partitions: Iterable[Any]) -> None:
        """End the partitions' leases; claim the prompts still in flight under them (returns
        once the claims are durable, or after a bounded wait)."""
        dropped = self.window.forget(self.leases.revoke(partitions))
        if dropped:
            log.info("partitions revoked with %d prompts in flight", len(dropped))
            records = [(bytes(e.key) if e.key else None, bytes(e.value)) for e in dropped]
            await self.stage.claim(records)

    async def start_extra(
        self, jobs: list[Callable[[], Awaitable[bool]]]
    ) -> list[asyncio.Task[bool]]:
        """Start work that is not a consumed prompt (stolen prompts), each once it has a slot
        (a caller asking for no more than `free_slots()` does not wait); neither in the window
        nor acked. Returns their tasks."""
        await self.gate_open()
        tasks = []
        for job in jobs:
            await self._slots.acquire()
            self.stats.in_flight += 1
            tasks.append(self._spawn(self._in_slot(job)))
        return tasks

    async def _in_slot(self, job: Callable[[], Awaitable[bool]]) -> bool:
        try:
            return await job()
        finally:
            self.stats.in_flight -= 1
            self._slots.release()

    def _spawn(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def free_slots(self) -> int:
        # every request holds a slot (own or extra) while it counts in `in_flight`
        return max(0, self.concurrency - self.stats.in_flight)

    def idle_for(self) -> float:
        """Seconds this worker has had a free slot and no prompt of its own to put in it (0
        while every slot is taken, or a prompt of its own waits for one). Its requests still
        running do not count: at the end of a run they finish one by one, and each slot they
        free can take someone else's prompt at once."""
        if self._slots.locked():
            return 0.0
        return time.monotonic() - self.last_busy

    async def wait_idle(self, seconds: float) -> None:
        """Return once the worker has had a free slot and no prompt of its own for `seconds`:
        awaits a free slot, then a timer to the moment it will have been idle long enough."""
        while (remaining := seconds - self.idle_for()) > 0:
            if self._slots.locked():
                await self._slots.acquire()  # the next slot freed
                self._slots.release()
            else:
                await asyncio.sleep(remaining)

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
