"""The generate worker against small fakes (no Kafka, no server): ordered acks after delivery,
bounded retries, dead letters, pauses while the server is down or refuses the API key, Kafka
outages, the ledger,
the stealer's loop.

Every wait is on an observable condition with a deadline (tests/polling.py); backoffs are a
millisecond or two, so the retry paths run in no time.
"""

from __future__ import annotations

import asyncio
import time
from collections import namedtuple
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import MessageSizeTooLargeError
from faust.exceptions import ProducerSendError

from streams.core.crash_guard import CrashGuard
from streams.core.families import GENERIC
from streams.core.ledger import dead_key, ledger_key
from streams.core.records import CompletionRecord, DeadLetter, PromptRecord
from streams.core.serving import NEWEST, ServerNormalization
from streams.core.settings import GenerateSettings, KafkaSettings, OnceSettings
from streams.generate.app import generate_figures
from streams.generate.client import AUTH, DOWN, GenerationError, status_error
from streams.generate.exact_ids import NO_IDS, IdsWay
from streams.generate.once import OnceGenerateWorker
from streams.generate.steal import Stealer
from streams.generate.worker import GenerateWorker
from tests.bad_records import PROMPT_FIELDS, prompt_dict, with_field
from tests.polling import wait_for_async

SERVER = "http://fake-server"
COMPLETIONS = "completions"
DEAD = "dead-letters"
LEDGER = "generated"
TP = "prompts-0"


def settings(**overrides: Any) -> GenerateSettings:
    values: dict[str, Any] = {
        "server": SERVER,
        "kafka": KafkaSettings(bootstrap="127.0.0.1:9"),  # never connected to
        "concurrency": 8,
        "max_attempts": 3,
        "backoff_initial_s": 0.001,
        "backoff_max_s": 0.002,
        "health_interval_s": 0.002,
    }
    values.update(overrides)
    return GenerateSettings(**values)


def prompt(prompt_id: str) -> bytes:
    messages = [{"role": "user", "content": f"question {prompt_id}"}]
    return PromptRecord(prompt_id=prompt_id, messages=messages, source="test").encode()


async def until(condition: Callable[[], Any], what: str, timeout: float = 5.0) -> Any:
    async def check() -> Any:
        return condition()

    return await wait_for_async(check, timeout, what, interval=0.001)


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 30))


# -- fakes ------------------------------------------------------------------------------------


class FakeClient:
    """SGLangClient's surface, scripted per prompt_id."""

    def __init__(self) -> None:
        self.base_url = SERVER
        self.model = ""
        self.family = GENERIC
        self.up = True
        # the status a refused API key gets (401 or 403); None: the key is accepted
        self.refuse_key: int | None = None
        self.discover_failures = 0
        self.gates: dict[str, asyncio.Event] = {}  # a request waits for its gate
        self.failures: dict[str, list[Exception]] = {}  # raised one per attempt, in order
        self.always: dict[str, Exception] = {}  # raised on every attempt
        self.answers: dict[str, str] = {}  # the content, when not "answer <prompt_id>"
        self.requests: list[str] = []
        self.probes = 0
        self.closed = False
        self.server_version: str | None = None

    async def discover(self) -> None:
        self._check_key()
        if self.discover_failures:
            self.discover_failures -= 1
            raise ConnectionError("connection refused")
        self.model = "fake-model"

    async def unavailable(self) -> str | None:
        self.probes += 1
        if not self.up:
            return DOWN
        return AUTH if self.refuse_key else None

    def _check_key(self) -> None:
        if self.refuse_key:
            raise status_error(self.refuse_key, "Unauthorized")

    async def probe_ids(self) -> IdsWay:
        return NO_IDS

    async def use_server_version(self) -> ServerNormalization:
        self.server_version = "0.5.23"
        return NEWEST

    async def complete(self, record: PromptRecord) -> CompletionRecord:
        pid = record.prompt_id
        self.requests.append(pid)
        if not self.up:
            raise GenerationError("connection_error", "refused", transient=True, server_down=True)
        self._check_key()
        if pid in self.gates:
            await self.gates[pid].wait()
        if self.failures.get(pid):
            raise self.failures[pid].pop(0)
        if pid in self.always:
            raise self.always[pid]
        return CompletionRecord.from_prompt(
            record,
            content=self.answers.get(pid, f"answer {pid}"),
            finish_reason="stop",
            usage={"completion_tokens": 3},
        )

    async def close(self) -> None:
        self.closed = True


@dataclass
class FakeMessage:
    tp: str
    offset: int


class FakeEvent:
    def __init__(
        self, journal: list[tuple[str, Any]], tp: str, offset: int, key: bytes, value: bytes
    ):
        self.message = FakeMessage(tp, offset)
        self.key = key
        self.value = value
        self._journal = journal

    def ack(self) -> bool:
        self._journal.append(("ack", (self.message.tp, self.message.offset)))
        return True


class FakeKafka:
    """`send` as the worker gets it, failing while `failures_left` > 0, and the acks of the
    consumed events, both in one journal so their order can be checked."""

    def __init__(self) -> None:
        self.journal: list[tuple[str, Any]] = []
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.failures_left = 0
        self.failed = 0
        self.refuse_over: int | None = None  # a topic whose max.message.bytes is this

    async def send(self, topic: str, key: bytes, value: bytes) -> None:
        if self.refuse_over is not None and len(value) > self.refuse_over:
            try:
                raise MessageSizeTooLargeError("the broker refused it")
            except MessageSizeTooLargeError as err:
                raise ProducerSendError(f"Error while sending: {err!r}") from err
        if self.failures_left > 0:
            self.failures_left -= 1
            self.failed += 1
            raise ConnectionError("broker down")
        self.sent.append((topic, key, value))
        self.journal.append(("sent", (topic, key.decode())))

    def event(self, offset: int, prompt_id: str, tp: str = TP) -> FakeEvent:
        return FakeEvent(self.journal, tp, offset, prompt_id.encode(), prompt(prompt_id))

    def acked(self, tp: str = TP) -> list[int]:
        return [offset for kind, (t, offset) in self.journal if kind == "ack" and t == tp]

    def sent_to(self, topic: str) -> list[str]:
        return [key.decode() for t, key, _ in self.sent if t == topic]

    def letters(self) -> list[DeadLetter]:
        return [DeadLetter.decode(value) for t, _, value in self.sent if t == DEAD]

    def position(self, entry: tuple[str, Any]) -> int:
        return self.journal.index(entry)


def worker_for(client: FakeClient, kafka: FakeKafka, **overrides: Any) -> GenerateWorker:
    return GenerateWorker(settings(**overrides), client, kafka.send, COMPLETIONS, DEAD)  # type: ignore[arg-type]


# -- the base worker ----------------------------------------------------------------------------


def test_acks_follow_offset_order_even_when_a_slow_head_finishes_last() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        client.gates["p0"] = asyncio.Event()
        worker = worker_for(client, kafka)
        await worker.start()
        for offset in range(4):
            await worker.submit(kafka.event(offset, f"p{offset}"))
        await worker.submit(kafka.event(0, "other", tp="prompts-1"))

        await until(lambda: len(kafka.sent) == 4, "the fast prompts' completions")
        assert sorted(kafka.sent_to(COMPLETIONS)) == ["other", "p1", "p2", "p3"]
        assert kafka.acked() == []  # all wait for the slow head
        assert kafka.acked("prompts-1") == [0]  # another partition does not wait for it

        client.gates["p0"].set()
        await until(lambda: kafka.acked() == [0, 1, 2, 3], "every offset acked in order")
        for offset in range(4):  # each one only after its completion was sent
            sent = kafka.position(("sent", (COMPLETIONS, f"p{offset}")))
            assert sent < kafka.position(("ack", (TP, offset)))
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
        worker = GenerateWorker(settings(kafka=limit), client, kafka.send, COMPLETIONS, DEAD)  # type: ignore[arg-type]
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


def test_a_server_that_is_down_pauses_the_worker_without_burning_attempts() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker = worker_for(client, kafka, max_attempts=2)
        await worker.start()
        client.up = False
        await worker.submit(kafka.event(0, "p0"))

        await until(lambda: worker.stats.paused, "the worker paused")
        probes = client.probes
        await until(lambda: client.probes >= probes + 5, "the server probed while down")
        # the next prompt waits for the server, not for a request slot
        blocked = asyncio.create_task(worker.submit(kafka.event(1, "p1")))
        await until(lambda: client.probes >= probes + 10, "more probes")
        assert not blocked.done()
        assert client.requests == ["p0"]  # one request found the server down; none since
        assert worker.stats.retries == 0 and kafka.sent == [] and kafka.acked() == []

        client.up = True
        await until(lambda: kafka.acked() == [0, 1], "both prompts acked after the recovery")
        await blocked
        assert not worker.stats.paused
        assert kafka.sent_to(COMPLETIONS) == ["p0", "p1"] and kafka.letters() == []
        assert worker.stats.retries == 0
        assert client.requests == ["p0", "p0", "p1"]
        await worker.stop()

    run(scenario)


WRONG_KEY = "sk-wrong-5e1d9c"


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_api_key_pauses_the_worker_in_one_line_without_dead_letters(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        # one attempt: a refused key that counted as one would dead-letter every prompt
        worker = worker_for(client, kafka, max_attempts=1, api_key=WRONG_KEY)
        await worker.start()
        client.refuse_key = status
        for offset in range(4):
            await worker.submit(kafka.event(offset, f"p{offset}"))

        await until(lambda: worker.stats.paused, "the worker paused")
        assert worker.stats.paused_for == AUTH
        assert generate_figures(worker.stats, 0).gauges["paused_auth"] == 1
        refused = list(client.requests)
        probes = client.probes
        await until(lambda: client.probes >= probes + 10, "the key retried while paused")
        blocked = asyncio.create_task(worker.submit(kafka.event(4, "p4")))
        await until(lambda: client.probes >= probes + 20, "more probes")
        assert not blocked.done()  # no prompt taken while the key is refused
        assert client.requests == refused == ["p0"]  # the others waited for the probe
        assert kafka.sent == [] and kafka.acked() == [] and worker.stats.dead_letters == 0

        client.refuse_key = None
        await until(lambda: kafka.acked() == [0, 1, 2, 3, 4], "every prompt acked")
        await blocked
        assert kafka.sent_to(COMPLETIONS) == ["p0", "p1", "p2", "p3", "p4"]
        assert kafka.letters() == [] and worker.stats.retries == 0
        assert (worker.stats.paused, worker.stats.paused_for) == (False, "")
        await worker.stop()

    with caplog.at_level("INFO"):
        run(scenario)
    refused = [r for r in caplog.records if "refuses the API key" in r.getMessage()]
    assert len(refused) == 1, caplog.text  # one line, whatever the requests and probes
    assert "DRAFTGEN_API_KEY" in refused[0].getMessage()  # what to fix
    assert "accepts the API key" in caplog.text  # and one when it works again
    assert WRONG_KEY not in caplog.text


def test_start_waits_for_a_refused_key_with_the_same_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        client.refuse_key = 401
        worker = worker_for(client, kafka, api_key=WRONG_KEY)
        worker.start_soon()
        await until(lambda: worker.stats.paused_for == AUTH, "paused for the key at start")
        probes = client.probes
        await until(lambda: client.probes >= probes + 10, "the key retried")
        assert not worker._ready.is_set() and client.model == ""

        client.refuse_key = None
        await until(lambda: worker._ready.is_set(), "started once the key works")
        assert client.model == "fake-model" and not worker.stats.paused
        await worker.submit(kafka.event(0, "p0"))
        await until(lambda: kafka.acked() == [0], "a prompt done")
        await worker.stop()

    with caplog.at_level("INFO"):
        run(scenario)
    refused = [r for r in caplog.records if "refuses the API key" in r.getMessage()]
    assert len(refused) == 1, caplog.text
    assert "unreachable" not in caplog.text  # not a server that does not answer
    assert WRONG_KEY not in caplog.text


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
        assert kafka.position(("sent", (COMPLETIONS, "p0"))) < kafka.position(("ack", (TP, 0)))

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
        first = worker._starting
        worker.start_soon()
        assert worker._starting is first
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
        assert stuck._starting is not None
        await until(lambda: stuck._starting is not None and stuck._starting.done(), "cancelled")
        assert stuck._starting.cancelled()

    run(scenario)


# -- each prompt once: the ledger, stealing ---------------------------------------------------


class FakeLedger:
    """LedgerFollower's surface, without Kafka."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.caught_up = asyncio.Event()
        self.caught_up.set()

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def contains(self, prompt_id: str, settings: str) -> bool:
        return ledger_key(prompt_id, settings) in self.keys

    def add(self, prompt_id: str, settings: str) -> None:
        self.keys.add(ledger_key(prompt_id, settings))

    def ended(self, prompt_id: str, settings: str) -> bool:
        return self.contains(prompt_id, settings) or dead_key(prompt_id, settings) in self.keys

    def add_dead(self, prompt_id: str, settings: str) -> None:
        self.keys.add(dead_key(prompt_id, settings))


async def once_worker(
    client: FakeClient,
    kafka: FakeKafka,
    limit: KafkaSettings | None = None,
    concurrency: int | None = None,
) -> tuple[OnceGenerateWorker, FakeLedger]:
    overrides: dict[str, Any] = {"kafka": limit} if limit else {}
    if concurrency is not None:
        overrides["concurrency"] = concurrency
    worker = OnceGenerateWorker(
        settings(**overrides),
        client,
        kafka.send,
        COMPLETIONS,
        DEAD,
        LEDGER,
        OnceSettings(),  # type: ignore[arg-type]
    )
    ledger = FakeLedger()
    worker.ledger = ledger  # type: ignore[assignment]
    await worker.start()
    return worker, ledger


def test_the_ledger_skips_generated_prompts_and_copies_of_one_in_flight() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, ledger = await once_worker(client, kafka)
        ledger.add("done", worker.settings_key("final"))
        client.gates["b"] = asyncio.Event()
        await worker.submit(kafka.event(0, "done"))  # generated before: no request
        await worker.submit(kafka.event(1, "b"))
        await worker.submit(kafka.event(2, "b"))  # published again while in flight here
        await worker.submit(kafka.event(3, "c"))

        await until(lambda: kafka.sent_to(LEDGER) == ["c@" + worker.settings_key("final")], "c")
        assert kafka.acked() == [0]
        client.gates["b"].set()
        await until(lambda: kafka.acked() == [0, 1, 2, 3], "every offset acked in order")

        assert sorted(client.requests) == ["b", "c"]  # one request for the two copies of b
        assert kafka.sent_to(COMPLETIONS) == ["c", "b"]
        for pid in ("b", "c"):  # the ledger record only after its completion
            key = ledger_key(pid, worker.settings_key("final"))
            assert kafka.position(("sent", (COMPLETIONS, pid))) < kafka.position(
                ("sent", (LEDGER, key))
            )
            assert ledger.contains(pid, worker.settings_key("final"))
        assert worker.stats.skipped == 2
        figures = generate_figures(worker.stats, requests=len(client.requests))
        assert figures.counters["skipped"] == 2 and figures.counters["stolen"] == 0
        await worker.stop()

    run(scenario)


def test_stolen_prompts_are_generated_and_recorded_but_never_acked_or_dead_lettered() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, _ = await once_worker(client, kafka)
        client.always["bad"] = GenerationError("context_too_long", "too long", transient=False)
        records = [(pid.encode(), prompt(pid)) for pid in ("s1", "s2", "bad")]

        assert await worker.run_stolen(records) == 2
        assert sorted(kafka.sent_to(COMPLETIONS)) == ["s1", "s2"]
        assert len(kafka.sent_to(LEDGER)) == 2
        assert kafka.letters() == [] and kafka.acked() == []  # the owner decides about "bad"
        assert worker.stats.stolen == 2 and worker.stats.in_flight == 0
        assert generate_figures(worker.stats, requests=3).counters["stolen"] == 2
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
        worker.last_busy = time.monotonic() - 60  # idle long enough, but for the slots

        # no timer runs out during the test: only a slot freed can end it
        waiting = asyncio.create_task(worker.wait_idle(30.0))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not waiting.done() and worker.free_slots() == 0
        client.gates["p0"].set()
        await until(waiting.done, "the idle wait over once one slot is free")
        assert worker.free_slots() == 1 and worker.stats.in_flight == 1  # p1 still runs
        assert worker.idle_for() >= 30.0
        client.gates["p1"].set()
        await until(lambda: kafka.acked() == [0, 1], "both acked")
        await worker.stop()

    run(scenario)


@pytest.mark.parametrize("busy_for", [0.0, 0.05])
def test_an_idle_wait_lasts_until_the_worker_was_idle_that_long(busy_for: float) -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, _ = await once_worker(client, kafka)
        worker.last_busy = time.monotonic() - busy_for
        await worker.wait_idle(0.05)
        assert worker.idle_for() >= 0.05
        await worker.stop()

    run(scenario)


def test_the_stealer_waits_for_idleness_and_backs_off_only_when_nothing_was_taken() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, _ = await once_worker(client, kafka, concurrency=1)
        client.gates["p0"] = asyncio.Event()
        await worker.submit(kafka.event(0, "p0"))
        worker.last_busy = time.monotonic() - 60  # idle long enough, but for its one slot

        # None: no chunk to take; 0: a chunk taken but all generated already; error: a failure
        script: list[int | Exception | None] = [None, None, RuntimeError("admin"), 0, 3, None]
        looks: list[int] = []
        pauses: list[int] = []

        async def steal_once() -> int | None:
            looks.append(len(pauses))
            action = script.pop(0) if script else None
            if isinstance(action, Exception):
                raise action
            return action

        class CountingBackoff:
            async def sleep(self, attempt: int) -> None:
                pauses.append(attempt)
                await asyncio.sleep(0)

        stealer = Stealer(worker, KafkaSettings(bootstrap="127.0.0.1:9"), "prompts", "g", set)
        stealer.idle_s = 1.0
        stealer.steal_once = steal_once  # type: ignore[method-assign]
        stealer.backoff = CountingBackoff()  # type: ignore[assignment]
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
        await worker.stop()

    run(scenario)


def test_a_thief_takes_from_the_end_of_a_backlog_no_more_than_its_free_slots() -> None:
    async def scenario() -> None:
        from aiokafka import TopicPartition

        client, kafka = FakeClient(), FakeKafka()
        worker, ledger = await once_worker(client, kafka, concurrency=3)
        client.gates["own"] = asyncio.Event()
        await worker.submit(kafka.event(0, "own"))  # one slot busy: two free
        mine, p1, p2 = (TopicPartition("prompts", p) for p in range(3))
        Offset = namedtuple("Offset", "offset")
        committed = {mine: Offset(0), p1: Offset(10), p2: Offset(5)}
        ends = {mine: 50, p1: 30, p2: 13}  # p2: nothing beyond the owner's margin of 8

        class Admin:
            async def list_consumer_group_offsets(self, group: str) -> dict[Any, Any]:
                return committed

        class Consumer:
            async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
                return {tp: ends[tp] for tp in tps}

        read: list[tuple[int, set[int]]] = []

        async def fake_read(consumer: Any, tp: Any, offsets: set[int]) -> list[Any]:
            read.append((tp.partition, set(offsets)))
            return [
                (f"p{tp.partition}-{o}".encode(), prompt(f"p{tp.partition}-{o}")) for o in offsets
            ]

        async def clients() -> tuple[Any, Any]:
            return Admin(), Consumer()

        stealer = Stealer(
            worker, KafkaSettings(bootstrap="127.0.0.1:9"), "prompts", "g", lambda: {0}
        )
        assert stealer.margin == 3 + 4  # by default an owner's window: in flight + prefetch
        worker.once = OnceSettings(steal_margin=8)  # type: ignore[call-arg]
        assert stealer.margin == 8
        stealer._clients = clients  # type: ignore[method-assign]
        stealer._read = fake_read  # type: ignore[method-assign]
        for pid in ("p1-29", "p1-28", "p1-27"):
            client.gates[pid] = asyncio.Event()

        assert await stealer.steal_once() == 2
        assert read == [(1, {29, 28})]  # the end of p1's backlog, as many as free slots
        assert worker.free_slots() == 0
        ledger.add("p1-27", worker.settings_key("final"))  # generated meanwhile elsewhere
        client.gates["p1-29"].set()
        await until(lambda: worker.free_slots() == 1, "a slot freed")
        assert await stealer.steal_once() == 0  # p1-27 taken, but already generated
        assert await stealer.steal_once() == 1  # then the next one from the end
        assert read[1:] == [(1, {27}), (1, {26})]
        for event in client.gates.values():
            event.set()
        await until(lambda: worker.stats.stolen == 3 and worker.stats.in_flight == 0, "done")
        assert sorted(kafka.sent_to(COMPLETIONS)) == ["own", "p1-26", "p1-28", "p1-29"]
        assert kafka.acked() == [0]  # stolen prompts are never acked by the thief
        committed[p1] = Offset(25)  # the owner caught up: 25 + 8 is past the end
        assert await stealer.steal_once() is None
        await worker.stop()

    run(scenario)


# -- exactly one outcome per prompt --------------------------------------------------------------


def test_a_dead_lettered_prompt_redelivered_after_a_crash_gets_no_second_dead_letter() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        client.always["bad"] = GenerationError("context_too_long", "too long", transient=False)
        worker, ledger = await once_worker(client, kafka)
        await worker.submit(kafka.event(0, "bad"))
        await until(lambda: kafka.acked() == [0], "the dead letter acked")
        settings_key = worker.settings_key("final")
        assert kafka.sent_to(LEDGER) == [dead_key("bad", settings_key)]
        assert kafka.position(("sent", (DEAD, "bad"))) < kafka.position(
            ("sent", (LEDGER, dead_key("bad", settings_key)))
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


@pytest.mark.parametrize("with_ledger", [False, True])
def test_a_prompt_revoked_in_flight_gets_no_dead_letter_from_its_old_owner(
    with_ledger: bool,
) -> None:
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
        worker.forget_partitions([TP])  # a rebalance gives the partition to another worker
        client.gates["moved"].set()
        await until(lambda: worker.stats.in_flight == 0, "the request done")
        assert kafka.letters() == [] and kafka.acked() == []  # the new owner decides
        await worker.stop()

    run(scenario)


def test_a_dead_letter_is_dropped_when_a_completion_was_recorded_meanwhile() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, ledger = await once_worker(client, kafka)
        client.gates["raced"] = asyncio.Event()
        client.always["raced"] = GenerationError("retries_exhausted", "x", transient=False)
        await worker.submit(kafka.event(0, "raced"))
        await until(lambda: client.requests == ["raced"], "the request running")
        ledger.add("raced", worker.settings_key("final"))  # its former owner completed it
        client.gates["raced"].set()
        await until(lambda: kafka.acked() == [0], "acked")
        assert kafka.letters() == [] and kafka.sent_to(LEDGER) == []
        await worker.stop()

    run(scenario)


PromptsTP = namedtuple("PromptsTP", "topic partition")


def test_a_prompt_that_crashed_the_worker_twice_is_dead_lettered_without_a_request(
    tmp_path: Path,
) -> None:
    tp = PromptsTP("prompts", 0)
    for _ in range(2):
        CrashGuard(tmp_path, "w").crashed("prompts", 0, 1, MemoryError("boom"))

    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker = worker_for(client, kafka)
        worker.guard = CrashGuard(tmp_path, "w")
        await worker.start()
        for offset, pid in enumerate(("a", "poison", "b")):
            await worker.submit(kafka.event(offset, pid, tp=tp))  # type: ignore[arg-type]
        await until(lambda: kafka.acked(tp) == [0, 1, 2], "all acked")  # type: ignore[arg-type]
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
        await worker.submit(FakeEvent(kafka.journal, TP, 0, b"p", raw))
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
        await worker.submit(FakeEvent(kafka.journal, TP, 0, b"p", raw))
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
        await worker.submit(FakeEvent(kafka.journal, TP, 0, b"p", raw))
        await until(lambda: kafka.acked() == [0], "acked")
        assert client.requests == ["p"] and kafka.letters() == []
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
        assert ledger.ended("p0", worker.settings_key("final"))
        assert not ledger.contains("p0", worker.settings_key("final"))  # dead, not completed
        assert (worker.stats.completed, worker.stats.dead_letters) == (1, 1)
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
        worker = GenerateWorker(settings(kafka=limit), client, kafka.send, COMPLETIONS, DEAD)  # type: ignore[arg-type]
        await worker.start()
        raw = b"\xff" * (5 * 1024 * 1024)
        await worker.submit(FakeEvent(kafka.journal, TP, 0, b"huge", raw))
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
        assert ledger.ended("p0", worker.settings_key("final"))
        await worker.stop()

    run(scenario)
