"""Each prompt once per generation settings (streams/generate/once.py): the ledger skips what
was generated, a redelivery gets no second outcome, a dead letter is dropped when a completion
was recorded meanwhile."""

from __future__ import annotations

import asyncio

from streams.core.ledger import dead_key, ledger_key
from streams.core.settings import KafkaSettings
from streams.generate.client import GenerationError
from streams.generate.stats import generate_figures
from tests.streams.generate.fakes import (
    COMPLETIONS,
    DEAD,
    LEDGER,
    FakeClient,
    FakeKafka,
    once_worker,
    run,
    settings_key,
    until,
)


def test_the_ledger_skips_generated_prompts_and_copies_of_one_in_flight() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, ledger = await once_worker(client, kafka)
        ledger.add("done", settings_key(worker))
        client.gates["b"] = asyncio.Event()
        await worker.submit(kafka.event(0, "done"))  # generated before: no request
        await worker.submit(kafka.event(1, "b"))
        await worker.submit(kafka.event(2, "b"))  # published again while in flight here
        await worker.submit(kafka.event(3, "c"))

        await until(lambda: kafka.outcomes() == ["c@" + settings_key(worker)], "c")
        assert kafka.acked() == [0]
        client.gates["b"].set()
        await until(lambda: kafka.acked() == [0, 1, 2, 3], "every offset acked in order")

        assert sorted(client.requests) == ["b", "c"]  # one request for the two copies of b
        assert kafka.sent_to(COMPLETIONS) == ["c", "b"]
        for pid in ("b", "c"):  # the ledger record only after its completion
            key = ledger_key(pid, settings_key(worker))
            assert kafka.position(("sent", (COMPLETIONS, pid))) < kafka.position(
                ("sent", (LEDGER, key))
            )
            assert ledger.contains(pid, settings_key(worker))
        assert worker.stats.skipped == 2
        figures = generate_figures(worker.stats)
        assert figures.counters["skipped"] == 2 and figures.counters["stolen"] == 0
        await worker.stop()

    run(scenario)


def test_a_dead_lettered_prompt_redelivered_after_a_crash_gets_no_second_dead_letter() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        client.always["bad"] = GenerationError("context_too_long", "too long", transient=False)
        worker, ledger = await once_worker(client, kafka)
        await worker.submit(kafka.event(0, "bad"))
        await until(lambda: kafka.acked() == [0], "the dead letter acked")
        key = settings_key(worker)
        assert kafka.outcomes() == [dead_key("bad", key)]
        assert kafka.position(("sent", (DEAD, "bad"))) < kafka.position(
            ("sent", (LEDGER, dead_key("bad", key)))
        )
        await worker.stop()

        # restarted before the offset was committed: the prompt comes again
        restarted, fresh = await once_worker(client, kafka)
        fresh.keys = set(ledger.keys)  # what it reads back from the ledger topic
        await restarted.submit(kafka.event(0, "bad"))
        await until(lambda: kafka.acked() == [0, 0], "the redelivery acked")
        assert len(kafka.letters()) == 1 and client.requests == ["bad"]
        assert restarted.stats.skipped == 1
        await restarted.stop()

    run(scenario)


def test_a_dead_letter_is_dropped_when_a_completion_was_recorded_meanwhile() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, ledger = await once_worker(client, kafka)
        client.gates["raced"] = asyncio.Event()
        client.always["raced"] = GenerationError("retries_exhausted", "x", transient=False)
        await worker.submit(kafka.event(0, "raced"))
        await until(lambda: client.requests == ["raced"], "the request running")
        ledger.add("raced", settings_key(worker))  # its former owner completed it
        client.gates["raced"].set()
        await until(lambda: kafka.acked() == [0], "acked")
        assert kafka.letters() == [] and kafka.outcomes() == []
        await worker.stop()

    run(scenario)


def test_a_completion_refused_by_a_topic_with_a_lower_limit_is_a_dead_letter() -> None:
    """The topic was created with a smaller max.message.bytes than the setting: the refusal is
    final, so the prompt is dead-lettered (and recorded so) instead of retried forever."""

    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        client.answers["p0"] = "x" * 5000
        kafka.refuse_over = 4000
        worker, ledger = await once_worker(client, kafka)
        await worker.submit(kafka.event(0, "p0"))
        await worker.submit(kafka.event(1, "p1"))

        await until(lambda: kafka.acked() == [0, 1], "both prompts acked")
        [letter] = kafka.letters()
        assert (letter.prompt_id, letter.kind) == ("p0", "record_too_large")
        assert "refused by Kafka" in letter.message
        assert kafka.sent_to(COMPLETIONS) == ["p1"]
        assert ledger.ended("p0", settings_key(worker))
        assert not ledger.contains("p0", settings_key(worker))  # dead, not completed
        assert (worker.stats.completed, worker.stats.dead_letters) == (1, 1)
        await worker.stop()

    run(scenario)


def test_the_ledger_worker_dead_letters_a_completion_over_the_limit_before_sending() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        client.answers["p0"] = "x" * 5000
        limit = KafkaSettings(bootstrap="127.0.0.1:9", max_message_bytes=4000)
        worker, ledger = await once_worker(client, kafka, limit)
        await worker.submit(kafka.event(0, "p0"))
        await worker.submit(kafka.event(1, "p1"))

        await until(lambda: kafka.acked() == [0, 1], "both prompts acked")
        assert [(d.prompt_id, d.kind) for d in kafka.letters()] == [("p0", "record_too_large")]
        assert kafka.sent_to(COMPLETIONS) == ["p1"]
        assert ledger.ended("p0", settings_key(worker))
        await worker.stop()

    run(scenario)
