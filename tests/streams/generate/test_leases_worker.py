"""The two suspects of the prompt lost when generate workers joined (docs/failures.md), settled
on the real worker over a model of faust's consumer (commit_model.py).

- In the worker: a partition revoked while its requests run, given back, and its offsets
  delivered again while the revoked copies still run; the copies end in every order and every
  way (success, dead letter, transient failures to the end, a crash). Nothing is committed past
  a prompt without an outcome, and a revoked copy's end never acks the new copy's offset.
- At the consumer: the first offset handled after an assignment is the group's committed
  offset; a record not delivered (between the commit and the fetch, or later) is fetched again,
  never committed past.
- The interleaving the property test found before leases: an event the agent held across a
  rebalance, acked after it, committed past a prompt whose only request died with the revocation.
"""

from __future__ import annotations

import itertools

import pytest

from tests.streams.generate.commit_model import (
    DEAD_LETTER,
    SUCCESS,
    TRANSIENT,
    ConsumerModel,
    settle,
)
from tests.streams.generate.fakes import run

CRASH = "crash"


async def end_all(model: ConsumerModel, prompt_id: str, outcome: str) -> None:
    """End every request of the prompt now pending (a transient failure is retried: end those
    too, until the attempts are spent)."""
    for _ in range(5):
        pending = [i for i, r in enumerate(model.client.pending) if r.prompt_id == prompt_id]
        if not pending:
            return
        model.client.end(pending[0], outcome)
        await settle()


@pytest.mark.parametrize("ledger", [True, False], ids=["ledger", "no-ledger"])
@pytest.mark.parametrize(
    ("old_copy", "new_copy", "old_first"),
    [
        (old, new, first)
        for old, new in itertools.product(
            (SUCCESS, DEAD_LETTER, TRANSIENT), (SUCCESS, DEAD_LETTER, TRANSIENT, CRASH)
        )
        for first in (True, False)
    ],
)
def test_a_revoked_copy_and_the_redelivered_copy_end_in_any_order(
    old_copy: str, new_copy: str, old_first: bool, ledger: bool
) -> None:
    async def scenario() -> None:
        model = ConsumerModel(partitions=1, records=3, concurrency=4, ledger=ledger)
        await model.start_worker()
        model.assign([0])
        for _ in range(3):
            model.deliver(0)
        await settle()
        assert sorted(model.client.requests) == ["p0-0", "p0-1", "p0-2"]
        model.revoke()  # the rebalance: the three requests go on running
        model.assign([0])  # ... and the partition comes back: offsets 0-2 again
        for _ in range(3):
            model.deliver(0)
        await settle()
        model.client.requests.clear()
        old = [r for r in model.client.pending]  # the revoked copies, still running

        async def end_old() -> None:
            for request in old:
                if request in model.client.pending:
                    model.client.pending.remove(request)
                    request.answer.set_result(old_copy)
            await settle()
            for pid in ("p0-0", "p0-1", "p0-2"):  # their retries, if transient
                if old_copy == TRANSIENT:
                    await end_all(model, pid, TRANSIENT)

        async def end_new() -> None:
            if new_copy == CRASH:
                await model.crash()
                return
            for pid in ("p0-0", "p0-1", "p0-2"):
                await end_all(model, pid, new_copy)

        for step in (end_old, end_new) if old_first else (end_new, end_old):
            await step()
            model.commit()
            assert model.committed_without_outcome() == []
        if new_copy != CRASH:
            while model.client.pending:  # what still runs (retries of either copy) succeeds
                model.client.end(0, SUCCESS)
                await settle()
            model.commit()
            # every prompt ended one way or another, and the commit reached the end
            assert model.partitions[0].committed == 3
            assert model.outcomes() >= {"p0-0", "p0-1", "p0-2"}
        await model.close()

    run(scenario)


def test_an_event_held_across_a_rebalance_is_not_acked_after_it() -> None:
    """The property test's counterexample against the code before leases."""

    async def scenario() -> None:
        model = ConsumerModel(partitions=1, records=6, concurrency=2)
        await model.start_worker()
        model.assign([0])
        for _ in range(3):  # two slots: offset 2 waits in the agent for one
            model.deliver(0)
        await settle()
        model.revoke()
        model.client.end(0, SUCCESS)  # offset 0's request: a slot frees; offset 2 is stale
        await settle()
        model.client.end(0, DEAD_LETTER)  # offset 1: not ours, so no dead letter from here
        await settle()
        assert model.client.requests == ["p0-0", "p0-1"]  # the stale offset 2 never ran
        assert model.worker.stats.refused == 1
        assert model.partitions[0].acked == []  # before leases: [2], committed below
        model.assign([0])
        await settle()
        model.commit()
        assert model.partitions[0].committed == 0
        assert model.committed_without_outcome() == []
        await model.close()

    run(scenario)


def test_the_first_offset_after_an_assignment_is_the_committed_one() -> None:
    async def scenario() -> None:
        model = ConsumerModel(partitions=1, records=4, concurrency=4)
        await model.start_worker()
        model.partitions[0].committed = 1  # offset 0 is done: the group resumes at 1
        model.assign([0])
        model.deliver(0, skip=1)  # the fetcher hands over 2: offset 1 lost on the way
        await settle()
        assert model.seeks == [(0, 1)]  # sought back to the committed offset
        assert model.client.requests == []  # and nothing of the refused 2 was requested
        model.deliver(0)  # 1, then 2, 3 again, in order
        model.deliver(0)
        model.deliver(0)
        await settle()
        assert model.client.requests == ["p0-1", "p0-2", "p0-3"]
        while model.client.pending:
            model.client.end(0, SUCCESS)
            await settle()
        model.commit()
        assert model.partitions[0].committed == 4
        await model.close()

    run(scenario)


def test_a_record_lost_mid_lease_is_fetched_again_never_committed_past() -> None:
    async def scenario() -> None:
        model = ConsumerModel(partitions=1, records=5, concurrency=4)
        await model.start_worker()
        model.assign([0])
        model.deliver(0)  # 0
        model.deliver(0, skip=1)  # 2: offset 1 lost on the way
        await settle()
        assert model.seeks == [(0, 1)]
        assert model.client.requests == ["p0-0"]
        model.client.end(0, SUCCESS)
        await settle()
        model.commit()
        assert model.partitions[0].committed == 1  # not past the lost offset
        for _ in range(4):
            model.deliver(0)  # 1, 2, 3, 4
        await settle()
        while model.client.pending:
            model.client.end(0, SUCCESS)
            await settle()
        model.commit()
        assert model.partitions[0].committed == 5
        assert model.committed_without_outcome() == []
        await model.close()

    run(scenario)


def test_a_refused_event_frees_its_slot() -> None:
    async def scenario() -> None:
        model = ConsumerModel(partitions=1, records=6, concurrency=1)
        await model.start_worker()
        model.assign([0])
        model.deliver(0, skip=2)  # refused (a gap): its slot must come back
        await settle()
        model.deliver(0)  # offset 0, after the seek
        await settle()
        assert model.client.requests == ["p0-0"]
        await model.close()

    run(scenario)
