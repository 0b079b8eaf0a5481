"""One model per run (streams/generate/identity.py): a worker whose server serves another model,
revision or tokenizer than the run's is refused at start with one line naming both; paths of
the same weights are the same model."""

from __future__ import annotations

import asyncio
import logging

import httpx2
import orjson
import pytest

from streams.generate.identity import ServedModel, ServerIdentity, ServerRoutes, refusal
from streams.generate.worker import WrongModel
from tests.streams.generate.fakes import SERVER, FakeClient, FakeKafka, run, until, worker_for

KIMI = ServedModel("Kimi-K2.6")


@pytest.mark.parametrize(
    ("served", "refused"),
    [
        (ServedModel.of("/mnt/a/Kimi-K2.6", None, None), False),
        (ServedModel.of("/data/Kimi-K2.6/", "abc", "/data/Kimi-K2.6"), False),
        (ServedModel.of("/mnt/a/Kimi-K2.5", None, None), True),
        (ServedModel.of("moonshotai/Kimi-K2.6", None, None), True),  # a name, not a path
    ],
)
def test_a_server_is_refused_only_for_another_model(served: ServedModel, refused: bool) -> None:
    assert (refusal(SERVER, KIMI, served) is not None) == refused


def test_revision_and_tokenizer_count_when_both_sides_say_one() -> None:
    expected = ServedModel.of("Kimi-K2.6", "abc", "/mnt/a/Kimi-K2.6")
    same = ServedModel.of("/mnt/b/Kimi-K2.6", "abc", "/mnt/b/Kimi-K2.6")
    assert refusal(SERVER, expected, same) is None
    assert refusal(SERVER, expected, ServedModel("Kimi-K2.6")) is None  # says neither
    assert refusal(SERVER, ServedModel("Kimi-K2.6"), same) is None  # the run names neither
    line = refusal(SERVER, expected, ServedModel("Kimi-K2.6", "def"))
    assert line is not None and "revision def" in line and "revision abc" in line
    line = refusal(SERVER, expected, ServedModel("Kimi-K2.6", None, "Kimi-tokenizer-fix"))
    assert line is not None and "tokenizer Kimi-tokenizer-fix" in line
    assert refusal(SERVER, None, ServedModel("anything")) is None  # no run's model: any


def test_the_refusal_is_one_line_naming_the_server_and_both_models() -> None:
    line = refusal(SERVER, KIMI, ServedModel.of("/mnt/a/Kimi-K2.5", "r2", None))
    assert line is not None and "\n" not in line
    assert SERVER in line and "Kimi-K2.5 (revision r2)" in line and "Kimi-K2.6" in line


def test_a_worker_whose_server_serves_another_model_is_refused_at_start() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        client.served = "/mnt/a/Kimi-K2.5"
        worker = worker_for(client, kafka, expect_model="/mnt/b/Kimi-K2.6")
        with pytest.raises(WrongModel) as refused:
            await worker.start()
        assert worker.refused == str(refused.value)
        assert "Kimi-K2.5" in worker.refused and "Kimi-K2.6" in worker.refused
        assert not worker.intake.ready.is_set()  # takes no prompt, requests nothing
        assert client.requests == []
        await worker.stop()

    run(scenario)


def test_a_worker_whose_server_names_the_weights_by_another_path_starts() -> None:
    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        client.served, client.identity = "/mnt/a/Kimi-K2.6", ServerIdentity(revision="abc")
        worker = worker_for(client, kafka, expect_model="/mnt/b/Kimi-K2.6", expect_revision="abc")
        await worker.start()
        assert worker.refused is None and worker.intake.ready.is_set()
        await worker.stop()

    run(scenario)


def test_a_refusal_in_the_background_stops_the_worker_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The app's start (`start_soon`): `on_refused` stops the process; the command line says
    the line (streams/cli/worker.py)."""

    async def scenario() -> None:
        client = FakeClient()
        worker = worker_for(client, FakeKafka(), expect_model="other-model")
        stopped = asyncio.Event()
        worker.on_refused = stopped.set
        worker.start_soon()
        await until(stopped.is_set, "the refusal")
        assert worker.refused is not None and "fake-model" in worker.refused
        await worker.stop()

    with caplog.at_level(logging.ERROR):
        run(scenario)
    assert not [r for r in caplog.records if r.exc_info]


def test_the_server_says_its_tokenizer_and_revision_in_server_info() -> None:
    info = {"version": "0.5.23", "revision": "abc", "tokenizer_path": "/mnt/a/Kimi-K2.6"}

    def answer(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/server_info":
            return httpx2.Response(200, content=orjson.dumps(info))
        return httpx2.Response(404)

    async def identify() -> ServedModel:
        async with httpx2.AsyncClient(transport=httpx2.MockTransport(answer)) as http:
            identity = await ServerRoutes(http, SERVER, {}).identify()
        return ServedModel.of("/mnt/a/Kimi-K2.6", identity.revision, identity.tokenizer)

    assert asyncio.run(identify()) == ServedModel("Kimi-K2.6", "abc", "Kimi-K2.6")
