"""Fakes of a generate worker's collaborators (no Kafka, no server), each typed as the Protocol
it stands for (streams/generate/ports.py), and helpers to build a worker on them.

Every wait is on an observable condition with a deadline (tests/polling.py); backoffs are a
millisecond or two, so the retry paths run in no time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from aiokafka.errors import MessageSizeTooLargeError
from faust.exceptions import ProducerSendError

from streams.core.families import GENERIC
from streams.core.ledger import LedgerState, outcome_key
from streams.core.records import CompletionRecord, DeadLetter, PromptRecord
from streams.core.serving import NEWEST, ServerNormalization
from streams.core.settings import GenerateSettings, KafkaSettings
from streams.generate.client import AUTH, DOWN, GenerationError, status_error
from streams.generate.exact_ids import NO_IDS, IdsWay
from streams.generate.identity import ServerIdentity
from streams.generate.ports import Ledger, PoisonCheck, ServerClient
from streams.generate.worker import GenerateWorker, generate_backoff
from tests.fakes import TP, FakeEvent, Message
from tests.polling import wait_for_async

SERVER = "http://fake-server"
COMPLETIONS = "completions"
DEAD = "dead-letters"
LEDGER = "generated"
PROMPTS0 = TP("prompts", 0)
PROMPTS1 = TP("prompts", 1)


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


class FakeClient:
    """The server client (`ServerClient`), scripted per prompt_id."""

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
        self.server_kind = "sglang"
        self.served = "fake-model"  # the model name /v1/models answers
        self.identity = ServerIdentity()

    async def discover(self) -> None:
        self._check_key()
        if self.discover_failures:
            self.discover_failures -= 1
            raise ConnectionError("connection refused")
        self.model = self.served

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

    async def max_running_requests(self) -> int | None:
        return None

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


class FakeKafka:
    """`send` as the worker gets it, failing while `failures_left` > 0, and the acks of the
    consumed events, both in one journal so their order can be checked: ("sent", (topic,
    prompt_id)) and ("ack", partition, offset)."""

    def __init__(self) -> None:
        self.journal: list[tuple[Any, ...]] = []
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.failures_left = 0
        self.failed = 0
        self.refuse_over: int | None = None  # a topic whose max.message.bytes is this
        # ledgers that read the ledger topic: each record sent to it, as it is acknowledged
        self.followers: list[LedgerState] = []

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
        if topic == LEDGER:
            for follower in self.followers:
                follower.take(key, value)

    def event(self, offset: int, prompt_id: str, tp: TP = PROMPTS0) -> FakeEvent:
        return self.raw_event(offset, prompt_id.encode(), prompt(prompt_id), tp)

    def raw_event(self, offset: int, key: bytes, value: bytes, tp: TP = PROMPTS0) -> FakeEvent:
        return FakeEvent(Message(tp, offset), value, self.journal, key=key)

    def acked(self, tp: TP = PROMPTS0) -> list[int]:
        return [e[2] for e in self.journal if e[0] == "ack" and e[1] == tp.partition]

    def sent_to(self, topic: str) -> list[str]:
        return [key.decode() for t, key, _ in self.sent if t == topic]

    def outcomes(self) -> list[str]:
        """The ledger's outcome keys sent, in order (its claims left out)."""
        return [key for key in self.sent_to(LEDGER) if outcome_key(key)]

    def letters(self) -> list[DeadLetter]:
        return [DeadLetter.decode(value) for t, _, value in self.sent if t == DEAD]

    def position(self, entry: tuple[Any, ...]) -> int:
        return self.journal.index(entry)


class FakeLedger(LedgerState):
    """The ledger (`Ledger`), without Kafka: what it says is what the worker added, and what a
    FakeKafka it follows (`FakeKafka.followers`) sent to the ledger topic."""

    def __init__(self) -> None:
        super().__init__()
        self.caught_up = asyncio.Event()
        self.caught_up.set()
        self.stopped = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True


class FakeBacklogs:
    """Other workers' backlogs (`Backlogs`): committed offsets and ends by partition; each
    record read is a prompt whose id says where it was (`p{partition}-{offset}`)."""

    def __init__(self, committed: dict[int, int], ends: dict[int, int]) -> None:
        self.committed_offsets = committed
        self.end_offsets = ends
        self.reads: list[tuple[int, set[int]]] = []
        self.closed = False

    async def committed(self) -> dict[int, int]:
        return dict(self.committed_offsets)

    async def ends(self, partitions: list[int]) -> dict[int, int]:
        return {p: self.end_offsets[p] for p in partitions}

    async def read(self, partition: int, offsets: set[int]) -> list[tuple[bytes, bytes]]:
        self.reads.append((partition, set(offsets)))
        ids = [f"p{partition}-{offset}" for offset in sorted(offsets)]
        return [(pid.encode(), prompt(pid)) for pid in ids]

    async def close(self) -> None:
        self.closed = True


def worker_for(
    client: ServerClient,
    kafka: FakeKafka,
    *,
    ledger: Ledger | None = None,
    guard: PoisonCheck | None = None,
    limit: KafkaSettings | None = None,
    **overrides: Any,
) -> GenerateWorker:
    """A worker on fakes; `limit`: its Kafka settings (message size limits)."""
    if limit is not None:
        overrides["kafka"] = limit
    worker_settings = settings(**overrides)
    return GenerateWorker(
        worker_settings,
        client,
        kafka.send,
        COMPLETIONS,
        DEAD,
        backoff=generate_backoff(worker_settings),
        ledger=ledger,
        ledger_topic=LEDGER,
        guard=guard,
    )


async def once_worker(
    client: FakeClient,
    kafka: FakeKafka,
    limit: KafkaSettings | None = None,
    concurrency: int | None = None,
    **overrides: Any,
) -> tuple[GenerateWorker, FakeLedger]:
    """A started worker with a ledger."""
    if concurrency is not None:
        overrides["concurrency"] = concurrency
    ledger = FakeLedger()
    kafka.followers.append(ledger)  # it reads what the worker writes: its claims come back
    worker = worker_for(client, kafka, ledger=ledger, limit=limit, **overrides)
    await worker.start()
    return worker, ledger


def settings_key(worker: GenerateWorker, regen: str = "final") -> str:
    assert worker.once is not None
    return worker.once.settings_key(regen)
