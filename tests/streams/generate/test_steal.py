"""Stealing (streams/generate/steal.py): stolen prompts are claimed, generated and recorded but
never acked; a worker is idle once it has a free slot and nothing of its own; the stealer's loop
and what a thief takes, against fake backlogs: also a worker that owns no partition, and a prompt
found held elsewhere, taken once its holder lets it go."""

from __future__ import annotations

import asyncio
import time

import pytest

from streams.core.ledger import outcome_key
from streams.core.settings import OnceSettings
from streams.generate.client import GenerationError
from streams.generate.stats import generate_figures
from streams.generate.steal import Stealer
from tests.streams.generate.commit_model import SUCCESS, ConsumerModel
from tests.streams.generate.fakes import (
    COMPLETIONS,
    LEDGER,
    FakeBacklogs,
    FakeClient,
    FakeKafka,
    once_worker,
    prompt,
    run,
    settings_key,
    until,
)


def test_stolen_prompts_are_claimed_generated_and_recorded_but_never_acked() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, _ = await once_worker(client, kafka)
        client.always["bad"] = GenerationError("context_too_long", "too long", transient=False)
        records = [(pid.encode(), prompt(pid)) for pid in ("s1", "s2", "bad")]

        assert await worker.run_stolen(records) == 2
        assert sorted(kafka.sent_to(COMPLETIONS)) == ["s1", "s2"]
        marks = kafka.sent_to(LEDGER)
        assert len(kafka.outcomes()) == 3
        # each of the three claimed before its request, released after
        assert len([key for key in marks if not outcome_key(key)]) == 3 * 2
        # the claim's holder decides the outcome: the thief dead-letters what fails for good
        assert [letter.prompt_id for letter in kafka.letters()] == ["bad"]
        assert kafka.acked() == []
        assert worker.stats.stolen == 2 and worker.stats.in_flight == 0
        assert generate_figures(worker.stats).counters["stolen"] == 2
        await worker.stop()

    run(scenario)


def test_an_idle_wait_ends_once_a_slot_is_free_not_after_all_the_work_in_flight() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, _ = await once_worker(client, kafka, concurrency=2)
        client.gates["p0"] = asyncio.Event()
        client.gates["p1"] = asyncio.Event()
        await worker.submit(kafka.event(0, "p0"))
        await worker.submit(kafka.event(1, "p1"))
        await until(lambda: sorted(client.requests) == ["p0", "p1"], "both requests running")
        worker.slots.last_busy = time.monotonic() - 60  # idle long enough, but for the slots

        # no timer runs out during the test: only a slot freed can end it
        waiting = asyncio.create_task(worker.wait_idle(30.0))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not waiting.done() and worker.free_slots() == 0
        client.gates["p0"].set()
        await until(waiting.done, "the idle wait over once one slot is free")
        assert worker.free_slots() == 1 and worker.stats.in_flight == 1  # p1 still runs
        assert worker.slots.idle_for() >= 30.0
        client.gates["p1"].set()
        await until(lambda: kafka.acked() == [0, 1], "both acked")
        await worker.stop()

    run(scenario)


@pytest.mark.parametrize("busy_for", [0.0, 0.05])
def test_an_idle_wait_lasts_until_the_worker_was_idle_that_long(busy_for: float) -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, _ = await once_worker(client, kafka)
        worker.slots.last_busy = time.monotonic() - busy_for
        await worker.wait_idle(0.05)
        assert worker.slots.idle_for() >= 0.05
        await worker.stop()

    run(scenario)


def test_the_stealer_waits_for_idleness_and_backs_off_only_when_nothing_was_taken() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, _ = await once_worker(client, kafka, concurrency=1)
        client.gates["p0"] = asyncio.Event()
        await worker.submit(kafka.event(0, "p0"))
        await until(lambda: client.requests == ["p0"], "its own prompt in its one slot")
        worker.slots.last_busy = time.monotonic() - 60  # idle long enough, but for its one slot

        # None: no chunk to take; 0: a chunk taken but all generated already (here: gone);
        # 1: a prompt started; error: a failure
        script: list[int | Exception | None] = [None, None, RuntimeError("admin"), 0, 1, None]
        looks: list[int] = []
        pauses: list[int] = []

        class ScriptedBacklogs(FakeBacklogs):
            async def committed(self) -> dict[int, int]:
                looks.append(len(pauses))
                self.action = script.pop(0) if script else None
                if isinstance(self.action, Exception):
                    raise self.action
                # its own partition only: nothing to take; else another's, with a backlog
                return {0: 0} if self.action is None else {0: 0, 1: 0}

            async def read(self, partition: int, offsets: set[int]) -> list[tuple[bytes, bytes]]:
                return [] if self.action == 0 else await super().read(partition, offsets)

        class CountingBackoff:
            async def sleep(self, attempt: int) -> None:
                pauses.append(attempt)
                await asyncio.sleep(0)

        backlogs = ScriptedBacklogs({}, {1: 100})
        once = OnceSettings(steal_after_s=1.0)
        stealer = Stealer(worker, backlogs, once, lambda: {0}, CountingBackoff())
        running = asyncio.create_task(stealer.run())
        for _ in range(20):
            await asyncio.sleep(0)
        assert looks == []  # its one slot busy with its own prompt: no stealing

        client.gates["p0"].set()
        await until(lambda: len(pauses) >= 4, "four pauses")
        running.cancel()
        # a failure does not end the loop; a pause grows with each look that took nothing
        # and starts over after one that took a chunk
        assert pauses[:4] == [1, 2, 3, 1]
        assert looks[:6] == [0, 1, 2, 3, 3, 3]
        await until(lambda: backlogs.closed, "the backlogs' clients closed")
        await worker.stop()

    run(scenario)


def test_a_thief_takes_from_the_end_of_a_backlog_no_more_than_its_free_slots() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, ledger = await once_worker(client, kafka, concurrency=3)
        client.gates["own"] = asyncio.Event()
        await worker.submit(kafka.event(0, "own"))
        await until(lambda: client.requests == ["own"], "one slot busy: two free")
        # partition 2: nothing past its committed offset
        backlogs = FakeBacklogs({0: 0, 1: 10, 2: 13}, {0: 50, 1: 30, 2: 13})
        stealer = Stealer(worker, backlogs, OnceSettings(), lambda: {0})
        for pid in ("p1-29", "p1-28", "p1-27"):
            client.gates[pid] = asyncio.Event()

        assert await stealer.steal_once() == 2
        assert backlogs.reads == [(1, {29, 28})]  # the end of p1's backlog, as many as free slots
        await until(lambda: worker.free_slots() == 0, "the stolen prompts in the free slots")
        ledger.add("p1-27", settings_key(worker))  # generated meanwhile elsewhere
        client.gates["p1-29"].set()
        await until(lambda: worker.free_slots() == 1, "a slot freed")
        assert await stealer.steal_once() == 0  # p1-27 taken, but already generated
        assert await stealer.steal_once() == 1  # then the next one from the end
        assert backlogs.reads[1:] == [(1, {27}), (1, {26})]
        for event in client.gates.values():
            event.set()
        await until(lambda: worker.stats.stolen == 3 and worker.stats.in_flight == 0, "done")
        assert sorted(kafka.sent_to(COMPLETIONS)) == ["own", "p1-26", "p1-28", "p1-29"]
        assert kafka.acked() == [0]  # stolen prompts are never acked by the thief
        backlogs.committed_offsets[1] = 30  # the owner caught up
        assert await stealer.steal_once() is None
        await worker.stop()

    run(scenario)


def test_a_draining_worker_steals_no_more_and_finishes_what_it_stole() -> None:
    """SIGTERM: the stealer stops, also in the middle of a look (a prompt read then is not
    started); the drain waits for the stolen request running, and a stolen prompt not yet
    requesting when the drain began is left to its owner."""

    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, _ = await once_worker(client, kafka, concurrency=4)
        looking = asyncio.Event()
        resume = asyncio.Event()

        class SlowBacklogs(FakeBacklogs):
            hold = False

            async def read(self, partition: int, offsets: set[int]) -> list[tuple[bytes, bytes]]:
                if self.hold:
                    looking.set()
                    await resume.wait()
                return await super().read(partition, offsets)

        backlogs = SlowBacklogs({0: 0, 1: 0}, {1: 30})
        stealer = Stealer(worker, backlogs, OnceSettings(steal_batch=1), lambda: {0})
        client.gates["p1-29"] = asyncio.Event()
        assert await stealer.steal_once() == 1  # stolen, its request running
        await until(lambda: client.requests == ["p1-29"], "the stolen request running")
        draining = asyncio.create_task(worker.finish_requests(30))
        backlogs.hold = True
        look = asyncio.create_task(stealer.steal_once())
        await looking.wait()
        stealer.stop()  # the SIGTERM, while the stealer reads another backlog
        resume.set()
        assert await look is None
        assert await stealer.steal_once() is None and len(backlogs.reads) == 2
        # a steal already past its last look when the drain began: not requested
        [late] = worker.start_stolen([(b"late", prompt("late"))])
        assert await late is False
        for _ in range(20):
            await asyncio.sleep(0)
        assert not draining.done()  # p1-29 still runs
        client.gates["p1-29"].set()
        await asyncio.wait_for(draining, 5)
        assert client.requests == ["p1-29"]  # nothing requested after the drain began
        assert kafka.sent_to(COMPLETIONS) == ["p1-29"]
        await worker.stop()

    run(scenario)


def test_looks_failing_through_a_broker_outage_are_one_line_and_one_when_they_work_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, _ = await once_worker(client, kafka, concurrency=1)
        failures = 5

        class DownBroker(FakeBacklogs):
            looks = 0

            async def committed(self) -> dict[int, int]:
                self.looks += 1
                if self.looks <= failures:
                    raise ConnectionError("node 1 not ready")
                return {0: 0}  # back: nothing to take

        class NoPause:
            async def sleep(self, attempt: int) -> None:
                await asyncio.sleep(0)

        backlogs = DownBroker({}, {})
        stealer = Stealer(
            worker, backlogs, OnceSettings(steal_after_s=0.001), lambda: {0}, NoPause()
        )
        worker.slots.last_busy = time.monotonic() - 60
        with caplog.at_level("WARNING", logger="streams.generate.steal"):
            running = asyncio.create_task(stealer.run())
            await until(lambda: backlogs.looks > failures + 1, "a look after they work again")
            running.cancel()
        said = [r.getMessage() for r in caplog.records if r.name == "streams.generate.steal"]
        assert len(said) == 2, said
        assert said[0].startswith("stealing failing since") and "node 1 not ready" in said[0]
        assert said[1] == f"stealing works again after 0 s ({failures} failures)"
        await worker.stop()

    run(scenario)


def test_a_worker_that_owns_no_partition_steals_from_every_backlog() -> None:
    """More workers than partitions, or one that joined late: it has no backlog of its own, yet
    its server's slots take the others' prompts."""

    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, _ = await once_worker(client, kafka, concurrency=2)
        backlogs = FakeBacklogs({0: 0, 1: 5}, {0: 3, 1: 5})  # partition 1: nothing left
        stealer = Stealer(worker, backlogs, OnceSettings(), lambda: set())

        assert await stealer.steal_once() == 2
        assert backlogs.reads == [(0, {1, 2})]
        await until(lambda: worker.stats.stolen == 2, "both generated here")
        assert sorted(kafka.sent_to(COMPLETIONS)) == ["p0-1", "p0-2"]
        await worker.stop()

    run(scenario)


def test_a_prompt_held_elsewhere_when_looked_at_is_taken_once_its_holder_lets_go() -> None:
    """The review's sequence: a thief looks at a backlog while its owner runs one of those
    prompts; then the owner's server dies and gives it back: the thief's next look takes it,
    rather than leaving it to wait for that server."""

    async def scenario() -> None:
        model = ConsumerModel(partitions=2, records=2, concurrency=4, members=2)
        await model.start_all()
        model.assign([0], member=0)
        model.assign([1], member=1)
        model.deliver(0)
        await until(lambda: model.client.requests == ["p0-0"], "its owner runs p0-0")
        thief = model.member(1)
        backlogs = FakeBacklogs({0: 0, 1: 2}, {0: 2, 1: 2})  # the thief's own backlog: empty
        stealer = Stealer(thief.worker, backlogs, OnceSettings(), lambda: {1})

        assert await stealer.steal_once() == 1  # p0-1; p0-0 is held by its owner
        await until(lambda: thief.client.requests == ["p0-1"], "the thief runs p0-1")
        thief.client.end(0, SUCCESS)
        model.server_down(0)  # its request ends and its claim is released
        assert model.ledger is not None
        claims = model.ledger.claims
        await until(lambda: not [w for w in claims if w.startswith("p0-0@")], "p0-0 released")

        assert await stealer.steal_once() == 1
        await until(lambda: thief.client.requests == ["p0-1", "p0-0"], "the thief runs p0-0")
        assert backlogs.reads == [(0, {0, 1})]  # from what it kept, not read again
        thief.client.end(0, SUCCESS)
        model.deliver(0)
        await until(lambda: model.kafka.acked() == [0, 1], "the owner acks both")
        assert sorted(model.completions()) == ["p0-0", "p0-1"]
        assert await stealer.steal_once() is None  # nothing left to look at
        await model.close()

    run(scenario)


def test_a_stolen_prompt_its_owner_claimed_first_is_taken_once_its_owner_lets_go() -> None:
    """Free when the thief looked, but claimed by its owner before the thief's slot came: the
    thief moves on, and takes it at a later look once the owner's dead server released it."""

    async def scenario() -> None:
        model = ConsumerModel(partitions=2, records=1, concurrency=1, members=2)
        await model.start_all()
        model.assign([0], member=0)
        model.assign([1], member=1)
        model.deliver(1)  # the thief's one slot busy with a prompt of its own
        thief = model.member(1)
        await until(lambda: thief.client.requests == ["p1-0"], "the thief's own prompt running")
        backlogs = FakeBacklogs({0: 0, 1: 0}, {0: 1, 1: 1})
        stealer = Stealer(thief.worker, backlogs, OnceSettings(), lambda: {1})

        assert await stealer.steal_once() == 1  # started: it waits for the thief's slot
        model.deliver(0)  # its owner claims it first: the stolen one moves on
        await until(lambda: model.client.requests == ["p0-0"], "the owner runs it")
        assert thief.client.requests == ["p1-0"]  # the stolen one never requested
        model.server_down(0)  # the owner's request ends and its claim is released
        assert model.ledger is not None
        claims = model.ledger.claims
        await until(lambda: not [w for w in claims if w.startswith("p0-")], "released")
        thief.client.end(0, SUCCESS)
        await until(lambda: thief.worker.free_slots() == 1, "the thief's slot free")

        assert await stealer.steal_once() == 1
        await until(lambda: thief.client.requests == ["p1-0", "p0-0"], "the thief runs it")
        assert backlogs.reads == [(0, {0})]  # from what it kept, not read again
        thief.client.end(0, SUCCESS)
        await until(lambda: model.kafka.acked() == [0], "its owner acks it")
        await model.close()

    run(scenario)
