"""Partition leases (streams/core/leases.py) and the commit guard that uses them
(streams/core/faust_app.py): what a lease admits, how far it lets a partition be committed."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from streams.core import faust_app
from streams.core.faust_app import create_app, guard_commits
from streams.core.leases import HOLE_CHECK_S, LeaseError, Leases, Verdict
from streams.core.settings import KafkaSettings

P0 = TP("prompts", 0)


def connected(committed: int) -> tuple[Leases, list[tuple[Any, int]]]:
    leases, seeks = Leases(), []

    async def start_of(tp: Any) -> int:
        return committed

    async def seek(tp: Any, offset: int) -> None:
        seeks.append((tp, offset))

    leases.connect(start_of, seek)
    return leases, seeks


def test_a_lease_admits_from_the_committed_offset_in_order() -> None:
    async def scenario() -> None:
        leases, seeks = connected(committed=5)
        lease = leases.lease(P0)
        assert await leases.admit(lease, 5) is Verdict.ADMIT
        assert await leases.admit(lease, 5) is Verdict.DUPLICATE
        assert await leases.admit(lease, 4) is Verdict.DUPLICATE  # committed: not ours to redo
        assert await leases.admit(lease, 6) is Verdict.ADMIT
        assert seeks == []
        assert leases.committable(P0, 7) is None  # nothing acked yet: nothing to commit

    asyncio.run(scenario())


def test_a_first_offset_past_the_committed_one_is_refused_and_sought_back() -> None:
    async def scenario() -> None:
        leases, seeks = connected(committed=3)
        lease = leases.lease(P0)
        assert await leases.admit(lease, 4) is Verdict.GAP  # offset 3 was not delivered
        assert await leases.admit(lease, 5) is Verdict.GAP  # still before 3 comes again
        assert seeks == [(P0, 3)]  # once: later records of the same hole wait for it
        assert await leases.admit(lease, 3) is Verdict.ADMIT
        assert await leases.admit(lease, 4) is Verdict.ADMIT

    asyncio.run(scenario())


def test_records_fetched_before_the_seek_are_refused_without_seeking_again() -> None:
    async def scenario() -> None:
        leases, seeks = connected(committed=0)
        lease = leases.lease(P0)
        assert await leases.admit(lease, 0) is Verdict.ADMIT
        for offset in range(2, 40):  # offset 1 lost; the rest were in faust's buffer
            assert await leases.admit(lease, offset) is Verdict.GAP
        assert seeks == [(P0, 1)]  # one seek; nothing admitted over the missing offset
        assert leases.committable(P0, 40) is None
        assert await leases.admit(lease, 1) is Verdict.ADMIT

    asyncio.run(scenario())


def test_a_hole_the_log_has_is_sought_again_one_it_lacks_is_admitted_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    log_first: dict[int, int] = {1: 1}  # the log's first offset at or after a given one

    async def scenario() -> None:
        leases, seeks = Leases(clock=lambda: now[0]), []

        async def start_of(tp: Any) -> int:
            return 0

        async def seek(tp: Any, offset: int) -> None:
            seeks.append(offset)

        async def first_at(tp: Any, offset: int) -> int | None:
            return log_first.get(offset)

        leases.connect(start_of, seek, first_at)
        lease = leases.lease(P0)
        assert await leases.admit(lease, 0) is Verdict.ADMIT
        assert await leases.admit(lease, 3) is Verdict.GAP
        now[0] = HOLE_CHECK_S - 0.1
        assert await leases.admit(lease, 3) is Verdict.GAP  # not looked up yet
        assert seeks == [1]
        now[0] = HOLE_CHECK_S + 0.1
        assert await leases.admit(lease, 3) is Verdict.GAP  # the log has 1: sought again
        assert seeks == [1, 1]
        log_first[1] = 3  # 1 and 2 are gone from the log (say, retention)
        now[0] = 2 * HOLE_CHECK_S + 0.2
        assert await leases.admit(lease, 3) is Verdict.ADMIT
        leases.acked(lease, 0)
        assert leases.committable(P0, 9) == 3  # 1 and 2 are not in the log: nothing to wait for
        leases.acked(lease, 3)
        assert leases.committable(P0, 9) == 4

    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())
    assert any("not in the log" in r.getMessage() for r in caplog.records)


def test_an_event_delivered_before_a_revocation_is_stale_under_every_later_lease() -> None:
    async def scenario() -> None:
        leases, _ = connected(committed=0)
        old = leases.lease(P0)
        assert await leases.admit(old, 0) is Verdict.ADMIT
        leases.revoke([P0])
        new = leases.lease(P0)
        assert new is not old
        assert await leases.admit(old, 1) is Verdict.STALE
        assert not leases.holds(old) and leases.holds(new)
        with pytest.raises(LeaseError, match="after revocation"):
            leases.acked(old, 0)
        assert leases.committable(P0, 1) is None  # the new lease has admitted nothing yet

    asyncio.run(scenario())


def test_a_revocation_while_the_group_is_asked_makes_the_event_stale() -> None:
    async def scenario() -> None:
        leases = Leases()
        asked = asyncio.Event()
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def start_of(tp: Any) -> int:
            asked.set()
            return await answer

        async def seek(tp: Any, offset: int) -> None:
            raise AssertionError("no seek")

        leases.connect(start_of, seek)
        lease = leases.lease(P0)
        admitting = asyncio.ensure_future(leases.admit(lease, 0))
        await asyncio.wait_for(asked.wait(), 5)
        leases.revoke([P0])
        answer.set_result(0)
        assert await admitting is Verdict.STALE

    asyncio.run(scenario())


def test_acks_must_come_in_offset_order() -> None:
    async def scenario() -> None:
        leases, _ = connected(committed=0)
        lease = leases.lease(P0)
        for offset in range(3):
            await leases.admit(lease, offset)
        with pytest.raises(LeaseError, match="ack of offset 1 where 0 is due"):
            leases.acked(lease, 1)
        leases.acked(lease, 0)
        leases.acked(lease, 1)
        assert leases.committable(P0, 3) == 2
        assert leases.committable(P0, 1) == 1  # faust may commit less: never raised

    asyncio.run(scenario())


def test_the_consumer_thread_commits_what_the_guard_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[dict[Any, int]] = []

    async def commit(self: Any, offsets: dict[Any, int]) -> bool:
        sent.append(dict(offsets))
        return True

    monkeypatch.setattr(faust_aiokafka.AIOKafkaConsumerThread, "_commit", commit)
    app = create_app("lease-guard", KafkaSettings(bootstrap="127.0.0.1:9"), prefetch=4)
    thread: Any = app.consumer._thread  # type: ignore[attr-defined]
    assert isinstance(thread, faust_app._RebalanceSafeCommits)
    thread.assignment = lambda: {P0}

    async def scenario() -> tuple[bool, bool]:
        assert await thread._commit({P0: 4})  # no guard yet: faust's offsets as they are
        leases, _ = connected(committed=0)
        guard_commits(app, leases)
        lease = leases.lease(P0)
        await leases.admit(lease, 0)
        refused = await thread._commit({P0: 4})  # nothing acked yet: nothing to commit
        leases.acked(lease, 0)
        return refused, await thread._commit({P0: 4})

    assert asyncio.run(scenario()) == (False, True)
    assert sent == [{P0: 4}, {P0: 1}]


def test_a_lease_outside_the_next_assignment_is_named_for_revocation() -> None:
    leases = Leases()
    p1 = TP("prompts", 1)
    leases.lease(P0)
    leases.lease(p1)  # begun between the revocation and the assignment
    assert leases.not_in({P0}) == [p1]
    leases.revoke(leases.not_in({P0}))
    assert leases.not_in({P0}) == []
    assert leases.committable(p1, 3) is None
