"""tests/polling.py: what the tests' waits promise."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.polling import wait_for, wait_for_async


def test_returns_the_first_truthy_value() -> None:
    counter = itertools.count()
    assert wait_for(lambda: next(counter) >= 3 and "done", 5, "three polls", interval=0) == "done"


def test_fails_saying_what_was_awaited_with_the_last_state() -> None:
    seen = []

    def never() -> bool:
        seen.append(len(seen))
        return False

    with pytest.raises(AssertionError, match=r"after 0.05s waiting for the thing; polls: \d+"):
        wait_for(never, 0.05, lambda: f"the thing; polls: {len(seen)}", interval=0.01)
    assert len(seen) >= 2, "polled until the deadline, then once more"


def test_errors_propagate_unless_ignored() -> None:
    def refuses() -> bool:
        raise ConnectionRefusedError("broker down")

    with pytest.raises(ConnectionRefusedError):
        wait_for(refuses, 5, "never")
    with pytest.raises(AssertionError, match="last error: ConnectionRefusedError: broker down"):
        wait_for(refuses, 0.05, "the broker", interval=0.01, ignore=(OSError,))


def test_async_keeps_the_loop_running() -> None:
    async def scenario() -> str:
        done = asyncio.Event()
        asyncio.get_running_loop().call_later(0.02, done.set)

        async def is_set() -> bool:
            return done.is_set()

        assert await wait_for_async(is_set, 5, "the event")
        with pytest.raises(AssertionError, match="waiting for nothing"):
            await wait_for_async(lambda: asyncio.sleep(0, result=False), 0.03, "nothing")
        return "ok"

    assert asyncio.run(scenario()) == "ok"
