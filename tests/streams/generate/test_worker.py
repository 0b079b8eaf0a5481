"""The generate worker against small fakes (tests/streams/generate/fakes.py; no Kafka, no
server): ordered acks after delivery, bounded retries, dead letters, Kafka outages, start-up,
revocation, poisoned and bad records. Pauses: test_pauses.py; the ledger: test_once.py;
stealing: test_steal.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from streams.core.crash_guard import CrashGuard
from streams.core.records import DeadLetter, PromptRecord
from streams.core.settings import KafkaSettings
from streams.generate.client import GenerationError
from streams.generate.worker import GenerateWorker
from tests.bad_records import PROMPT_FIELDS, prompt_dict, with_field
from tests.streams.generate.fakes import (
    COMPLETIONS,
    DEAD,
    PROMPTS0,
    PROMPTS1,
    FakeClient,
    FakeKafka,
    once_worker,
    run,
    until,
    worker_for,
)


def test_acks_follow_offset_order_even_when_a_slow_head_finishes_last() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        client.gates["p0"] = asyncio.Event()
        worker = worker_for(client, kafka)
        await worker.start()
        for offset in range(4):
            await worker.submit(kafka.event(offset, f"p{offset}"))
        await worker.submit(kafka.event(0, "other", tp=PROMPTS1))

        await until(lambda: len(kafka.sent) == 4, "the fast prompts' completions")
        assert sorted(kafka.sent_to(COMPLETIONS)) == ["other", "p1", "p2", "p3"]
        assert kafka.acked() == []  # all wait for the slow head
        assert kafka.acked(PROMPTS1) == [0]  # another partition does not wait for it

        client.gates["p0"].set()
        await until(lambda: kafka.acked() == [0, 1, 2, 3], "every offset acked in order")
        for offset in range(4):  # each one only after its completion was sent
            sent = kafka.position(("sent", (COMPLETIONS, f"p{offset}")))
            assert sent < kafka.position(("ack", 0, offset))
        assert worker.stats.completed == 5 and worker.stats.in_flight == 0
        await worker.stop()
        assert client.closed

    run(scenario)


def test_a_transient_error_is_retried_up_to_max_attempts_then_one_dead_letter() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        client.always["p0"] = GenerationError("http_503", "overloaded", transient=True)
        client.failures["p1"] = [GenerationError("timeout", "timed out", transient=True)]
        worker = worker_for(client, kafka, max_attempts=3)
        await worker.start()
        await worker.submit(kafka.event(0, "p0"))
        await worker.submit(kafka.event(1, "p1"))

        await until(lambda: kafka.acked() == [0, 1], "both prompts acked")
        assert client.requests.count("p0") == 3
        (letter,) = kafka.letters()
        assert (letter.prompt_id, letter.kind) == ("p0", "retries_exhausted")
        assert "http_503 after 3 attempts" in letter.message
        assert kafka.sent_to(COMPLETIONS) == ["p1"]  # one retry was enough for p1
        assert client.requests.count("p1") == 2
        assert worker.stats.retries == 3 and worker.stats.dead_letters == 1
        assert worker.stats.errors == {"http_503": 3, "timeout": 1}
        await worker.stop()

    run(scenario)


def test_a_permanent_error_is_one_dead_letter_at_once() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        client.always["p0"] = GenerationError("context_too_long", "too long", transient=False)
        worker = worker_for(client, kafka)
        await worker.start()
        await worker.submit(kafka.event(0, "p0"))

        await until(lambda: kafka.acked() == [0], "the prompt acked")
        assert client.requests == ["p0"]
        assert [(d.prompt_id, d.kind) for d in kafka.letters()] == [("p0", "context_too_long")]
        assert worker.stats.retries == 0
        await worker.stop()

    run(scenario)


def test_a_bug_on_one_prompt_dead_letters_it_and_the_partition_moves_on() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        client.always["p0"] = RuntimeError("a bug")
        worker = worker_for(client, kafka)
        await worker.start()
        await worker.submit(kafka.event(0, "p0"))
        await worker.submit(kafka.event(1, "p1"))

        await until(lambda: kafka.acked() == [0, 1], "both prompts acked")
        assert [(d.prompt_id, d.kind) for d in kafka.letters()] == [("p0", "internal_error")]
        assert kafka.sent_to(COMPLETIONS) == ["p1"]
        await worker.stop()

    run(scenario)


def test_a_completion_over_the_size_limit_is_a_dead_letter_and_the_partition_moves_on() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        client.answers["p0"] = "x" * 5000
        limit = KafkaSettings(bootstrap="127.0.0.1:9", max_message_bytes=4000)
        worker = worker_for(client, kafka, limit=limit)
        await worker.start()
        await worker.submit(kafka.event(0, "p0"))
        await worker.submit(kafka.event(1, "p1"))

        await until(lambda: kafka.acked() == [0, 1], "both prompts acked")
        [letter] = kafka.letters()
        assert (letter.prompt_id, letter.kind) == ("p0", "record_too_large")
        assert "4000-byte limit" in letter.message
        assert PromptRecord.decode(letter.payload_bytes()).prompt_id == "p0"  # to republish
        assert kafka.sent_to(COMPLETIONS) == ["p1"]
        assert (worker.stats.completed, worker.stats.dead_letters) == (1, 1)
        await worker.stop()

    run(scenario)


def test_a_failing_send_is_retried_until_kafka_takes_it_and_nothing_is_acked_before() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker = worker_for(client, kafka)
        await worker.start()
        kafka.failures_left = 10**9  # down until told otherwise
        await worker.submit(kafka.event(0, "p0"))

        await until(lambda: kafka.failed >= 5, "several failed writes")
        assert kafka.acked() == [] and kafka.sent == []
        assert client.requests == ["p0"]  # the generation is kept, not redone

        kafka.failures_left = 0
        await until(lambda: kafka.acked() == [0], "the prompt acked once written")
        assert kafka.sent_to(COMPLETIONS) == ["p0"]
        assert kafka.position(("sent", (COMPLETIONS, "p0"))) < kafka.position(("ack", 0, 0))

        kafka.failures_left = 3  # a short outage: three failures, then the write goes through
        failed = kafka.failed
        await worker.submit(kafka.event(1, "p1"))
        await until(lambda: kafka.acked() == [0, 1], "the second prompt acked")
        assert kafka.failed == failed + 3 and kafka.sent_to(COMPLETIONS) == ["p0", "p1"]
        await worker.stop()

    run(scenario)


def test_start_waits_for_the_server_and_prompts_wait_for_start() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        client.discover_failures = 3
        worker = worker_for(client, kafka)
        early = asyncio.create_task(worker.submit(kafka.event(0, "p0")))
        await worker.start()
        assert client.discover_failures == 0 and client.model == "fake-model"
        await early
        await until(lambda: kafka.acked() == [0], "the early prompt acked")
        await worker.stop()

    run(scenario)


def test_start_soon_starts_once_in_the_background() -> None:
    """The agent calls it as it starts (a restarted agent calls it again): one start, which
    an early prompt waits for; stop() cancels a start still waiting for the server."""

    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        client.discover_failures = 2
        worker = worker_for(client, kafka)
        early = asyncio.create_task(worker.submit(kafka.event(0, "p0")))
        worker.start_soon()
        first = worker.starting()
        worker.start_soon()
        assert worker.starting() is first
        await early
        await until(lambda: kafka.acked() == [0], "the early prompt acked")
        assert client.model == "fake-model" and client.discover_failures == 0
        await worker.stop()

        down = FakeClient()
        down.discover_failures = 10**6
        stuck = worker_for(down, FakeKafka())
        stuck.start_soon()
        await until(lambda: down.discover_failures < 10**6, "a discovery attempt")
        await stuck.stop()
        starting = stuck.starting()
        assert starting is not None
        await until(starting.done, "cancelled")
        assert starting.cancelled()

    run(scenario)


@pytest.mark.parametrize("with_ledger", [False, True])
def test_a_prompt_revoked_in_flight_is_dead_lettered_only_by_its_claims_holder(
    with_ledger: bool,
) -> None:
    """Without the ledger the new owner redoes the prompt and decides; with it, the old owner
    holds the request's claim (the new owner waits for it), so it decides."""

    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker: GenerateWorker
        if with_ledger:
            worker, _ = await once_worker(client, kafka)
        else:
            worker = worker_for(client, kafka)
            await worker.start()
        client.gates["moved"] = asyncio.Event()
        client.always["moved"] = GenerationError("context_too_long", "x", transient=False)
        await worker.submit(kafka.event(0, "moved"))
        await until(lambda: client.requests == ["moved"], "the request running")
        # a rebalance gives the partition to another worker
        await worker.revoke_partitions([PROMPTS0])
        client.gates["moved"].set()
        await until(lambda: worker.stats.in_flight == 0, "the request done")
        letters = [letter.prompt_id for letter in kafka.letters()]
        assert letters == (["moved"] if with_ledger else []) and kafka.acked() == []
        await worker.stop()

    run(scenario)


def test_a_prompt_that_crashed_the_worker_twice_is_dead_lettered_without_a_request(
    tmp_path: Path,
) -> None:
    for _ in range(2):
        CrashGuard(tmp_path, "w").crashed("prompts", 0, 1, MemoryError("boom"))

    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker = worker_for(client, kafka, guard=CrashGuard(tmp_path, "w"))
        await worker.start()
        for offset, pid in enumerate(("a", "poison", "b")):
            await worker.submit(kafka.event(offset, pid))
        await until(lambda: kafka.acked() == [0, 1, 2], "all acked")
        assert sorted(client.requests) == ["a", "b"]
        [letter] = kafka.letters()
        assert (letter.kind, letter.prompt_id) == ("crash_loop", "poison")
        assert "MemoryError: boom" in letter.message
        await worker.stop()

    run(scenario)


@pytest.mark.parametrize("field", ["prompt_id", "source", "meta", "published_at"])
def test_a_prompt_with_a_field_of_the_wrong_type_is_one_bad_shape_letter(field: str) -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, _ = await once_worker(client, kafka)
        value, _kind = PROMPT_FIELDS[field]
        raw = with_field(prompt_dict("p"), field, value)
        await worker.submit(kafka.raw_event(0, b"p", raw))
        await until(lambda: kafka.acked() == [0], "acked")
        assert [letter.kind for letter in kafka.letters()] == ["bad_shape"]
        assert client.requests == []
        await worker.stop()

    run(scenario)


BAD_TOOLS = {
    "a string": "run_shell",  # not a list: refused by the record's own check
    "an object": {"type": "function", "function": {"name": "f"}},
    "not function tools": [{"foo": 1}],
    "a bare schema": [{"name": "f", "parameters": {}}],
    "no name": [{"type": "function", "function": {"description": "d"}}],
    "a name that is not text": [{"type": "function", "function": {"name": 5}}],
    "parameters that are not an object": [
        {"type": "function", "function": {"name": "f", "parameters": "x"}}
    ],
    "another type": [{"type": "retrieval", "function": {"name": "f"}}],
}


@pytest.mark.parametrize("tools", BAD_TOOLS.values(), ids=BAD_TOOLS.keys())
def test_a_prompt_with_bad_tools_is_a_dead_letter_before_any_request(tools: Any) -> None:
    """Such tools make a server answer 400, or fail with a 5xx retried as transient: either
    way requests spent on a prompt that can never succeed."""

    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        client.always["p"] = GenerationError("http_500", "template failed", transient=True)
        worker, _ = await once_worker(client, kafka)
        raw = with_field(prompt_dict("p"), "tools", tools)
        await worker.submit(kafka.raw_event(0, b"p", raw))
        await until(lambda: kafka.acked() == [0], "acked")
        (letter,) = kafka.letters()
        assert letter.kind in ("bad_tools", "bad_shape") and "tool" in letter.message
        assert letter.kind == "bad_tools" or isinstance(tools, str | dict)
        assert client.requests == []
        await worker.stop()

    run(scenario)


def test_a_prompt_with_function_tools_is_generated() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, _ = await once_worker(client, kafka)
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        raw = with_field(prompt_dict("p"), "tools", [tool])
        await worker.submit(kafka.raw_event(0, b"p", raw))
        await until(lambda: kafka.acked() == [0], "acked")
        assert client.requests == ["p"] and kafka.letters() == []
        await worker.stop()

    run(scenario)


@pytest.mark.parametrize("topic_limit", [None, 32 * 1024])
def test_a_huge_undecodable_prompt_is_one_bounded_dead_letter_and_never_stalls(
    topic_limit: int | None,
) -> None:
    """5 MB that is not UTF-8: its letter is cut to the producers' limit (64 KiB here); on a
    dead-letters topic whose own limit is lower, it goes once more without its payload."""

    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        kafka.refuse_over = topic_limit
        limit = KafkaSettings(bootstrap="127.0.0.1:9", max_message_bytes=64 * 1024)
        worker = worker_for(client, kafka, limit=limit)
        await worker.start()
        raw = b"\xff" * (5 * 1024 * 1024)
        await worker.submit(kafka.raw_event(0, b"huge", raw))
        await worker.submit(kafka.event(1, "p1"))

        await until(lambda: kafka.acked() == [0, 1], "both prompts acked")
        [(_, key, value)] = [sent for sent in kafka.sent if sent[0] == DEAD]
        assert limit.too_large(key, value) is None
        letter = DeadLetter.decode(value)
        assert (letter.prompt_id, letter.kind) == ("huge", "invalid_utf8")
        assert (letter.payload_size, letter.payload_truncated) == (len(raw), True)
        kept = letter.payload_bytes()
        assert raw.startswith(kept) and (len(kept) > 40_000) == (topic_limit is None)
        assert kafka.failed == 0 and client.requests == ["p1"]
        await worker.stop()

    run(scenario)
