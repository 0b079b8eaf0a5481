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
- A partition moving between two workers while its requests run: the old owner claims them and
  finishes them, the new owner waits (without a request slot) and skips what completed; a
  failure releases the claim (the new owner decides), a killed owner's claim lapses.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest

from streams.core.settings import generate_window
from tests.streams.generate.commit_model import (
    DEAD_LETTER,
    SUCCESS,
    TRANSIENT,
    ConsumerModel,
    settle,
)
from tests.streams.generate.fakes import prompt, run, until

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
        await model.revoke()  # the rebalance: the three requests go on running
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
        model = ConsumerModel(partitions=1, records=8, concurrency=2)
        await model.start_worker()
        model.assign([0])
        room = generate_window(2)
        for _ in range(room + 1):  # the window is full: offset `room` waits in the agent
            model.deliver(0)
        await settle()
        await model.revoke()  # the prompts not requesting leave the window: room for it...
        await settle()
        model.client.end(0, SUCCESS)  # offset 0's request
        model.client.end(0, DEAD_LETTER)  # offset 1's: its claim's holder decides
        await settle()
        assert model.client.requests == ["p0-0", "p0-1"]  # the stale offset never ran
        assert model.worker.stats.refused == 1  # ...which its lease refuses
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


# -- a partition moving between two workers while its requests run ----------------------------


async def handed_over(model: ConsumerModel, records: int = 2) -> None:
    """Worker 0 requests the partition's `records` prompts; a rebalance moves the partition
    to worker 1, which is handed the same offsets again."""
    await model.start_all()
    model.assign([0], member=0)
    for _ in range(records):
        model.deliver(0)
    await settle()
    assert sorted(model.client.requests) == [f"p0-{o}" for o in range(records)]
    await model.revoke()  # worker 0's requests go on, claimed before the handler returns
    model.assign([0], member=1)
    for _ in range(records):
        model.deliver(0)
    await settle()


def test_the_new_owner_waits_for_the_old_owners_request_and_skips_it() -> None:
    async def scenario() -> None:
        model = ConsumerModel(partitions=1, records=2, concurrency=4, members=2)
        await handed_over(model)
        new = model.member(1)
        assert new.client.requests == []  # claimed: not asked again
        assert new.worker.stats.awaited == 2 and new.worker.stats.in_flight == 0  # no slot
        while model.client.pending:
            model.client.end(0, SUCCESS)
            await settle()
        assert new.client.requests == []
        assert new.worker.stats.skipped == 2
        assert model.completions() == ["p0-0", "p0-1"]  # each generated once
        assert model.kafka.acked() == [0, 1]  # acked as done by the new owner
        model.commit()
        assert model.partitions[0].committed == 2
        assert model.ledger is not None and model.ledger.claims == {}  # released
        await model.close()

    run(scenario)


@pytest.mark.parametrize("old_copy", [DEAD_LETTER, TRANSIENT])
def test_an_old_owners_request_that_fails_ends_under_its_claim_and_the_holder_decides(
    old_copy: str,
) -> None:
    """The old owner holds the claim, so it decides: it dead-letters a permanent failure and
    retries a transient one; the new owner never asks its server, and acks the outcome."""

    async def scenario() -> None:
        model = ConsumerModel(partitions=1, records=1, concurrency=4, members=2)
        await handed_over(model, records=1)
        new = model.member(1)
        assert new.client.requests == []
        model.client.end(0, old_copy)
        await settle()
        if old_copy == TRANSIENT:
            assert model.client.requests == ["p0-0", "p0-0"]  # retried by the holder
            model.client.end(0, SUCCESS)
            await settle()
        assert new.client.requests == []
        outcomes = (model.completions(), model.letters())
        assert outcomes == (([], ["p0-0"]) if old_copy == DEAD_LETTER else (["p0-0"], []))
        assert model.kafka.acked() == [0] and new.worker.stats.skipped == 1
        await model.close()

    run(scenario)


def test_a_killed_old_owners_claims_lapse_and_the_new_owner_asks() -> None:
    async def scenario() -> None:
        model = ConsumerModel(partitions=1, records=1, concurrency=4, members=2, claim_s=0.05)
        await handed_over(model, records=1)
        new = model.member(1)
        assert new.client.requests == []
        await model.crash(0)  # kill -9: its claim is renewed no more
        await until(lambda: new.client.requests == ["p0-0"], "the lapsed claim's prompt asked")
        new.client.end(0, SUCCESS)
        await settle()
        assert model.completions() == ["p0-0"] and model.kafka.acked() == [0]
        await model.close()

    run(scenario)


def test_a_live_old_owner_renews_its_claim_past_its_first_deadline() -> None:
    async def scenario() -> None:
        model = ConsumerModel(partitions=1, records=1, concurrency=4, members=2, claim_s=0.05)
        await handed_over(model, records=1)
        ledger, once = model.ledger, model.worker.once
        assert ledger is not None and once is not None
        settings = once.settings_key("final")
        first = ledger.claim("p0-0", settings)
        assert first is not None

        def renewed() -> bool:
            claim = ledger.claim("p0-0", settings)
            return claim is not None and claim.until > first.until + 0.05

        await until(renewed, "the claim renewed past its first deadline")
        assert model.member(1).client.requests == []  # still waiting
        model.client.end(0, SUCCESS)
        await settle()
        assert model.member(1).client.requests == [] and model.completions() == ["p0-0"]
        await model.close()

    run(scenario)


def test_a_claimed_prompt_holds_no_slot_and_later_prompts_go_on_acked_in_order() -> None:
    async def scenario() -> None:
        model = ConsumerModel(partitions=1, records=3, concurrency=1, members=2)
        await handed_over(model, records=1)  # offset 0: claimed by worker 0
        new = model.member(1)
        model.deliver(0)  # offset 1: nobody's claim
        model.deliver(0)  # offset 2
        await settle()
        assert new.client.requests == ["p0-1"]  # its one slot is not held by the wait
        new.client.end(0, SUCCESS)
        await settle()
        assert new.client.requests == ["p0-1", "p0-2"]
        new.client.end(0, SUCCESS)
        await settle()
        assert model.kafka.acked() == []  # offset 0 still waits: nothing acked past it
        model.client.end(0, SUCCESS)
        await settle()
        assert model.kafka.acked() == [0, 1, 2]
        assert sorted(model.completions()) == ["p0-0", "p0-1", "p0-2"]
        await model.close()

    run(scenario)


def test_a_worker_given_its_own_claimed_prompt_back_waits_for_its_request() -> None:
    async def scenario() -> None:
        model = ConsumerModel(partitions=1, records=1, concurrency=4)
        await model.start_worker()
        model.assign([0])
        model.deliver(0)
        await settle()
        await model.revoke()
        model.assign([0])  # back to the same worker: its own claim, its own copy in flight
        model.deliver(0)
        await settle()
        assert model.client.requests == ["p0-0"]
        model.client.end(0, SUCCESS)
        await settle()
        assert model.client.requests == ["p0-0"] and model.completions() == ["p0-0"]
        assert model.kafka.acked() == [0]
        await model.close()

    run(scenario)


def test_a_sigterm_drain_waits_for_the_requests_then_releases_what_still_runs() -> None:
    async def scenario() -> None:
        model = ConsumerModel(partitions=1, records=2, concurrency=4)
        await model.start_worker()
        model.assign([0])
        model.deliver(0)
        model.deliver(0)
        await settle()
        await model.revoke()  # what `drain` does before it leaves the group
        finishing = asyncio.ensure_future(model.worker.finish_requests(5))
        await settle()
        assert not finishing.done()
        model.client.end(0, SUCCESS)
        await settle()
        assert not finishing.done()  # one still runs
        model.client.end(0, DEAD_LETTER)  # its claim's holder decides: a dead letter
        await asyncio.wait_for(finishing, 5)
        assert model.completions() == ["p0-0"] and model.letters() == ["p0-1"]
        assert model.ledger is not None and model.ledger.claims == {}
        cut = ConsumerModel(partitions=1, records=1, concurrency=4)
        await cut.start_worker()
        cut.assign([0])
        cut.deliver(0)
        await settle()
        await cut.revoke()
        await cut.worker.finish_requests(0.01)  # the drain's bound: returns with it running
        # ...and releases its claim, so another worker takes the prompt now, not at the lapse
        assert cut.client.pending and cut.ledger is not None and cut.ledger.claims == {}
        await cut.close()
        await model.close()

    run(scenario)


def test_a_stolen_prompt_is_claimed_and_its_owner_waits_for_the_thief() -> None:
    async def scenario() -> None:
        model = ConsumerModel(partitions=1, records=2, concurrency=4, members=2)
        await model.start_all()
        model.assign([0], member=0)
        thief = model.member(1)
        pid = "p0-1"
        stealing = asyncio.ensure_future(thief.worker.run_stolen([(pid.encode(), prompt(pid))]))
        await settle()
        assert thief.client.requests == [pid]
        model.deliver(0)
        model.deliver(0)  # the owner reaches the stolen offset while the thief generates it
        await settle()
        assert model.client.requests == ["p0-0"]  # not p0-1: claimed by the thief
        assert model.worker.stats.awaited == 1
        thief.client.end(0, SUCCESS)
        assert await asyncio.wait_for(stealing, 5) == 1
        model.client.end(0, SUCCESS)
        await settle()
        assert sorted(model.completions()) == ["p0-0", "p0-1"]  # each generated once
        assert model.kafka.acked() == [0, 1] and model.worker.stats.skipped == 1
        await model.close()

    run(scenario)
