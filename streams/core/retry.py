"""The one retry helper: exponential backoff with a cap and jitter.

Every wait-out-an-outage loop of the pipeline (a server that is not up yet, Kafka or S3 down,
a transient HTTP error) goes through `Backoff`; `backoff(kind)` builds one from
`RetrySettings` (DRAFTGEN_RETRY_*), so the delays are set in one place.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, TypeVar

from streams.core.outage import Outage, short_error

if TYPE_CHECKING:
    from streams.core.settings.policy import BackoffKind, RetrySettings

__all__ = ["Backoff", "Outage", "backoff", "short_error", "until_done"]

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 1.0
    max_s: float = 60.0
    # each delay is drawn from [1 - jitter, 1] × the step, so a fleet does not retry in lockstep
    jitter: float = 0.5

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number `attempt` (1 for the first retry)."""
        # the exponent capped: a float overflows at 2**1024 (a server down for half an hour)
        step = min(self.initial_s * 2 ** min(max(attempt - 1, 0), 64), self.max_s)
        return step * (1.0 - self.jitter * random.random())

    async def sleep(self, attempt: int) -> None:
        await asyncio.sleep(self.delay(attempt))


def backoff(kind: BackoffKind = "outage", settings: RetrySettings | None = None) -> Backoff:
    """The backoff of a loop of this kind: an outage, a poll with a deadline of its own, the
    ledger's reads, a thief's next steal (RetrySettings says each one's delays)."""
    retry = settings or _retry_settings()
    initial_s, max_s = retry.delays(kind)
    return Backoff(initial_s=initial_s, max_s=max_s, jitter=retry.jitter)


@cache
def _retry_settings() -> RetrySettings:
    from streams.core.settings.policy import RetrySettings

    return RetrySettings()


async def until_done(
    what: str,
    call: Callable[[], Awaitable[T]],
    backoff: Backoff,
    log: logging.Logger,
    outage: Outage | None = None,
) -> T:
    """Await `call()` until it succeeds: an outage is waited out, never a reason to lose work.
    Cancellation goes through. The failures are reported to `outage` (what the call depends
    on: "broker unreachable since T" once, "reconnected after N s" once), or else as "`what`
    failing since T" and "`what` succeeded after N s": a few lines, whatever the attempts."""
    attempt = 0
    report = outage or Outage(what, log, words=("failing", "succeeded"))
    while True:
        started = time.monotonic()
        try:
            result = await call()
        except asyncio.CancelledError:
            raise
        except Exception as err:
            attempt += 1
            report.failed(err, time.monotonic() - started)
            log.debug("%s failed (%s); retry %d", what, short_error(err), attempt)
            await backoff.sleep(attempt)
            continue
        report.succeeded()
        return result
