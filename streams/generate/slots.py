"""Request slots: the requests a generate worker keeps its server at (`concurrency` of them).

A request takes a slot only once the server's gate is open (streams/generate/gate.py), so a
worker whose server is down holds no slot, and no claim either: its prompts wait without one and
other servers may take them (streams/generate/claims.py). A prompt waiting for another worker's
request holds no slot either. `last_busy` is when a prompt of the worker's own last came or went
to a slot: a stealer takes others' prompts only after it has had a free slot and nothing of its
own to put in it for a while (`idle_for`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from streams.generate.stats import GenerateStats


class Slots:
    def __init__(
        self,
        concurrency: int,
        gate_open: Callable[[], Awaitable[None]],
        stats: GenerateStats,
    ):
        self.concurrency = concurrency
        self.gate_open = gate_open
        self.stats = stats  # `in_flight`: the slots taken
        self.last_busy = time.monotonic()
        self._free = asyncio.Semaphore(concurrency)

    def resize(self, concurrency: int) -> None:
        """Before any slot is taken (the worker's start, --concurrency auto)."""
        self.concurrency = concurrency
        self._free = asyncio.Semaphore(concurrency)

    async def acquire(self, own: bool = True) -> None:
        """A free slot, once the gate is open; `own`: for a prompt of this worker's partitions."""
        await self._free.acquire()
        try:
            await self.gate_open()
        except BaseException:
            self._free.release()
            raise
        self.stats.in_flight += 1
        if own:
            self.last_busy = time.monotonic()

    def release(self) -> None:
        # not "busy": a slot freed can take someone else's prompt at once (`idle_for`)
        self.stats.in_flight -= 1
        self._free.release()

    @asynccontextmanager
    async def held(self, own: bool = True) -> AsyncIterator[None]:
        await self.acquire(own)
        try:
            yield
        finally:
            self.release()

    def free(self) -> int:
        return max(0, self.concurrency - self.stats.in_flight)

    def busy(self) -> bool:
        return self.stats.in_flight > 0

    def idle_for(self) -> float:
        """Seconds this worker has had a free slot and no prompt of its own to put in it (0
        while every slot is taken). Its requests still running do not count: at the end of a
        run they finish one by one, and each slot they free can take someone else's prompt."""
        if self._free.locked():
            return 0.0
        return time.monotonic() - self.last_busy

    async def wait_idle(self, seconds: float) -> None:
        """Return once the worker has had a free slot and no prompt of its own for `seconds`."""
        while (remaining := seconds - self.idle_for()) > 0:
            if self._free.locked():
                await self._free.acquire()  # the next slot freed
                self._free.release()
            else:
                await asyncio.sleep(remaining)
