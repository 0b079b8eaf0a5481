"""Work follows free slots (streams/generate/claims.py): every request is claimed by its
requester, one worker holds a prompt at a time, a closed gate gives prompts back at once, and a
claim read back after it lapsed holds nothing. Scenarios on the real workers over the model of
faust's consumer (commit_model.py)."""

from __future__ import annotations

import asyncio
from unittest import mock

import orjson

from streams.core.ledger import DONE, REGENERATE, Claim, claim_key
from streams.core.retry import Backoff
from streams.generate.claims import Echo, LedgerClaims, Ticket, Work
from streams.generate.client import DOWN
from streams.generate.gate import ServerGate
from streams.generate.stats import GenerateStats
from streams.generate.worker import GenerateWorker
from tests.streams.generate.commit_model import SUCCESS, ConsumerModel, ledger_partition, settle
from tests.streams.generate.fakes import (
    FakeClient,
    FakeKafka,
    once_worker,
    prompt,
    run,
    until,
)


def claims_on_a_test_clock(worker: GenerateWorker) -> tuple[LedgerClaims, list[float]]:
    """The worker's claims, their clock the test's to move (`clock[0]`)."""
    assert worker.once is not None
    claims = worker.once.claims
    assert isinstance(claims, LedgerClaims)
    clock = [1_000.0]
    claims.clock = lambda: clock[0]
    return claims, clock


def test_an_owner_claims_its_own_requests_so_a_thief_never_takes_a_running_one() -> None:
    async def scenario() -> None:
        model = ConsumerModel(partitions=1, records=2, concurrency=4, members=2)
        await model.start_all()
        model.assign([0], member=0)
        model.deliver(0)
        await settle()
        assert model.client.requests == ["p0-0"]
        thief = model.member(1)
        [stolen] = thief.worker.start_stolen([(b"p0-0", prompt("p0-0"))])
        assert await stolen is False  # claimed by its owner: not taken
        assert thief.client.requests == [] and thief.worker.stats.claimed == 0
        assert thief.worker.spoken_for("p0-0", prompt("p0-0"))
        model.client.end(0, SUCCESS)
        await settle()
        assert model.completions() == ["p0-0"] and model.kafka.acked() == [0]
        await model.close()

    run(scenario)


def test_a_dead_server_gives_its_prompts_back_and_its_owner_acks_what_others_finish() -> None:
    async def scenario() -> None:
        model = ConsumerModel(partitions=1, records=3, concurrency=4, members=2)
        await model.start_all()
        model.assign([0], member=0)
        for _ in range(3):
            model.deliver(0)
        await settle()
        assert sorted(model.client.requests) == ["p0-0", "p0-1", "p0-2"]
        model.server_down(0)  # its requests fail: the gate closes, the claims are released
        await settle()
        owner, thief = model.member(0), model.member(1)
        assert owner.worker.stats.paused and owner.worker.stats.in_flight == 0
        assert model.ledger is not None and model.ledger.claims == {}  # given back at once
        # each was running when its server went down: a suspect (blame.py), so a thief runs
        # one of them at a time
        records = [(pid.encode(), prompt(pid)) for pid in ("p0-0", "p0-1", "p0-2")]
        stolen = thief.worker.start_stolen(records)
        await settle()
        assert len(thief.client.requests) == 1
        assert [await task for task in stolen[1:]] == [False, False]  # not while one runs
        thief.client.end(0, SUCCESS)
        assert await stolen[0] is True
        for record in records[1:]:
            [task] = thief.worker.start_stolen([record])
            await settle()
            thief.client.end(0, SUCCESS)
            assert await task is True
        assert sorted(thief.client.requests) == ["p0-0", "p0-1", "p0-2"]
        # the owner, its server still down, acks them as their outcomes reach the ledger
        await until(lambda: model.kafka.acked() == [0, 1, 2], "the owner acks them")
        assert model.client.requests == ["p0-0", "p0-1", "p0-2"]  # never asked again
        assert sorted(model.completions()) == ["p0-0", "p0-1", "p0-2"]
        assert owner.worker.stats.skipped == 3
        await model.close()

    run(scenario)


def test_a_hung_server_is_found_by_the_watchdog_and_its_requests_end() -> None:
    """A server that stops answering without closing its connections (SIGSTOP, a hung
    collective): no request fails, but the health probe does, so the gate closes, the request
    ends and its claim goes back; a SIGTERM drain then returns at once."""

    class HungClient(FakeClient):
        hung = False

        async def unavailable(self) -> str | None:
            self.probes += 1
            return DOWN if self.hung else None

    async def scenario() -> None:
        client, kafka = HungClient(), FakeKafka()
        worker, ledger = await once_worker(client, kafka, health_watch_s=0.01)
        client.gates["p"] = asyncio.Event()  # never set: the server hangs
        await worker.submit(kafka.event(0, "p"))
        await until(lambda: client.requests == ["p"], "the request running")
        assert ledger.claims  # claimed before it started
        client.hung = True
        await until(lambda: worker.stats.paused, "the watchdog closed the gate", timeout=10)
        await until(lambda: not ledger.claims, "the claim released")
        assert worker.stats.in_flight == 0 and kafka.acked() == []
        await asyncio.wait_for(worker.finish_requests(1800), 2)  # nothing runs: at once
        await worker.stop()

    run(scenario)


def test_a_claim_read_back_after_it_lapsed_holds_nothing() -> None:
    """A write that waited out a broker outage (or a stalled process): its claim's expiry was
    counted from before the write, so it is not trusted once read back late."""

    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, ledger = await once_worker(client, kafka, concurrency=1)
        claims, clock = claims_on_a_test_clock(worker)
        send = claims.send

        async def slow_send(work: Work, claim: Claim) -> None:
            clock[0] += claims.claim_s + 1  # the write took longer than a claim lasts
            await send(work, claim)

        work = worker.once.work_of(b"p", prompt("p"))
        with mock.patch.object(claims, "send", slow_send):
            claim, won = await claims.write(work)
        assert won is Echo.LATE and claim.until < clock[0]
        assert ledger.holder(work.key) == claim  # it did win the ledger's order: too late
        assert await claims.take(work) is not None  # written in time, it holds
        await worker.stop()

    run(scenario)


def test_a_worker_stalled_between_its_claim_and_its_request_sends_no_request() -> None:
    """SIGSTOP after a claim is won and before its request is sent, past the claim's expiry
    (CI saw it: a stopped worker sent its request on SIGCONT, beside the request of the worker
    that took the lapsed claim). The claim is confirmed before the request: renewed and read
    back, it loses to the other worker's claim, unread here until then, and nothing is sent."""

    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, ledger = await once_worker(client, kafka)
        claims, clock = claims_on_a_test_clock(worker)
        work = worker.once.work_of(b"p", prompt("p"))
        take, send = claims.take, claims.send
        unread: list[tuple[bytes, bytes]] = []  # the other worker's claim, not read here yet
        stalls: list[Ticket | None] = []

        async def stalled_take(work: Work) -> Ticket | None:
            ticket = await take(work)
            stalls.append(ticket)
            clock[0] += claims.claim_s + 1  # stopped past the claim, which another worker took
            other = Claim("other", clock[0] + claims.claim_s, at=clock[0])
            unread.append((claim_key(work.key).encode(), other.encode()))
            return ticket

        async def after_the_unread(work: Work, claim: Claim) -> None:
            while unread:  # written before anything this worker writes now
                ledger.take(*unread.pop())
            await send(work, claim)

        with (
            mock.patch.object(claims, "take", stalled_take),
            mock.patch.object(claims, "send", after_the_unread),
        ):
            await worker.submit(kafka.event(0, "p"))
            await until(lambda: stalls and not unread, "the stalled claim renewed")
            await until(lambda: claims.holding() == 0, "the claim given up")
        holder = ledger.holder(work.key)
        assert holder is not None and holder.worker == "other"
        assert client.requests == []  # not sent: the other worker's server runs it
        done = Claim("other", clock[0], released=True, at=clock[0], outcome=DONE)
        ledger.take(claim_key(work.key).encode(), done.encode())
        await until(lambda: kafka.acked() == [0], "acked once the other worker's outcome is read")
        assert client.requests == [] and worker.stats.skipped == 1
        await worker.stop()

    run(scenario)


def test_a_regenerate_publish_is_claimed_under_its_own_key_and_settled_by_its_outcome() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, ledger = await once_worker(client, kafka)
        assert worker.once is not None
        ledger.add("p", worker.once.settings_key("final"))  # generated before
        record = orjson.loads(prompt("p"))
        record["meta"] = {REGENERATE: True}
        again = orjson.dumps(record)
        await worker.submit(kafka.raw_event(0, b"p", again))
        await worker.submit(kafka.raw_event(1, b"p", again))  # the same publish, redelivered
        await until(lambda: kafka.acked() == [0, 1], "both acked")
        assert client.requests == ["p"]  # generated again, once
        work = worker.once.work_of(b"p", again)
        assert work.nonce and ledger.settled(work.key)
        claims = [Claim.decode(v) for t, k, v in kafka.sent if k.decode().endswith("!claim")]
        assert all(c is not None for c in claims) and len(claims) == 2  # claim, release
        await worker.stop()

    run(scenario)


def test_the_invariant_sees_a_prompt_run_twice_when_claims_do_not_exclude() -> None:
    """The property test's check (commit_model.py `_on_request`) against a ledger that lets
    every claim win: the thief's request of a prompt its owner runs is caught."""

    async def scenario() -> None:
        model = ConsumerModel(partitions=1, records=1, concurrency=4, members=2)
        await model.start_all()
        model.assign([0], member=0)
        model.deliver(0)
        await settle()
        thief = model.member(1)
        with (
            mock.patch.object(Claim, "beats", lambda self, holder: True),
            mock.patch.object(type(thief.worker.once.claims), "held_elsewhere", lambda s, w: None),
        ):
            thief.worker.start_stolen([(b"p0-0", prompt("p0-0"))])
            await settle()
        assert thief.client.requests[0] == "p0-0"
        assert model.overlaps and model.overlaps[0].startswith("p0-0")
        await model.close()

    run(scenario)


def test_a_release_read_before_its_outcome_key_still_settles_the_prompt() -> None:
    """A prompt's claim and outcome keys land on different partitions of the ledger, which a
    reader may read in any order: the release carries the outcome, so a worker that reads the
    release first does not request the prompt again."""

    async def scenario() -> None:
        model = ConsumerModel(partitions=1, records=6, concurrency=4, members=2, lagging=True)
        await model.start_all()
        owner, other = model.member(0), model.member(1)
        assert owner.worker.once is not None and other.ledger is not None
        settings = owner.worker.once.settings_key("final")
        # a prompt whose two keys are on different partitions of the ledger
        pid = next(
            f"p0-{offset}"
            for offset in range(6)
            if ledger_partition(f"p0-{offset}@{settings}!claim".encode())
            != ledger_partition(f"p0-{offset}@{settings}".encode())
        )
        claims_at = ledger_partition(f"{pid}@{settings}!claim".encode())
        outcome_at = ledger_partition(f"{pid}@{settings}".encode())
        record = [(pid.encode(), prompt(pid))]
        first = owner.worker.start_stolen(record)
        await settle()
        model.read_ledger(0, claims_at)  # the owner reads its claim back: it requests
        await settle()
        assert owner.client.requests == [pid]
        owner.client.end(0, SUCCESS)
        await settle()
        assert await first[0] is True
        # the other worker reads only the claims' partition: the release, not the outcome key
        model.read_ledger(1, claims_at)
        assert other.ledger.positions[outcome_at] == 0
        second = other.worker.start_stolen(record)
        await settle()
        model.read_ledger(1, claims_at)
        await settle()
        assert await second[0] is False
        assert other.client.requests == [] and not model.redone
        await model.close()

    run(scenario)


def test_a_renewal_read_back_late_is_written_again_and_its_request_goes_on() -> None:
    """A renewal that waited out a broker outage longer than a claim comes back late: it is
    written again at once, and the request goes on if no other worker took the prompt."""

    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, ledger = await once_worker(client, kafka, claim_s=0.03)
        claims, clock = claims_on_a_test_clock(worker)
        work = worker.once.work_of(b"p", prompt("p"))
        ticket = await claims.take(work)
        assert ticket is not None
        send, outages = claims.send, [1.0]

        async def one_outage(work: Work, claim: Claim) -> None:
            if outages:
                clock[0] += outages.pop()  # this write took a second: past the claim
            await send(work, claim)

        def claims_written() -> int:
            return sum(1 for _, key, _ in kafka.sent if key.endswith(b"!claim"))

        with mock.patch.object(claims, "send", one_outage):
            await until(lambda: claims_written() >= 3, "the late renewal written again")
        holder = ledger.holder(work.key)
        assert not ticket.lost.is_set() and holder is not None
        assert holder.worker == claims.worker and holder.until > clock[0]
        await ticket.release()
        await worker.stop()

    run(scenario)


def test_the_watchdog_closes_the_gate_at_two_refused_probes_in_a_row_not_one() -> None:
    """Closing the gate ends every request running: one refused probe must not do it (a slow
    one only holds the gate: tests/streams/generate/test_gate.py)."""

    class Flaky(FakeClient):
        def __init__(self) -> None:
            super().__init__()
            self.answers: list[str | None] = [DOWN, None, DOWN, DOWN]

        async def unavailable(self) -> str | None:
            self.probes += 1
            return self.answers.pop(0) if self.answers else None

    async def scenario() -> None:
        client = Flaky()
        gate = ServerGate(client, GenerateStats(), Backoff(0.001, 0.002))
        gate.open()
        shut_at: list[int] = []
        shut = gate.shut

        def recording_shut(reason: str = DOWN) -> None:
            shut_at.append(client.probes)
            shut(reason)

        with mock.patch.object(gate, "shut", recording_shut):
            watching = asyncio.create_task(gate.watch(0.001, lambda: True))
            await until(lambda: shut_at, "the gate closed")
            watching.cancel()
        assert shut_at == [4]  # the second miss in a row, not the first miss
        await until(lambda: gate.is_open, "open again once the server answers")
        gate.close()

    run(scenario)
