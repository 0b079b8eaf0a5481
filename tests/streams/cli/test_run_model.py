"""`draftgen run` makes its first server's model the run's: every generate worker it starts is
checked against it at start (streams/generate/identity.py)."""

from __future__ import annotations

from typing import Any

import pytest

from streams.cli.run import run_model
from streams.core.settings import GenerateSettings, KafkaSettings
from streams.generate import client
from streams.generate.identity import ServedModel


def first_server(**values: Any) -> GenerateSettings:
    kafka = KafkaSettings(bootstrap="127.0.0.1:9")
    return GenerateSettings(**{"server": "http://first:30000", "kafka": kafka, **values})


def test_the_runs_model_is_its_first_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    async def ask(settings: GenerateSettings) -> ServedModel:
        asked.append(settings.server)
        if settings.server == "http://down:30000":
            raise ConnectionError("connection refused")
        return ServedModel.of("/mnt/a/Kimi-K2.6", "abc", "/mnt/a/Kimi-K2.6")

    monkeypatch.setattr(client, "ask_served_model", ask)
    expected = run_model([first_server(server="http://down:30000"), first_server()])
    assert asked == ["http://down:30000", "http://first:30000"]  # the first that answers
    assert expected == {
        "expect_model": "Kimi-K2.6",
        "expect_revision": "abc",
        "expect_tokenizer": "Kimi-K2.6",
    }
    worker = first_server(**expected)
    assert ServedModel.expected(worker) == ServedModel("Kimi-K2.6", "abc", "Kimi-K2.6")


def test_a_model_named_by_the_flag_is_not_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    async def ask(settings: GenerateSettings) -> ServedModel:
        raise AssertionError("asked the server")

    monkeypatch.setattr(client, "ask_served_model", ask)
    assert run_model([first_server(expect_model="Kimi-K2.6")]) == {}


def test_no_server_answering_expects_nothing_and_does_not_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run whose servers are all down starts its workers, which say so on its console."""

    async def ask(settings: GenerateSettings) -> ServedModel:
        raise ConnectionError("connection refused")

    monkeypatch.setattr(client, "ask_served_model", ask)
    assert run_model([first_server()]) == {}
