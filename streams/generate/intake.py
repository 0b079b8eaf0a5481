"""The intake of a generate worker: the in-flight window, ordered acks, revocation.

Each consumed prompt is admitted by its partition's lease (streams/core/leases.py: the lease the
event was delivered under, judged before any wait), enters the in-flight window under that
lease, and is handed to the stage in a task of its own. The window is bounded (`room`: the
worker's concurrency plus its prefetch), not by request slots: a prompt waits for a slot, or for
another worker's claim, inside the stage (streams/generate/once.py), so a worker whose server is
down keeps reading its partitions and acks what other workers complete for it, while the prompts
themselves are free for any server with a free slot (streams/generate/claims.py). A prompt's
offset is acked (and so committed) only after its outcome is delivered, and only in offset order
within its lease (streams/generate/inflight.py). A revoked partition's lease ends: its prompts'
offsets are no longer ours to ack; those not requesting are dropped at once, and a request that
runs finishes under its claim, which the new owner waits for.
"""

from __future__ import annotations

import asyncio
import logging
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

    def requesting(self, key: bytes | None, raw: bytes) -> bool:
        """Whether this prompt's request runs here now (under a claim: it finishes on revoke)."""
        ...


class Intake:
    def __init__(
        self,
        stage: PromptStage,
        room: int,
        stats: GenerateStats,
        guard: PoisonCheck | None = None,
    ):
        self.stage = stage
        self.stats = stats
        self.guard = guard
        self.leases = Leases()
        self.window: InFlightWindow[Lease, Event] = InFlightWindow()
        # set once the worker started: its server answered, its concurrency is known
        self.ready = asyncio.Event()
        self._room = asyncio.Semaphore(room)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._of_event: dict[int, asyncio.Task[Any]] = {}  # id(event) -> its task

    def resize(self, room: int) -> None:
        """Before `ready` only: nothing is in the window yet."""
        self._room = asyncio.Semaphore(room)

    async def submit(self, event: Event) -> None:
        """Take one prompt: waits for room in the window, then starts it (unless its lease
        refuses it: delivered before a revocation, again, or past a hole)."""
        message = event.message
        lease = self.leases.lease(message.tp)  # as delivered, before any wait
        await self.ready.wait()
        await self._room.acquire()
        try:
            verdict = await self.leases.admit(lease, message.offset)
        except BaseException:
            self._room.release()
            raise
        if verdict is not Verdict.ADMIT:
            self._room.release()
            self.stats.refused += 1
            return  # unacked: its partition's current owner has (or will have) it
        poisoned = None
        if self.guard is not None:
            poisoned = self.guard.poisoned(message.tp.topic, message.tp.partition, message.offset)
        self.window.add(lease, message.offset, event)
        task = self._spawn(self._run_one(lease, event, poisoned))
        self._of_event[id(event)] = task

    async def _run_one(self, lease: Lease, event: Event, poisoned: str | None) -> None:
        offset = event.message.offset

        def owned() -> bool:
            return self.leases.holds(lease)

        key, raw = (bytes(event.key) if event.key else None), bytes(event.value)
        try:
            await self.stage.handle(key, raw, owned, poisoned)
        finally:
            self._room.release()
            self._of_event.pop(id(event), None)
        for done_offset, releasable in self.window.finish(lease, offset):
            self.leases.acked(lease, done_offset)  # raises on an ack out of order: a bug
            releasable.ack()

    async def revoke(self, partitions: Iterable[Any]) -> None:
        """End the partitions' leases: their prompts not requesting here are dropped (the new
        owner has them); a request running finishes under its claim."""
        dropped = self.window.forget(self.leases.revoke(partitions))
        running = 0
        for event in dropped:
            key, raw = (bytes(event.key) if event.key else None), bytes(event.value)
            if self.stage.requesting(key, raw):
                running += 1
            elif (task := self._of_event.get(id(event))) is not None:
                task.cancel()
        if dropped:
            log.info(
                "partitions revoked with %d prompts in flight (%d requests finish here)",
                len(dropped),
                running,
            )

    def start_extra(self, jobs: list[Callable[[], Awaitable[bool]]]) -> list[asyncio.Task[bool]]:
        """Start work that is not a consumed prompt (stolen prompts): neither in the window nor
        acked; each job takes its own request slot. Returns their tasks."""
        return [self._spawn(job()) for job in jobs]

    def _spawn(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
