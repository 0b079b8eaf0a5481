"""Who pays for a failure (streams/generate/blame.py): the rules on their own, then workers on
fakes: a node that refuses everything dead-letters nothing and closes its gate, a prompt that
crashes servers ends as a dead letter at the second server's crash while the prompt beside it
runs again once, and suspects run one at a time."""

from __future__ import annotations

import asyncio

from streams.core.ledger import CRASH, Claim, Failure, LedgerState, claim_key
from streams.generate import blame
from streams.generate.client import SLOW, GenerationError, status_error
from streams.generate.worker import GenerateWorker
from tests.streams.generate.fakes import (
    COMPLETIONS,
    FakeClient,
    FakeKafka,
    FakeLedger,
    once_worker,
    prompt,
    run,
    settings_key,
    until,
)

A, B = "http://a", "http://b"


def refused(server: str, at: float, kind: str = "http_404") -> Failure:
    return Failure(server, kind, at)


def crashed(server: str, at: float) -> Failure:
    return Failure(server, CRASH, at)


# -- the rules ------------------------------------------------------------------------------


def test_a_refusal_is_the_prompts_only_when_a_second_server_agrees_or_nobody_else_works() -> None:
    assert blame.verdict([refused(A, 1)], alone=False) is None
    assert blame.verdict([refused(A, 1), refused(A, 2)], alone=False) is None  # same server
    kind, message = blame.verdict([refused(A, 1), refused(B, 2, "http_400")], alone=False) or (
        "",
        "",
    )
    assert kind == "http_400" and A in message and B in message
    alone = blame.verdict([refused(A, 1)], alone=True)
    assert alone is not None and "no other server" in alone[1]


def test_a_crash_is_the_prompts_at_the_second_server_or_the_third_crash_of_one() -> None:
    assert blame.verdict([crashed(A, 1)], alone=True) is None
    assert blame.verdict([crashed(A, 1), crashed(A, 2)], alone=False) is None
    kind, message = blame.verdict([crashed(A, 1), crashed(B, 2)], alone=False) or ("", "")
    assert kind == blame.SERVER_CRASH and A in message and B in message
    three = blame.verdict([crashed(A, 1), crashed(A, 2), crashed(A, 3)], alone=False)
    assert three is not None and three[0] == blame.SERVER_CRASH
    # the latest failure decides which rule: a refusal after a crash is judged as a refusal
    assert blame.verdict([crashed(A, 1), crashed(B, 2), refused(A, 3)], alone=False) is None


def test_suspects_and_servers_that_refused() -> None:
    assert blame.suspect([refused(A, 1), crashed(B, 2)])
    assert not blame.suspect([refused(A, 1)])
    assert blame.failed_here([refused(A, 1)], A) and blame.failed_here([crashed(A, 1)], A)
    assert not blame.failed_here([refused(A, 1), crashed(A, 2)], B)
    assert blame.alone(None, 60, now=100)
    assert blame.alone(30.0, 60, now=100) and not blame.alone(50.0, 60, now=100)


def test_failures_survive_compaction_in_the_claim_records() -> None:
    """Every claim record carries the work's failures, so the last one (all compaction keeps)
    still has them, and a reader unions what it reads."""
    claim = Claim("w", 10.0, True, 5.0, None, (refused(A, 1), crashed(B, 2)))
    assert Claim.decode(claim.encode()) == claim
    assert Claim.decode(Claim("w", 10.0).encode()) == Claim("w", 10.0)  # none: none written
    state = LedgerState()
    key = claim_key("p@s").encode()
    state.take(key, Claim("x", 10.0, failures=(refused(A, 1),)).encode())
    state.take(key, Claim("x", 11.0, True, 11.0, None, (crashed(B, 2),)).encode())
    assert state.failures("p@s") == (refused(A, 1), crashed(B, 2))
    late = LedgerState()  # a reader after compaction: the last record only
    late.take(key, Claim("y", 12.0, failures=state.failures("p@s")).encode())
    assert late.failures("p@s") == (refused(A, 1), crashed(B, 2))


# -- workers on fakes -------------------------------------------------------------------------


async def fleet(servers: list[str]) -> tuple[list[GenerateWorker], list[FakeClient], FakeKafka]:
    """Workers of one group, a server each, reading one ledger as it is written."""
    kafka = FakeKafka()
    workers, clients = [], []
    for server in servers:
        client = FakeClient()
        client.base_url = server
        worker, _ = await once_worker(client, kafka, concurrency=4, claim_s=5.0)
        workers.append(worker)
        clients.append(client)
    return workers, clients, kafka


def ledger_of(worker: GenerateWorker) -> FakeLedger:
    assert isinstance(worker.ledger, FakeLedger)
    return worker.ledger


def work(worker: GenerateWorker, prompt_id: str) -> str:
    return f"{prompt_id}@{settings_key(worker)}"


def test_a_node_that_refuses_everything_dead_letters_nothing_and_closes_its_gate() -> None:
    async def scenario() -> None:
        (bad, good), (wrong, _), kafka = await fleet([A, B])
        # the good worker is at work: the bad one is not alone
        [warm] = good.start_stolen([(b"warm", prompt("warm"))])
        assert await warm
        ids = [f"p{i}" for i in range(blame.REFUSING_AFTER)]
        for pid in ids:
            wrong.always[pid] = status_error(404, "model not found")
        for offset, pid in enumerate(ids):
            await bad.submit(kafka.event(offset, pid))
        await until(lambda: bad.stats.refusing, "the refusing node's gate closed")
        assert bad.stats.paused and kafka.letters() == []
        await until(lambda: not ledger_of(bad).claims, "every refused prompt released")
        assert all(blame.failed_here(ledger_of(bad).failures(work(bad, p)), A) for p in ids)
        assert all(bad.spoken_for(pid, prompt(pid)) for pid in ids)  # not for it again
        stolen = good.start_stolen([(pid.encode(), prompt(pid)) for pid in ids])
        assert [await task for task in stolen] == [True] * len(ids)
        await until(lambda: kafka.acked() == list(range(len(ids))), "the owner acks them")
        assert sorted(kafka.sent_to(COMPLETIONS)) == sorted(["warm", *ids])
        assert kafka.letters() == [] and wrong.requests == ids  # each asked there once
        for worker in (bad, good):
            await worker.stop()

    run(scenario)


class CrashingClient(FakeClient):
    """A server that `crasher` takes down: every request running on it then fails as a
    refused connection, and it is back once the test says so."""

    def __init__(self, server: str, crasher: str) -> None:
        super().__init__()
        self.base_url = server
        self.crasher = crasher
        self.running: dict[str, asyncio.Future[None]] = {}

    async def complete(self, record):  # type: ignore[no-untyped-def]
        pid = record.prompt_id
        if self.up and pid == self.crasher:
            self.requests.append(pid)
            self.up = False
            for waiting in self.running.values():
                if not waiting.done():
                    waiting.set_result(None)
            raise GenerationError("connection_error", "reset", transient=True, server_down=True)
        if pid in self.gates and self.up:  # held until its gate opens, or the server crashes
            self.running[pid] = asyncio.get_running_loop().create_future()
            await asyncio.wait(
                [self.running[pid], asyncio.ensure_future(self.gates[pid].wait())],
                return_when=asyncio.FIRST_COMPLETED,
            )
            del self.running[pid]
            if not self.up:
                self.requests.append(pid)
                raise GenerationError("connection_error", "reset", transient=True, server_down=True)
            self.gates.pop(pid)
        return await super().complete(record)


def test_a_prompt_that_crashes_servers_is_dead_lettered_at_the_second_innocents_rerun_once() -> (
    None
):
    async def scenario() -> None:
        kafka = FakeKafka()
        workers, clients = [], []
        for server in (A, B):
            client = CrashingClient(server, crasher="bomb")
            worker, _ = await once_worker(client, kafka, concurrency=4, claim_s=5.0)
            workers.append(worker)
            clients.append(client)
        (first, second), (a, b) = workers, clients
        a.gates["innocent"] = asyncio.Event()  # runs beside the bomb on A
        await first.submit(kafka.event(0, "innocent"))
        await until(lambda: "innocent" in a.running, "the innocent prompt running on A")
        await first.submit(kafka.event(1, "bomb"))
        await until(lambda: first.stats.paused, "A went down")
        await until(lambda: not ledger_of(first).claims, "both released, each with a crash")
        assert kafka.letters() == []
        for pid in ("bomb", "innocent"):
            failures = ledger_of(first).failures(work(first, pid))
            assert [(f.server, f.kind) for f in failures] == [(A, CRASH)]
        # B takes the bomb (A is still down): the second server's crash makes it a dead letter
        [bomb] = second.start_stolen([(b"bomb", prompt("bomb"))])
        assert await bomb is False
        [letter] = kafka.letters()
        assert letter.kind == blame.SERVER_CRASH and A in letter.message and B in letter.message
        # B back: it takes the innocent prompt (A, where it failed, leaves it to another
        # server) and it completes at its second request
        b.up = True
        await until(lambda: second.gate.is_open, "B's gate open again")
        [innocent] = second.start_stolen([(b"innocent", prompt("innocent"))])
        assert await innocent is True
        assert (a.requests + b.requests).count("bomb") == 2
        assert (a.requests + b.requests).count("innocent") == 2  # once beside the bomb, once more
        await until(lambda: kafka.acked() == [0, 1], "A acks both")
        for worker in workers:
            await worker.stop()

    run(scenario)


def test_a_worker_runs_one_suspect_at_a_time() -> None:
    async def scenario() -> None:
        (worker,), (client,), kafka = await fleet([A])
        ledger = ledger_of(worker)
        for pid in ("s1", "s2"):  # each was running when some server crashed
            earlier = Claim("gone", 1.0, True, 1.0, None, (crashed(B, 1.0),))
            ledger.take(claim_key(work(worker, pid)).encode(), earlier.encode())
            client.gates[pid] = asyncio.Event()
        client.gates["plain"] = asyncio.Event()
        for offset, pid in enumerate(("s1", "s2", "plain")):
            await worker.submit(kafka.event(offset, pid))
        await until(lambda: sorted(client.requests) == ["plain", "s1"], "one suspect, one other")
        client.gates["s1"].set()
        await until(lambda: "s2" in client.requests, "the next suspect once the first ended")
        client.gates["s2"].set()
        client.gates["plain"].set()
        await until(lambda: kafka.acked() == [0, 1, 2], "all three done")
        await worker.stop()

    run(scenario)


def test_a_stop_writes_the_outcome_of_a_request_that_has_its_answer() -> None:
    """Ctrl-C on `run` (SIGTERM on a worker) while a completion is being written: the stop
    waits for its outcome in the ledger, so the prompt is not generated again."""

    class SlowKafka(FakeKafka):
        """Completions are acknowledged only once the test says so."""

        def __init__(self) -> None:
            super().__init__()
            self.writing = asyncio.Event()
            self.written = asyncio.Event()

        async def send(self, topic: str, key: bytes, value: bytes) -> None:
            if topic == COMPLETIONS:
                self.writing.set()
                await self.written.wait()
            await super().send(topic, key, value)

    async def scenario() -> None:
        client, kafka = FakeClient(), SlowKafka()
        worker, _ = await once_worker(client, kafka)
        await worker.submit(kafka.event(0, "p"))
        await until(kafka.writing.is_set, "the completion being written")
        stopping = asyncio.ensure_future(worker.stop())
        assert worker.once is not None
        await until(lambda: worker.once.recorder.stopping, "the stop waiting for the record")
        kafka.written.set()
        await stopping
        assert kafka.sent_to(COMPLETIONS) == ["p"]
        assert kafka.outcomes() == [work(worker, "p")]

    run(scenario)


def test_a_request_that_times_out_on_a_busy_server_spends_its_attempts() -> None:
    """A timeout on a server that is up but slow to answer its probe is an attempt of the
    prompt: a prompt that times out every time ends within `max_attempts` (before, a slow probe
    paused the worker without counting, and the prompt was asked forever)."""

    class Busy(FakeClient):
        async def unavailable(self) -> str | None:
            self.probes += 1
            return SLOW if self.probes % 2 else None  # slow, then answers: the gate reopens

    async def scenario() -> None:
        client, kafka = Busy(), FakeKafka()
        client.always["p"] = GenerationError("timeout", "request timed out", transient=True)
        worker, _ = await once_worker(client, kafka)  # alone: it decides the prompt itself
        await worker.submit(kafka.event(0, "p"))
        await until(lambda: kafka.acked() == [0], "the prompt's outcome")
        [letter] = kafka.letters()
        assert letter.kind == "retries_exhausted"
        assert client.requests == ["p"] * worker.settings.max_attempts
        await worker.stop()

    run(scenario)


def test_a_worker_that_sees_no_other_claim_asks_its_group_before_deciding_alone() -> None:
    """Workers started together: the refusing node's first refusals come before any other
    worker's claim is in its ledger. Its group has other members, so it does not decide alone:
    the prompt goes back (before, CI saw 4 of 120 prompts dead-lettered so)."""

    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        client.always["p"] = status_error(404, "model not found")
        worker, ledger = await once_worker(client, kafka)
        assert worker.once is not None
        asked: list[int] = []

        async def three_members() -> int:
            asked.append(3)
            return 3

        worker.once.peers.group_size = three_members
        await worker.submit(kafka.event(0, "p"))
        await until(lambda: ledger.failures(work(worker, "p")), "the refusal recorded")
        await until(lambda: not ledger.claims, "the claim released")
        assert kafka.letters() == [] and asked == [3]
        assert worker.spoken_for("p", prompt("p"))  # for another server now
        await worker.stop()

    run(scenario)
