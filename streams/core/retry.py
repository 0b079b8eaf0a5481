"""The one retry helper: exponential backoff with a cap and jitter.

Every wait-out-an-outage loop of the pipeline (a server that is not up yet, Kafka or S3 down,
a transient HTTP error) goes through `Backoff`; the delays come from `RetrySettings`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 1.0
    max_s: float = 60.0
    # each delay is drawn from [1 - jitter, 1] × the step, so a fleet does not retry in lockstep
    jitter: float = 0.5

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number `attempt` (1 for the first retry)."""
        step = min(self.initial_s * 2 ** max(attempt - 1, 0), self.max_s)
        return step * (1.0 - self.jitter * random.random())

    async def sleep(self, attempt: int) -> None:
        await asyncio.sleep(self.delay(attempt))


async def until_done(
    what: str,
    call: Callable[[], Awaitable[T]],
    backoff: Backoff,
    log: logging.Logger,
) -> T:
    """Await `call()` until it succeeds: an outage is waited out, never a reason to lose work.
    Cancellation goes through; each failure is one warning line with the error's first line."""
    attempt = 0
    while True:
        try:
            return await call()
        except asyncio.CancelledError:
            raise
        except Exception as err:
            attempt += 1
            delay = backoff.delay(attempt)
            log.warning("%s failed (%s); retrying in %.0fs", what, short_error(err), delay)
            await asyncio.sleep(delay)


def short_error(err: BaseException) -> str:
    """`Kind: first line` of an error, bounded: fit for one log line."""
    text = str(err).splitlines()[0][:200] if str(err) else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
