"""A faithful model of what a generate worker sits on: faust-streaming 0.15.3's consumer (its
acks, its commits, what a rebalance clears and what it keeps), one agent handing events to the
worker one at a time, and a server whose every request waits until the test ends it.

Used by the stateful property test (test_commit_property.py) and the scenario tests of
revocations (test_leases_worker.py): both drive the real `GenerateWorker` (intake, in-flight
window, ledger, stage) on these, so a commit past a prompt without an outcome shows up as it would
against Kafka. With two members, partitions move between workers: the old owner's claims and the
new owner's waits for them are part of the interleavings.

What is modelled from faust (faust/transport/consumer.py):
- `ack`: an acked offset joins the partition's acked list if it is at or past the partition's
  committed offset as faust knows it (None after a revocation); faust does not check that the
  partition is still assigned.
- `on_partitions_revoked` clears the revoked partitions' acked lists and committed offsets, and
  (app.flow_control.clear) the events buffered for the agent; the event the agent holds stays.
- `_new_offset`: sort the acked list, take its first run of consecutive offsets, commit its end + 1;
  a run that starts more than one past a *truthy* committed offset is not committed (so a gap at a
  committed offset of 0, or of one offset, is not seen: faust-streaming #606 and its check).
- commits go only for assigned partitions.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streams.core.ledger import CLAIM, Claim
from streams.core.records import CompletionRecord, DeadLetter, PromptRecord
from streams.generate.client import GenerationError
from streams.generate.worker import GenerateWorker
from tests.fakes import TP, FakeEvent, Message
from tests.streams.generate.fakes import (
    COMPLETIONS,
    DEAD,
    LEDGER,
    FakeClient,
    FakeKafka,
    FakeLedger,
    prompt,
    worker_for,
)

TOPIC = "prompts"

SUCCESS = "success"
DEAD_LETTER = "dead_letter"  # a permanent error: the prompt's dead letter
TRANSIENT = "transient"  # one attempt fails; retried, then `retries_exhausted`
DOWN = "down"  # the server went down under the request (the connection refused)
OUTCOMES = (SUCCESS, DEAD_LETTER, TRANSIENT)
# partitions of the modelled `generated` ledger: records of one key keep their order, records of
# different partitions reach each reader in any order
LEDGER_PARTITIONS = 3


def prompt_id(partition: int, offset: int) -> str:
    return f"p{partition}-{offset}"


@dataclass
class Request:
    prompt_id: str
    answer: asyncio.Future[str]


class HeldClient(FakeClient):
    """Every request waits until the test ends it with an outcome (`end`); `on_request` is
    called as each one starts."""

    def __init__(self, on_request: Callable[[HeldClient, str], None] | None = None) -> None:
        super().__init__()
        self.pending: list[Request] = []
        self.on_request = on_request

    async def complete(self, record: PromptRecord) -> CompletionRecord:
        if not self.up:
            raise GenerationError("connection_error", "refused", transient=True, server_down=True)
        self.requests.append(record.prompt_id)
        if self.on_request is not None:
            self.on_request(self, record.prompt_id)
        request = Request(record.prompt_id, asyncio.get_running_loop().create_future())
        self.pending.append(request)
        try:
            outcome = await request.answer
        finally:
            if request in self.pending:
                self.pending.remove(request)
        if outcome == DEAD_LETTER:
            raise GenerationError("context_too_long", "too long", transient=False)
        if outcome == TRANSIENT:
            raise GenerationError("http_503", "queue full", transient=True)
        if outcome == DOWN:
            raise GenerationError("connection_error", "refused", transient=True, server_down=True)
        return CompletionRecord.from_prompt(
            record, content=f"answer {record.prompt_id}", finish_reason="stop", usage={}
        )

    def end(self, index: int, outcome: str) -> str:
        request = self.pending.pop(index % len(self.pending))
        request.answer.set_result(outcome)
        return request.prompt_id


@dataclass
class Partition:
    owner: int | None = None  # the member it is assigned to
    position: int = 0  # the next offset the fetcher delivers
    committed: int = 0  # the group's committed offset in Kafka
    faust_committed: int | None = None  # faust's `_committed_offset[tp]`
    acked: list[int] = field(default_factory=list)  # faust's `_acked[tp]`

    @property
    def assigned(self) -> bool:
        return self.owner is not None


@dataclass
class Member:
    """One worker process of the group: its worker, its server, its agent."""

    worker: GenerateWorker
    client: HeldClient
    queue: asyncio.Queue[FakeEvent]
    agent: asyncio.Task[None]
    ledger: FakeLedger | None = None  # its own reader of the ledger, when it lags


class ConsumerModel:
    """`members` worker processes of one group on a topic of `partitions` × `records` prompts;
    they share the topics (one FakeKafka) and the ledger, whose claims each reads as sent."""

    def __init__(
        self,
        partitions: int,
        records: int,
        concurrency: int,
        ledger: bool = True,
        members: int = 1,
        claim_s: float = 30.0,
        lagging: bool = False,
    ) -> None:
        """`lagging`: each member reads the ledger on its own, partition by partition, only when
        the test says (`read_ledger`); else every member sees each record as it is sent."""
        self.records = records
        self.concurrency = concurrency
        self.claim_s = claim_s
        self.partitions = {p: Partition() for p in range(partitions)}
        self.kafka = FakeKafka()
        self.lagging = lagging and ledger
        # the ledger topic outlives a worker: one reader shared by all, unless each lags on its
        # own (None: --no-ledger)
        self.ledger = FakeLedger() if ledger and not self.lagging else None
        if self.ledger is not None:
            self.kafka.followers.append(self.ledger)
        # requests started while another member's request of the same prompt ran under a claim
        # that had not lapsed, or after the prompt's outcome was released: GPU work done twice
        self.overlaps: list[str] = []
        self.redone: list[str] = []
        self.seeks: list[tuple[int, int]] = []
        self.guarded_commits = 0
        self.members: list[Member | None] = [None] * members

    # -- the processes ----------------------------------------------------------------------

    @property
    def worker(self) -> GenerateWorker:
        return self.member(0).worker

    @property
    def client(self) -> HeldClient:
        return self.member(0).client

    def member(self, index: int) -> Member:
        member = self.members[index]
        assert member is not None, "start_worker() first"
        return member

    async def start_worker(self, index: int = 0) -> None:
        client = HeldClient(self._on_request)
        client.base_url = (
            f"{client.base_url}-{index}"  # one server a member (blame.py tells them apart)
        )
        ledger = self.ledger
        if self.lagging:
            ledger = LaggingLedger(self)  # a new process reads the ledger up to its end first
            ledger.read_all()
        worker = worker_for(
            client,
            self.kafka,
            ledger=ledger,
            concurrency=self.concurrency,
            backoff_initial_s=0.0001,
            backoff_max_s=0.0002,
            claim_s=self.claim_s,
        )
        self.connect(worker)
        await worker.start()
        queue: asyncio.Queue[FakeEvent] = asyncio.Queue()
        agent = asyncio.ensure_future(self._run_agent(worker, queue))
        lagging = ledger if isinstance(ledger, LaggingLedger) else None
        self.members[index] = Member(worker, client, queue, agent, lagging)

    async def start_all(self) -> None:
        for index in range(len(self.members)):
            await self.start_worker(index)

    def connect(self, worker: GenerateWorker) -> None:
        """Give the worker what faust gives it in production: the group's committed offsets
        and a seek (only for a worker that asks, through `worker.intake.leases`)."""
        leases = getattr(worker.intake, "leases", None)
        if leases is not None:
            leases.connect(self.start_of, self.seek)

    async def start_of(self, tp: Any) -> int:
        return self.partitions[tp.partition].committed

    async def seek(self, tp: Any, offset: int) -> None:
        self.seeks.append((tp.partition, offset))
        self.partitions[tp.partition].position = offset

    @staticmethod
    async def _run_agent(worker: GenerateWorker, queue: asyncio.Queue[FakeEvent]) -> None:
        while True:
            event = await queue.get()
            await worker.submit(event)

    def pending(self) -> list[Request]:
        """Every request running, of every member."""
        return [r for m in self.members if m is not None for r in m.client.pending]

    def requests(self) -> list[str]:
        return [pid for m in self.members if m is not None for pid in m.client.requests]

    def end(self, index: int, outcome: str) -> str:
        """End the `index`-th request running (of any member) with `outcome`."""
        request = self.pending()[index % len(self.pending())]
        for member in self.members:
            if member is not None and request in member.client.pending:
                member.client.pending.remove(request)
        request.answer.set_result(outcome)
        return request.prompt_id

    async def close(self) -> None:
        """The end of a test: the agents and the workers stopped, their tasks done."""
        for member in self.members:
            if member is not None:
                member.agent.cancel()
                await member.worker.stop()
        for _ in range(5):
            await asyncio.sleep(0)

    async def crash(self, index: int = 0) -> None:
        """kill -9: nothing of the process runs on; Kafka keeps what it acknowledged; its
        partitions are revoked from it (its session ends) without its revocation handler."""
        member = self.member(index)
        member.agent.cancel()
        await member.worker.stop()
        await asyncio.sleep(0)
        for part in self.partitions.values():
            if part.owner == index:
                part.owner = None
                part.acked.clear()
                part.faust_committed = None
        await self.start_worker(index)

    # -- the ledger, and what it says of claims --------------------------------------------

    def ledger_log(self, partition: int) -> list[tuple[bytes, bytes]]:
        """The records of one partition of the ledger topic, in their order."""
        return [
            (key, value)
            for topic, key, value in self.kafka.sent
            if topic == LEDGER and ledger_partition(key) == partition
        ]

    def read_ledger(self, member: int, partition: int, count: int = 1_000) -> None:
        """The member's reader reads up to `count` more records of a ledger partition."""
        found = self.members[member]
        if found is not None and found.ledger is not None:
            found.ledger.read(partition, count)

    async def steal(self, member: int, partition: int, offset: int) -> bool:
        """The member takes a prompt of any partition from the backlog (a thief)."""
        found = self.members[member]
        if found is None or offset >= self.records:
            return False
        pid = prompt_id(partition, offset)
        found.worker.start_stolen([(pid.encode(), prompt(pid))])
        return True

    def server_down(self, member: int) -> None:
        """The member's server dies: its requests fail, and it refuses new ones."""
        client = self.member(member).client
        client.up = False
        while client.pending:
            client.end(0, DOWN)

    def server_up(self, member: int) -> None:
        self.member(member).client.up = True

    def _on_request(self, client: HeldClient, pid: str) -> None:
        """A request starts: no other member's request of the prompt may be running under a
        claim that holds (the protocol's invariant: streams/generate/claims.py)."""
        now = time.time()  # the claims' clock (virtual in the property test)
        requester = next(m.worker for m in self.members if m is not None and m.client is client)
        if self.known_done(requester, pid):
            self.redone.append(f"{pid}: requested after its outcome and its claim's release")
        for member in self.members:
            if member is None or member.client is client:
                continue
            if not any(r.prompt_id == pid for r in member.client.pending):
                continue
            until = self.claimed_until(member.worker, pid)
            if until > now:
                self.overlaps.append(f"{pid}: requested while running elsewhere until {until}")

    def known_done(self, worker: GenerateWorker, pid: str) -> bool:
        """Whether the prompt's outcome was written, and its holder's claim released after it,
        before the worker's last claim of it, which the worker read back before requesting:
        then it could have known (unless a claim had lapsed on the way). From every record in
        the order sent, whatever the readers read."""
        assert worker.once is not None
        me = worker.once.worker_id
        holder: Claim | None = None
        marker: str | None = None  # the holder when the outcome was written
        released = lapsed = known = False
        for topic, key, value in self.kafka.sent:
            text = key.decode()
            if topic != LEDGER or not text.startswith(f"{pid}@"):
                continue
            if not text.endswith(CLAIM):
                marker = holder.worker if holder is not None else None
                continue
            claim = Claim.decode(value)
            if claim is None:
                continue
            if claim.released:
                if holder is not None and holder.worker == claim.worker:
                    holder = None
                    released = released or claim.worker == marker
            elif holder is None or holder.worker == claim.worker or holder.until <= claim.at:
                lapsed = lapsed or (holder is not None and holder.worker != claim.worker)
                holder = claim
                if claim.worker == me:
                    known = released and not lapsed
        return known

    def claimed_until(self, worker: GenerateWorker, pid: str) -> float:
        """Until when the worker's claim of the prompt holds, by the protocol's rule applied to
        every record written (0: it holds none). The rule is written out here, not taken from
        `Claim.beats`: the oracle must not change with the code it checks."""
        assert worker.once is not None
        me = worker.once.worker_id
        holder: Claim | None = None
        for key, value in self.ledger_log(ledger_partition_of(pid, worker)):
            text = key.decode()
            if not (text.startswith(f"{pid}@") and text.endswith(CLAIM)):
                continue
            claim = Claim.decode(value)
            if claim is None:
                continue
            if claim.released:
                if holder is not None and holder.worker == claim.worker:
                    holder = None
            elif holder is None or holder.worker == claim.worker or holder.until <= claim.at:
                holder = claim
        return holder.until if holder is not None and holder.worker == me else 0.0

    # -- the group ----------------------------------------------------------------------------

    def assign(self, partitions: list[int], member: int = 0) -> None:
        for p in partitions:
            if p not in self.partitions:
                continue
            part = self.partitions[p]
            part.owner = member
            part.position = part.committed  # perform_seek
            part.faust_committed = part.committed or None

    async def revoke(self) -> None:
        """An eager rebalance: every assigned partition is revoked, and each member's
        revocation handler returns (its claims durable) before any assignment."""
        for index, member in enumerate(self.members):
            if member is None:
                continue
            revoked = [p for p, part in self.partitions.items() if part.owner == index]
            for p in revoked:
                part = self.partitions[p]
                part.owner = None
                part.acked.clear()
                part.faust_committed = None
            while not member.queue.empty():  # flow_control.clear(): the agent's buffer
                member.queue.get_nowait()
            await member.worker.revoke_partitions([TP(TOPIC, p) for p in revoked])

    def deliver(self, partition: int, skip: int = 0) -> bool:
        """The fetcher hands the partition's next record to its owner's agent (`skip`: a
        record the fetcher lost on the way, the consumer-side suspect)."""
        part = self.partitions.get(partition)
        if part is None or part.owner is None:
            return False
        offset = part.position + skip
        if offset >= self.records:
            return False
        part.position = offset + 1
        tp = TP(TOPIC, partition)
        pid = prompt_id(partition, offset)
        event = FakeEvent(
            Message(tp, offset),
            prompt(pid),
            self.kafka.journal,
            key=pid.encode(),
            on_ack=self._on_ack,
        )
        self.member(part.owner).queue.put_nowait(event)
        return True

    def _on_ack(self, event: FakeEvent) -> None:
        part = self.partitions[event.message.tp.partition]
        offset = event.message.offset
        at_or_past = part.faust_committed is None or offset >= part.faust_committed
        if at_or_past and offset not in part.acked:
            part.acked.append(offset)

    def commit(self) -> None:
        """faust's periodic commit (`_new_offset` per assigned partition), through the
        owner's commit guard when it has one."""
        for p, part in self.partitions.items():
            if part.owner is None or not part.acked:
                continue
            guard = getattr(self.member(part.owner).worker.intake, "leases", None)
            new = _new_offset(part)
            if new is None:
                continue
            if part.faust_committed is not None and new <= part.faust_committed:
                continue
            if guard is not None:
                allowed = guard.committable(TP(TOPIC, p), new)
                if allowed != new:
                    self.guarded_commits += 1
                if allowed is None:
                    continue
                new = allowed
            part.committed = max(part.committed, new)
            part.faust_committed = new

    # -- what the topics say ------------------------------------------------------------------

    def completions(self) -> list[str]:
        return [key.decode() for topic, key, _ in self.kafka.sent if topic == COMPLETIONS]

    def letters(self) -> list[str]:
        return [
            letter.prompt_id
            for topic, _, value in self.kafka.sent
            if topic == DEAD and (letter := DeadLetter.decode(value)).prompt_id
        ]

    def outcomes(self) -> set[str]:
        return set(self.completions()) | set(self.letters())

    def committed_without_outcome(self) -> list[str]:
        ended = self.outcomes()
        return [
            prompt_id(p, offset)
            for p, part in self.partitions.items()
            for offset in range(part.committed)
            if prompt_id(p, offset) not in ended
        ]


def ledger_partition(key: bytes) -> int:
    return zlib.crc32(key) % LEDGER_PARTITIONS


def ledger_partition_of(pid: str, worker: GenerateWorker) -> int:
    assert worker.once is not None
    work = worker.once.work_of(pid.encode(), prompt(pid))
    return ledger_partition(f"{work.key}{CLAIM}".encode())


class LaggingLedger(FakeLedger):
    """One member's reader of the ledger topic: it reads a partition only when told, so what
    it knows lags the topic, and its partitions reach it in any order."""

    def __init__(self, model: ConsumerModel) -> None:
        super().__init__()
        self.model = model
        self.positions = dict.fromkeys(range(LEDGER_PARTITIONS), 0)

    def read(self, partition: int, count: int) -> None:
        log = self.model.ledger_log(partition)
        start = self.positions[partition]
        for key, value in log[start : start + count]:
            self.take(key, value)
        self.positions[partition] = min(len(log), start + count)

    def read_all(self) -> None:
        for partition in self.positions:
            self.read(partition, 1_000_000)


def _new_offset(part: Partition) -> int | None:
    acked = part.acked
    acked.sort()
    if part.faust_committed and min(acked) - part.faust_committed > 1:
        return None
    run = [acked[0]]
    for offset in acked[1:]:
        if offset != run[-1] + 1:
            break
        run.append(offset)
    del acked[: len(run)]
    return run[-1] + 1


async def settle() -> None:
    """Let every task run until it waits on something the test controls."""
    for _ in range(3):
        for _ in range(40):
            await asyncio.sleep(0)
        await asyncio.sleep(0.001)  # the retries' backoff (0.1-0.2 ms)
