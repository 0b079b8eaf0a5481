"""The server gate: whether a generate worker may send requests to its server now.

Closed while the server is down, hung or refuses the API key. The first request that finds it so
closes the gate (`pause`), and so does the watchdog (`watch`), which probes the server while the
gate is open, so that a server that stopped answering without closing its connections (a hung
collective, SIGSTOP) is noticed although no request fails. One task then probes the server,
backing off but never more than `health_interval_s` apart, and opens the gate once it answers and
accepts the key; every other request only waits for the gate. Requests under a claim end when
the gate closes (`wait_closed`, streams/generate/once.py), so their prompts go to other servers.
One line when the gate closes, one per change of its reason, one when it opens: a pause never
burns a prompt's attempts nor turns prompts into dead letters.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from streams.core.retry import Backoff, Outage
from streams.generate.client import AUTH, DOWN, GenerationError
from streams.generate.ports import ServerClient
from streams.generate.stats import GenerateStats

log = logging.getLogger(__name__)

T = TypeVar("T")


def pause_line(server: str, reason: str) -> str:
    """The one line a pause gets: what is wrong and what to fix (never the key itself)."""
    if reason == AUTH:
        return (
            f"server {server} refuses the API key (HTTP 401/403); pausing until it accepts "
            "it: set DRAFTGEN_API_KEY (or OPENAI_API_KEY) to the server's --api-key"
        )
    return f"server {server} is down; pausing until it is healthy"


class ServerGate:
    def __init__(self, client: ServerClient, stats: GenerateStats, probe_backoff: Backoff):
        self.client = client
        self.stats = stats  # the gate keeps `paused` and `paused_for`
        self.probe_backoff = probe_backoff
        # what the worker knows of its server: one line when it goes, one when it is back
        self.outage = Outage(f"server {client.base_url}", log)
        self._open = asyncio.Event()
        self._closed = asyncio.Event()  # set while the gate is closed after being open
        self._prober: asyncio.Task[None] | None = None
        self._down_since = 0.0

    def open(self) -> None:
        """The server answered at start: requests may go."""
        self._closed.clear()
        self._open.set()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    async def wait_open(self) -> None:
        await self._open.wait()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def pause(self, reason: str = DOWN) -> None:
        """Close the gate until the server is healthy again and accepts the API key."""
        self.shut(reason)
        await self._open.wait()

    def shut(self, reason: str = DOWN) -> None:
        """Close the gate (unless closed already) and probe until the server is healthy."""
        if self._prober is None or self._prober.done():
            self._open.clear()
            self._closed.set()
            self._pause_for(reason)
            self._down_since = time.monotonic()
            self._prober = asyncio.create_task(self._probe_until_healthy())

    async def watch(self, every_s: float, busy: Callable[[], bool], misses: int = 2) -> None:
        """While the gate is open and `busy()` (requests run), probe the server every `every_s`:
        one that fails `misses` probes in a row (each has its own timeout) closes the gate. Not
        one: closing it ends every request running, so a slow answer must not do it."""
        failed = 0
        while True:
            await asyncio.sleep(every_s)
            if not self.is_open or not busy():
                failed = 0
                continue
            problem = await self.unavailable()
            failed = failed + 1 if problem is not None else 0
            if problem is not None and failed >= misses and self.is_open:
                log.warning("server %s stopped answering its health probe", self.client.base_url)
                self.shut(problem)

    def authorized(self, call: Callable[[], Awaitable[T]]) -> Callable[[], Awaitable[T]]:
        """`call`, except that a refused API key pauses (one line, as for requests) until the
        server accepts it, then calls again: at start too the key is the operator's to fix,
        not a server "unreachable"."""

        async def attempt() -> T:
            while True:
                try:
                    return await call()
                except GenerationError as err:
                    if not err.auth:
                        raise
                await self.pause(AUTH)

        return attempt

    async def unavailable(self) -> str | None:
        """None when the server is healthy, else why not; a probe that fails is an answer."""
        try:
            return await self.client.unavailable()
        except asyncio.CancelledError:
            raise
        except Exception:  # a probe that fails is an answer: not healthy yet
            return DOWN

    def close(self) -> None:
        if self._prober:
            self._prober.cancel()

    def _pause_for(self, reason: str) -> None:
        """One line per pause and per change of its reason (down, then a refused key)."""
        if self.stats.paused_for != reason:
            log.warning("%s", pause_line(self.client.base_url, reason))
        self.stats.paused = True
        self.stats.paused_for = reason

    async def _probe_until_healthy(self) -> None:
        attempt = 0
        while (problem := await self.unavailable()) is not None:
            self._pause_for(problem)
            attempt += 1
            await self.probe_backoff.sleep(attempt)
        log.warning(
            "server %s is healthy again%s; resuming after %.0f s %s",
            self.client.base_url,
            " and accepts the API key" if self.stats.paused_for == AUTH else "",
            time.monotonic() - self._down_since,
            "paused" if self.stats.paused_for == AUTH else "down",
        )
        self.stats.paused = False
        self.stats.paused_for = ""
        self.open()
