"""The one way tests wait: poll an observable condition until a deadline, never sleep a guess.

    wait_for(lambda: topic_size(kafka) >= 20, 120, "20 completions")
    await wait_for_async(lambda: running(emu, 1), 5, "the first request running")

A condition returns something truthy when it holds; that value is returned, so a test can use
what it waited for. On timeout the test fails with what was awaited (`what` may be a callable,
evaluated only then, to show the last state seen). Errors from the condition propagate unless
listed in `ignore` (a broker that is restarting refuses connections for a while); the last one
ignored is shown in the failure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

What = str | Callable[[], str]


def _failure(timeout: float, what: What, error: BaseException | None) -> AssertionError:
    text = what() if callable(what) else what
    last = f" (last error: {type(error).__name__}: {error})" if error is not None else ""
    return AssertionError(f"timed out after {timeout:g}s waiting for {text}{last}")


def wait_for(
    condition: Callable[[], T],
    timeout: float,
    what: What,
    *,
    interval: float = 0.2,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call `condition` every `interval` seconds until it returns a truthy value."""
    deadline = time.monotonic() + timeout
    error: BaseException | None = None
    while True:
        try:
            value = condition()
        except ignore as err:
            error = err
        else:
            if value:
                return value
        if time.monotonic() >= deadline:
            raise _failure(timeout, what, error)
        time.sleep(interval)


async def wait_for_async(
    condition: Callable[[], Awaitable[T]],
    timeout: float,
    what: What,
    *,
    interval: float = 0.01,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """`wait_for` inside an event loop: the loop keeps running what is being waited for."""
    deadline = time.monotonic() + timeout
    error: BaseException | None = None
    while True:
        try:
            value = await condition()
        except ignore as err:
            error = err
        else:
            if value:
                return value
        if time.monotonic() >= deadline:
            raise _failure(timeout, what, error)
        await asyncio.sleep(interval)
