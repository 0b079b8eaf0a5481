"""A generate worker pauses, spending nothing of its prompts, while its server is down or
refuses the API key (streams/generate/gate.py), and says so in one line."""

from __future__ import annotations

import pytest

from streams.generate.client import AUTH
from streams.generate.stats import generate_figures
from tests.streams.generate.fakes import (
    COMPLETIONS,
    FakeClient,
    FakeKafka,
    run,
    until,
    worker_for,
)


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
        # the next prompt is taken into the window, and waits for the server there
        await worker.submit(kafka.event(1, "p1"))
        await until(lambda: client.probes >= probes + 10, "more probes")
        assert client.requests == ["p0"]  # one request found the server down; none since
        assert worker.stats.retries == 0 and kafka.sent == [] and kafka.acked() == []

        client.up = True
        await until(lambda: kafka.acked() == [0, 1], "both prompts acked after the recovery")
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
        assert generate_figures(worker.stats).gauges["paused_auth"] == 1
        refused = list(client.requests)
        probes = client.probes
        await until(lambda: client.probes >= probes + 10, "the key retried while paused")
        await worker.submit(kafka.event(4, "p4"))
        await until(lambda: client.probes >= probes + 20, "more probes")
        assert client.requests == refused == ["p0"]  # the others waited for the probe
        assert kafka.sent == [] and kafka.acked() == [] and worker.stats.dead_letters == 0

        client.refuse_key = None
        await until(lambda: kafka.acked() == [0, 1, 2, 3, 4], "every prompt acked")
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
        assert not worker.intake.ready.is_set() and client.model == ""

        client.refuse_key = None
        await until(lambda: worker.intake.ready.is_set(), "started once the key works")
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
