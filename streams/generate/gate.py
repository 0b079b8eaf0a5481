"""The server gate: whether a generate worker may send requests to its server now.

Open: requests go. Held: no new request starts (`wait_open`: no slot, so no claim) but the
running ones go on: the server is slow to answer its health probe, as a busy one is (SGLang's
`/health_generate` answers once the scheduler has produced output since the probe began, so a
server whose every slot is busy answers late or 503), or it refuses every request for good
(`refusing`). Closed: the server is down, hung or refuses the API key; requests under a claim
end (`wait_closed`, streams/generate/once.py) and their prompts go to other servers.

A request that finds the server failing asks the probe (`pause`): slow holds the gate, refused
closes it. The watchdog (`watch`) probes while the gate is open and requests run; a failed probe
holds the gate, and then one task probes, backing off but never more than `health_interval_s`
apart, until the server answers and accepts the key, which opens it. Running requests end only
when the server refuses connections (or the key) on REFUSED_PROBES probes in a row, or when it
makes no progress while its probe fails: no request finished (`stats.completed`) and no probe
answered for `stall_s` (a hung server refuses nothing: SIGSTOP, a hung collective); time with
no request running does not count. One line when the gate closes, one per change of its
reason, one when it opens: a pause never burns a prompt's attempts nor turns prompts into dead
letters.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from streams.core.retry import Backoff, Outage
from streams.generate.client import AUTH, DOWN, SLOW, GenerationError
from streams.generate.ports import ServerClient
from streams.generate.stats import REFUSING, GenerateStats

log = logging.getLogger(__name__)

# a server that fails every request for good takes no new ones for this long, then one: a
# wrong node costs a request a minute, not the fleet's prompts
REFUSING_S = 60.0

# probes in a row that find the server refusing (connections, or the key) before its running
# requests end: one may be a blip
REFUSED_PROBES = 2

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
    def __init__(
        self,
        client: ServerClient,
        stats: GenerateStats,
        probe_backoff: Backoff,
        stall_s: float = math.inf,  # the worker's --health-stall-s
    ):
        self.client = client
        self.stats = stats  # the gate keeps `paused` and `paused_for`; `completed` is progress
        self.probe_backoff = probe_backoff
        self.stall_s = stall_s
        # what the worker knows of its server: one line when it goes, one when it is back
        self.outage = Outage(f"server {client.base_url}", log)
        self._open = asyncio.Event()
        self._closed = asyncio.Event()  # set while the gate is closed after being open
        self._prober: asyncio.Task[None] | None = None
        self._refusal: asyncio.Task[None] | None = None  # the pause of a refusing server
        self._down_since = 0.0  # when it stopped being open
        self._refused = 0  # probes in a row that found the server refusing
        self._progress_at = time.monotonic()  # a request finished or a probe answered
        self._completed = stats.completed

    def open(self) -> None:
        """The server answered (at start, or its probe): requests may go."""
        self._closed.clear()
        self._refused = 0
        self._progress_at = time.monotonic()
        self._open.set()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    async def wait_open(self) -> None:
        await self._open.wait()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def pause(self, reason: str = DOWN) -> None:
        """Until the server is healthy again and accepts the API key: the gate held while it is
        only slow (a busy server), else closed."""
        if reason == SLOW:
            self.hold()
        else:
            self.shut(reason)
        await self._open.wait()

    def hold(self) -> None:
        """No new request until the server answers its probe; the running ones go on."""
        if self.is_open:
            self._open.clear()
            self._down_since = time.monotonic()
            log.debug("server %s slow to answer its probe: no new requests", self.client.base_url)
        self._probe()

    def shut(self, reason: str = DOWN) -> None:
        """Close the gate (unless closed already): running requests end; probe until healthy."""
        if not self._closed.is_set():
            self._open.clear()
            self._closed.set()
            self._pause_for(reason)
            self._down_since = time.monotonic()
        self._probe()

    def _probe(self) -> None:
        """One task probes the server while the gate is not open."""
        if self._prober is None or self._prober.done():
            self._prober = asyncio.create_task(self._probe_until_healthy())

    async def watch(self, every_s: float, busy: Callable[[], bool]) -> None:
        """While the gate is open and `busy()` (requests run), probe the server every `every_s`
        (each probe has its own timeout); one that fails holds or closes the gate (`_failed`)."""
        while True:
            await asyncio.sleep(every_s)
            if not busy():
                self._progress_at = time.monotonic()  # nothing runs, so nothing is stuck
                continue
            if not self.is_open:
                continue
            problem = await self.unavailable()
            if problem is None:
                self._answered()
            elif self.is_open:
                self._failed(problem)

    def _answered(self) -> None:
        self._refused = 0
        self._progress_at = time.monotonic()  # the probe's token is the scheduler's output

    def _failed(self, problem: str) -> None:
        """A failed probe of a gate not closed: it holds, and closes (ending the running
        requests) once the server refused REFUSED_PROBES probes in a row, or made no progress
        for `stall_s`. Only then: closing a busy server's gate would throw its work away."""
        self._refused = 0 if problem == SLOW else self._refused + 1
        url = self.client.base_url
        if self._refused >= REFUSED_PROBES:
            log.warning("server %s refused %d health probes in a row", url, REFUSED_PROBES)
            self.shut(problem)
        elif self._stalled():
            log.warning(
                "server %s finished no request and answered no health probe for %.0f s: hung",
                url,
                self.stall_s,
            )
            self.shut(DOWN)
        else:
            self.hold()

    def _stalled(self) -> bool:
        """No progress for `stall_s` while requests run: none finished, no probe answered."""
        if self.stats.completed != self._completed or not self.stats.in_flight:
            self._completed = self.stats.completed
            self._progress_at = time.monotonic()
        return time.monotonic() - self._progress_at >= self.stall_s

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
        if self._refusal is not None:
            self._refusal.cancel()

    def crashed(self) -> bool:
        """Closed because the server went down or stopped answering, not for its key: each
        request the closing ended counts as a crash (streams/generate/blame.py)."""
        return self._closed.is_set() and self.stats.paused_for not in (AUTH, REFUSING)

    def refusing(self, kind: str) -> None:
        """The server fails every request for good (blame.py, rule 4): no new requests, the
        running ones go on; after REFUSING_S one request tries again."""
        if self._refusal is not None and not self._refusal.done():
            return
        log.warning(
            "server %s fails every request for good (%s): it takes no new prompts and "
            "dead-letters none; trying it again in %.0f s (check its served model name)",
            self.client.base_url,
            kind,
            REFUSING_S,
        )
        self._open.clear()
        self.stats.paused, self.stats.paused_for, self.stats.refusing = True, REFUSING, True
        self._refusal = asyncio.create_task(self._retry_later())

    async def _retry_later(self) -> None:
        await asyncio.sleep(REFUSING_S)
        self.stats.refusing = False
        if self.stats.paused_for == REFUSING:  # not down or refusing the key meanwhile
            self.stats.paused, self.stats.paused_for = False, ""
        if self._prober is None or self._prober.done():
            self._open.set()

    def _pause_for(self, reason: str) -> None:
        """One line per pause and per change of its reason (down, then a refused key)."""
        if self.stats.paused_for != reason:
            log.warning("%s", pause_line(self.client.base_url, reason))
        self.stats.paused = True
        self.stats.paused_for = reason

    async def _probe_until_healthy(self) -> None:
        attempt = 0
        while (problem := await self.unavailable()) is not None:
            if not self._closed.is_set():
                self._failed(problem)  # held: it may have to close now
            if self._closed.is_set():
                self._pause_for(DOWN if problem == SLOW else problem)
            attempt += 1
            await self.probe_backoff.sleep(attempt)
        self._answered()
        if not self._closed.is_set():  # held: nothing was paused
            log.debug("server %s answers its probe: new requests go", self.client.base_url)
            if not self.stats.refusing:  # a refusing server's pause opens it (`refusing`)
                self.open()
            return
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
