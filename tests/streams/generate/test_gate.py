"""Health that knows load (streams/generate/gate.py): a server slow to answer its probe (busy)
gets no new requests but keeps its running ones; they end only when it refuses connections or
makes no progress (hung)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from compose.process import free_port
from streams.generate.client import DOWN, SLOW, HttpServerClient
from tests.compose.emulator_client import post
from tests.streams.generate.fakes import (
    COMPLETIONS,
    FakeClient,
    FakeKafka,
    FakeLedger,
    once_worker,
    run,
    settings,
    until,
    worker_for,
)

StartEmulator = Callable[..., AbstractAsyncContextManager[Any]]


class ProbedClient(FakeClient):
    """A fake server whose health probe answers `answer` (None: healthy)."""

    def __init__(self) -> None:
        super().__init__()
        self.answer: str | None = None

    async def unavailable(self) -> str | None:
        self.probes += 1
        return self.answer


def test_the_probe_tells_a_refused_connection_from_a_slow_answer(
    start_emulator: StartEmulator,
) -> None:
    async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accepted, as by a stopped process's kernel; never answered

    async def probe(url: str) -> str | None:
        client = HttpServerClient(settings(server=url, health_timeout_s=0.2))
        try:
            return await client.unavailable()
        finally:
            await client.close()

    async def scenario() -> None:
        assert await probe(f"http://127.0.0.1:{free_port()}") == DOWN  # nothing listens
        stopped = await asyncio.start_server(never_answers, "127.0.0.1", 0)
        port = stopped.sockets[0].getsockname()[1]
        assert await probe(f"http://127.0.0.1:{port}") == SLOW
        stopped.close()
        busy = {"max_running_requests": 1, "tokens_per_s": 20.0, "min_output_tokens": 40}
        async with start_emulator(
            "qwen36", health_check_timeout_s=0.05, max_output_tokens=40, **busy
        ) as emu:
            # its one slot taken: SGLang's probe waits for it, then says 503
            request = {"messages": [{"role": "user", "content": "hi"}]}
            running = asyncio.create_task(post(emu, "/v1/chat/completions", request))
            await until(lambda: emu.engine.stats.running == 1, "the slot taken")
            assert await probe(emu.base_url) == SLOW
            await running

    run(scenario)


def test_a_busy_server_slow_to_answer_its_probe_keeps_its_requests_and_gets_no_new_one() -> None:
    async def scenario() -> None:
        client, kafka = ProbedClient(), FakeKafka()
        worker, ledger = await once_worker(client, kafka, concurrency=3, health_watch_s=0.005)
        for offset in (0, 1):
            client.gates[f"p{offset}"] = asyncio.Event()
            await worker.submit(kafka.event(offset, f"p{offset}"))
        await until(lambda: client.requests == ["p0", "p1"], "both requests running")
        client.answer = SLOW  # busy: its probe waits for a free slot
        await until(lambda: not worker.gate.is_open, "the gate held")
        await worker.submit(kafka.event(2, "p2"))
        probes = client.probes
        await until(lambda: client.probes >= probes + 20, "the server probed while held")
        assert client.requests == ["p0", "p1"]  # a slot is free, but no new request goes
        assert worker.stats.in_flight == 2 and len(ledger.claims) == 2  # the running ones go on
        assert not worker.stats.paused

        client.answer = None  # the probe answers
        await until(lambda: client.requests == ["p0", "p1", "p2"], "the next prompt requested")
        for gate in client.gates.values():
            gate.set()
        await until(lambda: kafka.acked() == [0, 1, 2], "every prompt acked")
        assert client.requests == ["p0", "p1", "p2"]  # none asked twice
        assert sorted(kafka.sent_to(COMPLETIONS)) == ["p0", "p1", "p2"] and kafka.letters() == []
        await worker.stop()

    run(scenario)


def closes_the_gate_and_redoes_its_request(answer: str, **overrides: float) -> None:
    """The server's probe answers `answer` while a request runs: the gate closes (down), the
    request ends without an outcome, and it is done once the server is back."""

    async def scenario() -> None:
        client, kafka = ProbedClient(), FakeKafka()
        worker, ledger = await once_worker(client, kafka, health_watch_s=0.005, **overrides)
        client.gates["p0"] = asyncio.Event()  # not answered while the server is gone or hung
        await worker.submit(kafka.event(0, "p0"))
        await until(lambda: client.requests == ["p0"], "the request running")
        client.answer = answer
        await until(lambda: worker.stats.paused_for == DOWN, "the gate closed")
        await until(lambda: worker.stats.in_flight == 0 and not ledger.claims, "the request ended")
        assert kafka.acked() == [] and kafka.letters() == []

        client.answer = None
        client.gates["p0"].set()
        await until(lambda: kafka.acked() == [0], "done once the server is back")
        assert client.requests == ["p0", "p0"] and not worker.stats.paused
        await worker.stop()

    run(scenario)


def test_a_server_that_refuses_connections_closes_the_gate_and_ends_its_requests() -> None:
    closes_the_gate_and_redoes_its_request(DOWN)  # connection refused: nothing listens


def test_a_hung_server_that_makes_no_progress_still_closes_the_gate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SIGSTOP, a hung collective: nothing refuses, but no request finishes and no probe
    answers for --health-stall-s, so its requests go to other servers."""
    closes_the_gate_and_redoes_its_request(SLOW, health_stall_s=0.2)
    assert "finished no request and answered no health probe" in caplog.text


def test_a_saturated_server_whose_probe_says_503_loses_no_request(
    start_emulator: StartEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    """The emulator as SGLang under load: every slot busy, so its probe answers 503 unless an
    answer lands within its timeout; the answers that do land are progress, so nothing ends."""
    prompts = 8
    server = {
        "max_running_requests": 2,
        "health_check_timeout_s": 0.1,  # 4 of its tokens: an idle server's probe answers
        "tokens_per_s": 40.0,
        "min_output_tokens": 20,
        "max_output_tokens": 40,
    }

    async def scenario() -> None:
        async with start_emulator("qwen36", **server) as emu:
            kafka, ledger = FakeKafka(), FakeLedger()
            kafka.followers.append(ledger)
            worker_settings: dict[str, Any] = {
                "server": emu.base_url,
                "concurrency": 2,
                "health_watch_s": 0.02,
                "health_stall_s": 5.0,  # well above the ~0.5 s between two answers
            }
            client = HttpServerClient(settings(**worker_settings))
            worker = worker_for(client, kafka, ledger=ledger, **worker_settings)
            await worker.start()
            asked = emu.engine.stats.requests  # its start asks how ids come back
            events = [kafka.event(offset, f"p{offset}") for offset in range(prompts)]
            submits = [asyncio.create_task(worker.submit(event)) for event in events]
            await until(lambda: len(kafka.acked()) == prompts, "every prompt acked", timeout=60)
            await asyncio.gather(*submits)
            assert emu.engine.stats.requests - asked == prompts  # none ended and asked again
            assert sorted(kafka.sent_to(COMPLETIONS)) == sorted(f"p{i}" for i in range(prompts))
            assert worker.stats.retries == 0 and kafka.letters() == []
            await worker.stop()

    caplog.set_level(logging.DEBUG, logger="streams.generate.gate")
    run(scenario)
    assert "slow to answer its probe: no new requests" in caplog.text  # it was held
    assert "is down" not in caplog.text
